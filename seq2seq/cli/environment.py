"""Checks of the machine and the run's surroundings: accelerators, bfloat16 instructions
(through :mod:`seq2seq.machine`),
a terminal for the progress bar, a streamed run's validation schedule, an empty input."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq import machine
from seq2seq.data.corpus import iter_lines

if TYPE_CHECKING:
    import lightning as L


def streaming_validation_advice(trainer: L.Trainer, datamodule) -> str | None:
    """The warning for a streamed run whose validations may never come, else ``None``.

    With an integer ``val_check_interval`` N and ``check_val_every_n_epoch`` set (Lightning's
    default is 1), Lightning counts N batches within each epoch; a streamed epoch (one pass
    over the stream) shorter than N batches is then never validated, and its length is not
    known in advance.
    """
    interval = trainer.val_check_interval
    if not getattr(datamodule, "streaming", False) or trainer.check_val_every_n_epoch is None:
        return None
    if not isinstance(interval, int) or isinstance(interval, bool):
        return None
    return (
        f"--data.streaming true with --trainer.val_check_interval {interval} and "
        f"--trainer.check_val_every_n_epoch {trainer.check_val_every_n_epoch}: Lightning "
        f"counts the {interval} batches within each epoch, so a pass over the stream shorter "
        f"than that is never validated; add --trainer.check_val_every_n_epoch null to "
        f"validate every {interval} steps across epochs"
    )


def no_accelerator(err: Exception, trainer: dict) -> Exception:
    """Lightning's error for an accelerator this machine lacks ("No supported gpu backend
    found!"), or for ``devices: -1`` (all GPUs) on the CPU, as one line naming the setting and
    what to pass; other errors as they are."""
    message = str(err)
    accelerator = trainer.get("accelerator")
    if "selected with `CPUAccelerator`" in message:
        return ValueError(
            f"--trainer.devices {trainer.get('devices')} with --trainer.accelerator "
            f"{accelerator}: on the CPU give the number of processes, e.g. --trainer.devices 2"
        )
    if "backend found" not in message and "is not available" not in message:
        return err
    return ValueError(
        f"--trainer.accelerator {accelerator}: this machine has no such accelerator that "
        "PyTorch can use; train on the CPU with --trainer configs/trainer/cpu.yaml (or "
        "--trainer.accelerator cpu --trainer.precision 32-true)"
    )


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (not a log file or a pipe)."""
    return hasattr(sys.stdout, "isatty") and sys.stdout.isatty()


def warn_slow_bfloat16(trainer: L.Trainer) -> None:
    """:func:`seq2seq.machine.warn_emulated_bfloat16` for a ``bf16`` ``--trainer.precision`` on
    a CPU: training ran 3.5x slower than ``32-true`` there (3,569 against 1,024 target tokens/s,
    ``benchmarks/cpu_vs_marian.py`` on an AVX-512 Xeon without AVX512-BF16)."""
    precision = str(getattr(trainer, "precision", ""))
    if precision.startswith("bf16") and trainer.strategy.root_device.type == "cpu":
        machine.warn_emulated_bfloat16(
            f"--trainer.precision {precision}", "--trainer.precision 32-true"
        )


def suggest_bfloat16(trainer: L.Trainer) -> None:
    """One line for float32 training on a CPU that multiplies bfloat16 in hardware, where
    ``--trainer.precision bf16-mixed`` trained 1.5x as many steps in the README job's 28
    minutes (AMD EPYC with AVX512-BF16, README, Precision). Not automatic: a config computes
    the same on every machine.
    """
    precision = str(getattr(trainer, "precision", ""))
    if precision not in ("32-true", "32") or trainer.strategy.root_device.type != "cpu":
        return
    if machine.cpu_has_bfloat16_instructions():
        print(
            "seq2seq: this CPU has bfloat16 instructions (avx512_bf16 or amx_bf16): "
            "--trainer.precision bf16-mixed trains faster here (README, Precision)",
            file=sys.stderr,
        )


def has_no_lines(path: str | Path) -> bool:
    """Whether ``path`` is a text file (plain or gzip) without a line; ``False`` when it
    cannot be read (the data module reports why)."""
    try:
        lines = iter_lines(path)
        try:
            return next(lines, None) is None
        finally:
            lines.close()
    except (OSError, ValueError):
        return False
