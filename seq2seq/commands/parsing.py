"""The argument parser of the plain commands, and the checks they share."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2seq.files import check_output_file
from seq2seq.spelling import did_you_mean

__all__ = [
    "Parser",
    "add_checkpoint_dir",
    "check_device",
    "check_output",
    "check_output_apart",
    "checkpoint_alias",
    "ensemble_translator",
    "plain",
]

_RST_ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|obj):`~?([^`]+)`")


def plain(doc: str | None) -> str:
    """A docstring as ``--help`` text: reStructuredText roles become their target's name,
    double back-quotes go."""
    return _RST_ROLE.sub(r"\1", doc or "").replace("``", "")


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, as those of ``fit``: ``seq2seq translate: error:
    ...`` (exit status 2), an unrecognised option with the closest spellings of this command's
    options (``--beam-size``: did you mean ``--beam_size``?); ``--help`` lists the options."""

    def parse_args(self, args=None, namespace=None):
        """argparse's, keeping the arguments given for :meth:`error`."""
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str):
        known = [o for action in self._actions for o in action.option_strings]
        choice = re.fullmatch(
            r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)", message
        )
        if choice:  # --format ctranslate: did you mean ctranslate2?
            choices = re.findall(r"'([^']*)'", choice.group(3))
            close = difflib.get_close_matches(choice.group(2), choices, n=1, cutoff=0.6)
            message += f" (did you mean {choice.group(1)} {close[0]}?)" if close else ""
        if message.startswith("the following arguments are required: "):
            # argparse names the missing option before the mistyped one (--ckpt-path X)
            for given in getattr(self, "_given", []):
                name = given.split("=", 1)[0]
                if name.startswith("--") and name not in known:
                    hint = _hint(name, known)
                    message += f"; {name} is not an option of this command{hint}"
                    break
        prefix = "unrecognized arguments: "
        unknown = [a for a in message.removeprefix(prefix).split() if a.startswith("-")]
        if message.startswith(prefix) and unknown:
            name = unknown[0].split("=", 1)[0]
            hint = _hint(name, known)
            if name in ("-c", "--config") and "--ckpt_path" in known:
                hint = (
                    " (this command reads the model and its settings from --ckpt_path; a "
                    "config file is for fit, validate, test and predict)"
                )
            message = f"unrecognized option {name}" + hint
        self.exit(2, f"{self.prog}: error: {message}\n")


def _hint(name: str, known: list[str]) -> str:
    """The "did you mean" of the unknown option ``name`` among this command's ``known``."""
    return _underscored(name, known) or _undotted(name, known) or did_you_mean(name, known)


def _undotted(name: str, known: list[str]) -> str:
    """`` (did you mean --beam_size?)`` for LightningCLI's ``--model.decoding.beam_size`` or
    ``--model.beam_size`` where the last part is an option of this command, else ``""``."""
    # did_you_mean matches last parts between dotted names only, and difflib misses long prefixes
    if "." not in name:
        return ""
    return _underscored("--" + name.rsplit(".", 1)[-1], known)


def _underscored(name: str, known: list[str]) -> str:
    """`` (did you mean --beam_size?)`` for fairseq's ``--beam-size`` where that is an option,
    else ``""``."""
    underscored = "--" + name.lstrip("-").replace("-", "_")
    return f" (did you mean {underscored}?)" if underscored in known else ""


def check_output(parser: argparse.ArgumentParser, output: Path) -> None:
    """Refuse an ``--output`` that is a folder or could not be written (missing folders are
    created; :func:`seq2seq.files.check_output_file`), before any checkpoint is read."""
    try:
        check_output_file(output, "--output")
    except OSError as err:
        parser.error(str(err))


def check_output_apart(
    parser: argparse.ArgumentParser, output: str, inputs: dict[str, Sequence[str]]
) -> None:
    """Refuse an ``--output`` that is a file the command reads (``inputs``: what each is
    called, its paths; ``-`` is stdin): writing would replace it (a checkpoint, a corpus)."""
    written = Path(output)
    for what, paths in inputs.items():
        for path in paths:
            if path != "-" and written.exists() and Path(path).exists():
                if written.samefile(path):
                    parser.error(f"--output {output} is {what}; give another file name")


def add_checkpoint_dir(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint_dir``, where ``--ckpt_path best`` and ``last`` are looked up."""
    parser.add_argument(
        "--checkpoint_dir",
        default=None,
        help="a run's checkpoint folder, where --ckpt_path best and last are looked up (best: "
        "the file its ModelCheckpoint recorded in last.ckpt, as for seq2seq test)",
    )


def checkpoint_alias(parser: argparse.ArgumentParser, ckpt: str, checkpoint_dir: str | None) -> str:
    """The checkpoint file of ``--ckpt_path best`` or ``last`` in ``--checkpoint_dir`` (named
    on stderr); any other ``ckpt``, or a file of that name, as it is."""
    if ckpt not in ("best", "last") or Path(ckpt).exists():
        return ckpt
    if checkpoint_dir is None:
        parser.error(
            f"--ckpt_path {ckpt} needs --checkpoint_dir, the run's checkpoint folder (e.g. "
            "checkpoints/multi30k_de_en), or give the path of a checkpoint file"
        )
    from seq2seq.checkpoint import resolve_ckpt_path

    path = resolve_ckpt_path(ckpt, [checkpoint_dir])
    print(f"seq2seq: --ckpt_path {ckpt}: {path}", file=sys.stderr)
    return str(path)


def check_device(parser: argparse.ArgumentParser, name: str) -> None:
    """Refuse a ``--device`` that PyTorch does not know or that this machine lacks."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        parser.error(f"--device {name}: not a device (cpu, cuda, cuda:1, mps, ...)")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {name}: no CUDA device is available on this machine")
    if device.type == "cuda" and device.index is not None:
        if device.index >= torch.cuda.device_count():
            parser.error(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        parser.error(f"--device {name}: MPS is not available on this machine")


def ensemble_translator(
    parser: argparse.ArgumentParser,
    paths: list[str],
    device: str | None,
    max_tokens: int,
    dtype: str,
    decoding: dict[str, Any],
):
    """The :class:`~seq2seq.translator.Translator` of several ``--ckpt_path`` checkpoints (an
    ensemble), each refusal a usage error naming the files: a missing file, a folder (an
    exported CTranslate2 model runs alone), a file named twice, checkpoints with other
    SentencePiece models or language pairs, two files of the same weights."""
    from seq2seq.checkpoint import IncompatibleCheckpointsError
    from seq2seq.checkpoint.models import check_ensemble_paths
    from seq2seq.translator import Translator

    try:
        check_ensemble_paths(paths)  # before any checkpoint is read
    except (OSError, ValueError) as err:
        parser.error(f"--ckpt_path: {err}")
    try:
        return Translator.from_checkpoint(
            paths, device=device, max_tokens=max_tokens, dtype=dtype, **decoding
        )
    except IncompatibleCheckpointsError as err:
        parser.error(f"--ckpt_path: {err}")
