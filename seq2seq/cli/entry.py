"""``main``: the ``seq2seq`` console script's dispatch, exit statuses and one-line reports.

The plain commands (``translate``, ``score``, ``average``, ``export`` and ``import``, see
:mod:`seq2seq.commands`)
are dispatched before anything of Lightning is imported; ``fit``/``validate``/``test``/
``predict`` run :class:`seq2seq.cli.app.Seq2SeqCLI`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import platform
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq import machine
from seq2seq.cli.messages import (
    HPARAMS_CLASH,
    SUBCOMMAND_HELP,
    USES,
    check_config_position,
    check_config_syntax,
    check_options_before_config,
    commands_help,
    overview_help,
    plain_commands,
    traceback_wanted,
)
from seq2seq.files import Terminated, WriteError

if TYPE_CHECKING:
    from seq2seq.cli.app import Seq2SeqCLI

#: The commands that :mod:`seq2seq.commands` runs, without LightningCLI.
PLAIN_COMMANDS = tuple(plain_commands())

#: The function of a plain command whose name is a Python keyword.
_FUNCTIONS = {"import": "import_model"}


def cli_main(args: Sequence[str] | None = None) -> Seq2SeqCLI | None:
    """Entry point of the ``seq2seq`` console script.

    Args:
        args: command-line arguments without the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The :class:`~seq2seq.cli.app.Seq2SeqCLI` that ran (for ``fit``/``validate``/``test``/
        ``predict``), or ``None`` for ``translate``, ``average`` and ``export``.
    """
    argv = list(sys.argv[1:] if args is None else args)
    check_config_syntax(argv)
    check_config_position(argv)
    check_options_before_config(argv)
    silence_lightning_notices(argv[0] if argv else None)
    if argv and argv[0] in PLAIN_COMMANDS:
        from seq2seq import commands

        with _sigterm_raises():
            getattr(commands, _FUNCTIONS.get(argv[0], argv[0]))(argv[1:])
        return None
    from seq2seq.cli.app import run_lightning_cli

    return run_lightning_cli(None if args is None else argv)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` inside the block (Python's default ends the process
    at once, leaving temporary files behind); the handler before it comes back after."""
    if threading.current_thread() is not threading.main_thread():  # signals reach main only
        yield
        return

    def terminate(signum: int, frame) -> None:
        raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that come from what the user asked for (a path, a file, a setting, a device)
    rather than from a fault in the program: reported in one line, without a traceback. Every
    ``ValueError`` raised by seq2seq names the setting or file at fault (``CheckpointError``
    is one). Lightning's ``MisconfigurationException`` (e.g. a GPU accelerator on a machine
    without one) counts where Lightning was imported: only then can it be raised."""
    errors: list[type[BaseException]] = [
        OSError,  # missing/unreadable files and folders, failed downloads, full disks
        ValueError,  # bad settings and bad input data (UnicodeDecodeError included)
        pickle.UnpicklingError,  # a file given as --ckpt_path that is no checkpoint
        ModuleNotFoundError,  # an optional extra not installed (seq2seq.export names it)
    ]
    exceptions = sys.modules.get("lightning.pytorch.utilities.exceptions")
    if exceptions is not None:
        errors.append(exceptions.MisconfigurationException)
    return tuple(errors)


def _is_sigterm_stop(stop: SystemExit) -> bool:
    """Whether ``stop`` is Lightning's graceful stop on SIGTERM (a ``SystemExit`` subclass)."""
    exceptions = sys.modules.get("lightning.pytorch.utilities.exceptions")
    return exceptions is not None and isinstance(stop, exceptions.SIGTERMException)


def version_line() -> str:
    """``seq2seq X.Y.Z (torch A, lightning B, sentencepiece C, sacrebleu D, Python E)``: the
    versions that decide what a run computes, for a bug report or a paper's setup."""
    from importlib.metadata import PackageNotFoundError, version

    from seq2seq import __version__

    parts = []
    for name in ("torch", "lightning", "sentencepiece", "sacrebleu"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} not installed")
    parts.append(f"Python {platform.python_version()}")
    return f"seq2seq {__version__} ({', '.join(parts)})"


def main() -> int:
    """Console-script entry point: runs :func:`cli_main`.

    Returns:
        0 on success, 1 after one of :func:`user_errors` (printed as ``seq2seq: error: ...``
        on stderr; set ``SEQ2SEQ_TRACEBACK=1`` to see the traceback; a write the machine
        refused, :class:`seq2seq.files.WriteError`, in one line naming the file and what was
        kept), 130 after Ctrl-C, 143
        after a SIGTERM (Lightning stops gracefully; ``fit`` saves ``last.ckpt``; a plain
        command cleans up what it was writing, as after Ctrl-C). Other
        exceptions propagate with their traceback; argument errors exit with status 2.
    """
    argv = sys.argv[1:]
    if argv[:1] in (["--version"], ["-V"]):
        print(version_line())
        return 0
    commands = (*SUBCOMMAND_HELP, *PLAIN_COMMANDS)
    if not argv or (argv[0].startswith("-") and not set(argv) & {"-h", "--help", *commands}):
        # LightningCLI's message would name its four commands alone
        options = f"; give {' '.join(argv)} after it" if argv else ""
        print(
            "seq2seq: error: name a command: fit, validate, test or predict, or one of the "
            f"further commands below{options} (seq2seq --help lists the commands)",
            file=sys.stderr,
        )
        print(commands_help(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        try:
            print(overview_help(), flush=True)
        except BrokenPipeError:  # seq2seq --help | head: the reader left, as it may
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    shown = warnings.showwarning
    warnings.showwarning = _warning_lines(shown)
    # The commands print their own line for an emulated bfloat16 setting, in flag terms.
    warnings.filterwarnings("ignore", message=machine.EMULATED_BFLOAT16)
    try:
        cli_main()
    except KeyboardInterrupt:
        print("seq2seq: interrupted", file=sys.stderr)
        return 130
    except SystemExit as stop:
        if not (_is_sigterm_stop(stop) or isinstance(stop, Terminated)):  # argument errors
            raise
        print("seq2seq: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except Exception as err:
        known = isinstance(err, user_errors())
        if traceback_wanted() or not (known or isinstance(err, RuntimeError)):
            raise
        if isinstance(err, WriteError):  # names the file and what was kept: the "where"
            print(f"seq2seq: error: {' '.join(str(err).split())}", file=sys.stderr)
            return 1
        message = " ".join(str(err).split()) or type(err).__name__
        if not known:
            if not message.startswith(HPARAMS_CLASH):
                raise
            # Lightning's check that model and data agree on shared settings: the checkpoint's
            # model was trained with other data settings than the config gives.
            message += (
                " The checkpoint was trained with other data settings than this config; pass "
                "them (e.g. --data.max_positions) or the config it was trained with."
            )
        # Lightning's advice in the command line's terms.
        message = message.replace(
            "set `check_val_every_n_epoch=None`", "set --trainer.check_val_every_n_epoch null"
        )
        print(f"seq2seq: error: {message} (SEQ2SEQ_TRACEBACK=1 shows where)", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = shown
    return 0


_PACKAGE = Path(__file__).resolve().parents[1]


def _warning_lines(show: Callable) -> Callable:
    """A ``warnings.showwarning`` for the console script: a ``UserWarning`` raised by seq2seq's
    own code (a setting or input to look at, e.g. sentences cut at ``max_positions``) becomes
    one ``seq2seq: warning: ...`` line, like the command line's errors; ``show`` (Python's
    format: file, line and category) shows the others."""

    def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
        try:
            ours = _PACKAGE in Path(filename).resolve().parents
        except (OSError, RuntimeError, ValueError):
            ours = False
        if ours and issubclass(category, UserWarning):
            print(f"seq2seq: warning: {message}", file=file or sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


class _DropAdvertisement(logging.Filter):
    """Drops Lightning's "💡 Tip: ... try installing litlogger" notice (not about the run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


_DROP_ADVERTISEMENT = _DropAdvertisement()


def silence_lightning_notices(subcommand: str | None = None) -> None:
    """Keep the output to what concerns the run: no litlogger advertisement, no PyTorch
    deprecation warning raised inside Lightning's own code on every command, no
    ``ModelCheckpoint`` "could not find the monitored key" before the first validation, nor
    its "dirpath has changed" when ``validate``/``test``/``predict`` read another folder's
    checkpoint (nor the advice to add the training callbacks there), nor the model summary's
    "precision not supported" for a mixed precision (whose weights are float32, as its size
    estimate assumes), and under DDP no advice to log the held-out scores with
    ``sync_dist=True`` (``TranslationModule`` sums them over the processes itself, so every
    process logs the same values)."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DROP_ADVERTISEMENT)
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    warnings.filterwarnings(
        "ignore", message=r"It is recommended to use `self\.log\('(val|test)/.*sync_dist=True"
    )
    # A mixed precision keeps float32 weights, which the summary's 32-bit size counts right.
    warnings.filterwarnings(
        "ignore", message=r"Precision (bf16|16)-mixed is not supported by the model summary"
    )
    # Warned (instead of raised) only while no validation has run, e.g. a run stopped by
    # max_steps before its first one: LastCheckpoint says so in words of the run instead.
    warnings.filterwarnings(
        "ignore", message=r"`ModelCheckpoint\(monitor=.*could not find the monitored key"
    )
    if subcommand in USES:
        # Evaluating a checkpoint of another folder writes no checkpoint: which best_k_models
        # ModelCheckpoint reloads does not matter there.
        warnings.filterwarnings("ignore", message=r"The dirpath has changed from ")
        # Nor the states of training callbacks (EMA, EarlyStopping, Timer): the weights to
        # evaluate are the checkpoint's state_dict (the EMA's where it kept one).
        warnings.filterwarnings("ignore", message=r"Be aware that when using `ckpt_path`")
