"""The argument parser of ``fit``/``validate``/``test``/``predict``."""

from __future__ import annotations

import os
import typing
from typing import NoReturn

from lightning.pytorch.cli import LightningArgumentParser

from seq2seq import compat
from seq2seq.cli.messages import argument_error_lines, plain_help, traceback_wanted


class Seq2SeqArgumentParser(LightningArgumentParser):
    """The parser of ``fit``/``validate``/``test``/``predict``: argument errors in a few lines.

    A mistyped option or config key, or a value of the wrong type, is reported as
    ``seq2seq: error: ...`` naming the option (with the closest valid options for an unknown
    one) and the value, followed by a pointer to ``seq2seq <command> --help``; the exit status
    is argparse's 2. ``SEQ2SEQ_TRACEBACK=1`` (or jsonargparse's ``JSONARGPARSE_DEBUG=1``)
    restores jsonargparse's own report: the usage and the full message.
    """

    def format_help(self) -> str:
        """The help text in plain text (:func:`~seq2seq.cli.messages.plain_help`:
        ``:func:`~a.b``` as ``a.b``)."""
        return plain_help(super().format_help())

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if (
            not self.exit_on_error  # a nested parser: the caller handles the exception
            or traceback_wanted()
            or os.environ.get("JSONARGPARSE_DEBUG")
        ):
            super().error(message, ex)
        compat.parser_logger(self).error(message)
        parser = compat.error_parser(ex, self)
        try:
            lines = argument_error_lines(message, parser)
        except Exception:  # the report must not hide the error it reports
            lines = [f"seq2seq: error: {line}" for line in message.strip().splitlines()[:6]]
        subcommand = getattr(parser, "subcommand", None)
        command = f"seq2seq {subcommand}" if subcommand else "seq2seq"
        hint = f"For the full list of options run: {command} --help"
        if len(message.strip().splitlines()) > 2:
            hint += " (SEQ2SEQ_TRACEBACK=1 shows the full message)"
        self.exit(2, "\n".join([*lines, hint]) + "\n")


def batch_counts_parse_as_integers(parser: LightningArgumentParser) -> None:
    """``--trainer.limit_test_batches 1`` is one batch (an integer), ``1.0`` all of them.

    Lightning annotates these settings ``Optional[Union[int, float]]``; typing caches unions by
    equality, so where ``Optional[Union[float, int]]`` was built first (by any library loaded
    before Lightning) the annotation lists ``float`` first, jsonargparse tries the types in that
    order, and ``1`` becomes ``1.0``: 100% of the batches. The arguments get an ``int | float``
    type hint, which typing does not cache.
    """
    counts = {f"trainer.limit_{stage}_batches" for stage in ("train", "val", "test", "predict")}
    for action in compat.parser_actions(parser):
        if action.dest not in counts | {"trainer.overfit_batches"}:
            continue
        types = set(typing.get_args(compat.action_typehint(action)))
        if types == {int, float, type(None)}:
            compat.set_action_typehint(action, int | float | None)
        elif types == {int, float}:
            compat.set_action_typehint(action, int | float)
