"""The output of ``translate`` and ``score``: parts streamed to standard output as they are
done, or a file written whole or not at all, and what a stop (Ctrl-C, bad input met on the
way) leaves written."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from seq2seq.files import Terminated, atomic_write, stream_errors

__all__ = ["write_parts"]


def write_parts(
    parts: Iterable[tuple[str, int]], output: str, command: str, results: tuple[str, str]
) -> None:
    """Writes ``parts`` (text, and the input lines done with it) to ``output`` (``-``:
    standard output, each part once done; a reader that leaves, as ``| head``, ends it
    quietly) or to that file, atomically.

    Args:
        parts: the output in parts, each with the count of input lines done so far.
        output: a file, or ``-``.
        command: the command's name, in the message of a stop.
        results: what a line's result is called, one and several (``("translation",
            "translations")``).

    Raises:
        ValueError: the one met on the way, saying what is written.
        KeyboardInterrupt, Terminated: after a line on stderr saying what is written.
    """
    one, several = results
    written = 0  # input lines whose results are written
    try:
        if output == "-":
            try:
                with stream_errors("standard output"):
                    for part, done in parts:
                        sys.stdout.write(part)
                        sys.stdout.flush()
                        written = done
            except BrokenPipeError:  # the reader left (| head): nothing more is wanted
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        else:
            with atomic_write(output, "w", encoding="utf-8") as f:
                for part, _ in parts:
                    f.write(part)
    except (KeyboardInterrupt, Terminated, ValueError) as stop:  # Ctrl-C, SIGTERM, bad input
        kept = (
            f"the {one} of the first line is written to standard output"
            if output == "-" and written == 1
            else f"the {several} of the first {written} lines are written to standard output"
            if output == "-" and written
            else f"no {one} is written"
            if output == "-"
            else f"nothing is written to {output}, which is written whole or not at all "
            "(standard output takes each part as it is done)"
        )
        if isinstance(stop, ValueError):
            end = "" if str(stop).endswith((".", "?", "!")) else "."
            raise ValueError(f"{stop}{end} {kept[0].upper()}{kept[1:]}.") from stop
        print(f"seq2seq: {command} stopped: {kept}", file=sys.stderr)
        raise
