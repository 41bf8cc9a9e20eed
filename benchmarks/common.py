"""Shared helpers for the speed benchmarks: interleaved timing, result rows, table and JSON.

Timings on a shared machine drift (other processes, frequency scaling), so the systems under
comparison are timed side by side in one process: every repetition runs each system once, in an
order that alternates between repetitions (A B, B A, A B, ...), and the median per system is
kept. Compare the ratio of medians, not absolute numbers across runs.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

__all__ = ["Row", "format_table", "synchronize", "time_interleaved", "write_json"]


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued work on ``device`` (CUDA only; a no-op on CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    device: torch.device | str | None = None,
) -> dict[str, list[float]]:
    """Time several callables side by side.

    Args:
        fns: name -> callable doing one unit of work (its result is discarded).
        repeats: timed calls per callable.
        warmup: untimed calls per callable first (also interleaved).
        device: the device the work runs on; CUDA work is synchronised around each call.

    Returns:
        name -> the ``repeats`` wall-clock durations in seconds, in call order. Take
        :func:`statistics.median` of each list.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            synchronize(device)
            start = time.perf_counter()
            fns[name]()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


@dataclass
class Row:
    """One result line: ``value`` (higher is better) of ``system`` for ``measurement``.

    ``ratio`` is ``value`` divided by the reference system's value for the same dtype and
    measurement (``1.0`` on the reference row itself).
    """

    system: str
    dtype: str
    measurement: str
    value: float
    unit: str
    ratio: float | None = None
    goal: float | None = None
    times_s: list[float] | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None


def format_table(rows: list[Row], ratio_header: str = "ratio") -> str:
    """Plain-text table: system, dtype, measurement, value, ratio (and goal, if any row has one)."""
    header = ("system", "dtype", "measurement", "value", ratio_header, "goal")
    body = [
        (
            r.system,
            r.dtype,
            r.measurement,
            f"{r.value:,.1f} {r.unit}",
            "" if r.ratio is None else f"{r.ratio:.2f}x",
            "" if r.goal is None or r.ratio is None else _goal(r.ratio, r.goal),
        )
        for r in rows
    ]
    if all(r.goal is None for r in rows):
        header, body = header[:-1], [line[:-1] for line in body]
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i < 3 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*line) for line in body]
    return "\n".join(line.rstrip() for line in lines)


def _goal(ratio: float, goal: float) -> str:
    return f">={goal:g}x {'met' if ratio >= goal else 'MISSED'}"


def write_json(path: str, rows: list[Row], **meta: object) -> None:
    """Write ``{"meta": meta, "rows": [...]}`` to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=2)
        f.write("\n")


def read_split(data_dir: str | Path, split: str, lang: str, limit: int = 0) -> list[str]:
    """The lines of ``DATA_DIR/SPLIT.LANG.gz`` (or the uncompressed file), the first ``limit``
    only where it is above 0 (:func:`seq2seq.data.formats.read_lines`).

    Raises:
        FileNotFoundError: naming the folder, where neither file exists.
    """
    from seq2seq.data.formats import read_lines

    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (Path(data_dir) / name).is_file():
            return read_lines(Path(data_dir) / name)[: limit or None]
    raise FileNotFoundError(f"{data_dir}: no {split}.{lang}[.gz]")
