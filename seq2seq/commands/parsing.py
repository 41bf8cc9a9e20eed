"""The argument parser of the plain commands, and the checks they share."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from seq2seq.files import check_output_file
from seq2seq.spelling import did_you_mean

__all__ = ["Parser", "check_output", "plain"]

_RST_ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|obj):`~?([^`]+)`")


def plain(doc: str | None) -> str:
    """A docstring as ``--help`` text: reStructuredText roles become their target's name,
    double back-quotes go."""
    return _RST_ROLE.sub(r"\1", doc or "").replace("``", "")


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, as those of ``fit``: ``seq2seq translate: error:
    ...`` (exit status 2), an unrecognised option with the closest spellings of this command's
    options (``--beam-size``: did you mean ``--beam_size``?); ``--help`` lists the options."""

    def error(self, message: str):
        prefix = "unrecognized arguments: "
        unknown = [a for a in message.removeprefix(prefix).split() if a.startswith("-")]
        if message.startswith(prefix) and unknown:
            name = unknown[0].split("=", 1)[0]
            known = [o for action in self._actions for o in action.option_strings]
            underscored = "--" + name.lstrip("-").replace("-", "_")  # fairseq's --beam-size
            hint = f" (did you mean {underscored}?)" if underscored in known else ""
            if name in ("-c", "--config") and "--ckpt_path" in known:
                hint = (
                    " (this command reads the model and its settings from --ckpt_path; a "
                    "config file is for fit, validate, test and predict)"
                )
            message = f"unrecognized option {name}" + (hint or did_you_mean(name, known))
        self.exit(2, f"{self.prog}: error: {message}\n")


def check_output(parser: argparse.ArgumentParser, output: Path) -> None:
    """Refuse an ``--output`` that is a folder or could not be written (missing folders are
    created; :func:`seq2seq.files.check_output_file`), before any checkpoint is read."""
    try:
        check_output_file(output, "--output")
    except OSError as err:
        parser.error(str(err))
