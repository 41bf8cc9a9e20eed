"""Command line: ``seq2seq fit|validate|test|predict`` (LightningCLI), ``translate``, ``average``.

Examples::

    seq2seq fit  --config configs/multi30k_de_en.yaml --data.data_dir ../shared/data/multi30k
    seq2seq test --config configs/multi30k_de_en.yaml --ckpt_path best
    seq2seq validate --config configs/tiny.yaml --ckpt_path untrained  # a smoke test
    seq2seq translate --ckpt_path model.ckpt < source.de > output.en
    seq2seq average --inputs a.ckpt b.ckpt --output averaged.ckpt
"""

from __future__ import annotations

import difflib
import logging
import os
import pickle
import platform
import re
import signal
import sys
import tempfile
import typing
import warnings
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import lightning as L
import yaml
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar, Timer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn

from seq2seq.callbacks import TextProgress, TranslationWriter
from seq2seq.checkpoint import (
    AtomicCheckpointIO,
    CheckpointError,
    check_model_checkpoint,
    language_pair,
    load_checkpoint,
    resolve_ckpt_path,
)
from seq2seq.data.corpus import iter_lines
from seq2seq.data.datamodule import TranslationDataModule, cli_value
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.evaluation import write_lines
from seq2seq.files import check_output_file
from seq2seq.module import (
    _NON_STRUCTURAL,
    CHECKPOINT_KEY,
    TranslationModule,
    tokenizer_from_checkpoint,
)

_OFF_VALUES = ("", "0", "false", "no", "off")

#: ``--ckpt_path`` of ``validate``/``test``/``predict`` that asks for the model of the config
#: with freshly initialised weights (without any ``--ckpt_path`` they refuse to run).
UNTRAINED = "untrained"

#: What ``validate``/``test``/``predict`` do with the checkpoint (for their error and help).
_USES = {
    "validate": ("score", "scores"),
    "test": ("score", "scores"),
    "predict": ("translate with", "translates with"),
}


def _traceback_wanted() -> bool:
    """Whether ``SEQ2SEQ_TRACEBACK`` asks for tracebacks: set to anything but an off value
    (empty, ``0``, ``false``, ``no``, ``off``, in any case)."""
    return os.environ.get("SEQ2SEQ_TRACEBACK", "").strip().lower() not in _OFF_VALUES


_RST_ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|obj):`~?([^`]+)`")


def _plain_help(text: str) -> str:
    """``--help`` text without reStructuredText markup: roles become their target's name,
    double back-quotes go."""
    return _RST_ROLE.sub(r"\1", text).replace("``", "")


class Seq2SeqArgumentParser(LightningArgumentParser):
    """The parser of ``fit``/``validate``/``test``/``predict``: argument errors in a few lines.

    A mistyped option or config key, or a value of the wrong type, is reported as
    ``seq2seq: error: ...`` naming the option (with the closest valid options for an unknown
    one) and the value, followed by a pointer to ``seq2seq <command> --help``; the exit status
    is argparse's 2. ``SEQ2SEQ_TRACEBACK=1`` (or jsonargparse's ``JSONARGPARSE_DEBUG=1``)
    restores jsonargparse's own report: the usage and the full message.
    """

    def format_help(self) -> str:
        """The help text, with the docstrings' reStructuredText roles and double back-quotes
        shown as plain text (``:func:`~a.b``` as ``a.b``)."""
        return _plain_help(super().format_help())

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if (
            not self.exit_on_error  # a nested parser: the caller handles the exception
            or _traceback_wanted()
            or os.environ.get("JSONARGPARSE_DEBUG")
        ):
            super().error(message, ex)
        self._logger.error(message)
        parser = getattr(ex, "subcommand_parser", None) or self
        try:
            lines = _argument_error_lines(message, parser)
        except Exception:  # the report must not hide the error it reports
            lines = [f"seq2seq: error: {line}" for line in message.strip().splitlines()[:6]]
        subcommand = getattr(parser, "subcommand", None)
        command = f"seq2seq {subcommand}" if subcommand else "seq2seq"
        hint = f"For the full list of options run: {command} --help"
        if len(message.strip().splitlines()) > 2:
            hint += " (SEQ2SEQ_TRACEBACK=1 shows the full message)"
        self.exit(2, "\n".join([*lines, hint]) + "\n")


def _batch_counts_parse_as_integers(parser: LightningArgumentParser) -> None:
    """``--trainer.limit_test_batches 1`` is one batch (an integer), ``1.0`` all of them.

    Lightning annotates these settings ``Optional[Union[int, float]]``; typing caches unions by
    equality, so where ``Optional[Union[float, int]]`` was built first (by any library loaded
    before Lightning) the annotation lists ``float`` first, jsonargparse tries the types in that
    order, and ``1`` becomes ``1.0``: 100% of the batches. The arguments get an ``int | float``
    type hint, which typing does not cache.
    """
    counts = {f"trainer.limit_{stage}_batches" for stage in ("train", "val", "test", "predict")}
    for action in parser._actions:
        if action.dest not in counts | {"trainer.overfit_batches"}:
            continue
        types = set(typing.get_args(getattr(action, "_typehint", None)))
        if types == {int, float, type(None)}:
            action._typehint = int | float | None
        elif types == {int, float}:
            action._typehint = int | float


def _argument_error_lines(message: str, parser: LightningArgumentParser) -> list[str]:
    """A jsonargparse error ``message`` as a few ``seq2seq: error: ...`` lines."""
    first, *rest = message.strip().splitlines() or [""]
    if first.startswith("unrecognized arguments: "):
        return _unrecognized_lines(first.split(": ", 1)[1].split(), parser)
    match = re.fullmatch(
        r"(?:Subcommand '[^']*'|Group '([^']*)') does not accept option '([^']*)'", first
    )
    if match:  # a key of a config file (or of a dict given on the command line)
        key = f"{match[1]}.{match[2]}" if match[1] else match[2]
        keys = [a.dest for a in parser._actions if a.option_strings and a.dest != "help"]
        return [f"seq2seq: error: unknown config key '{key}'{_did_you_mean(key, keys)}"]
    match = re.match(r'Parser key "([^"]+)":\s*(.*)', first)
    if match:
        return _invalid_value_lines(match[1], match[2], rest)
    match = re.match(r"argument (\S+) --> (\S+): ", first)
    if match:  # a linked option given directly (jsonargparse words this badly)
        source = re.sub(r"^\w+\((.*)\)$", r"\1", match[1])
        return [
            f"seq2seq: error: --{match[2]} cannot be set: it is taken from --{source} "
            "(set that instead)"
        ]
    match = re.match(r"argument \S+: invalid choice: '([^']*)'", first)
    if match and parser._subcommands_action is not None:
        commands = [*parser._subcommands_action.choices, "translate", "average", "export"]
        return [
            f"seq2seq: error: unknown command '{match[1]}'{_did_you_mean(match[1], commands)}; "
            f"the commands are {', '.join(commands)}"
        ]
    return [f"seq2seq: error: {line.strip()}" for line in [first, *rest][:6] if line.strip()]


def _unrecognized_lines(tokens: list[str], parser: LightningArgumentParser) -> list[str]:
    options = [
        option
        for option in parser._option_string_actions
        if option.startswith("--") and not option.endswith(".help")
    ]
    lines = []
    after_option = False
    for token in tokens:
        if token.startswith("-") and not re.fullmatch(r"-[\d.eE+-]+", token):
            name = token.split("=", 1)[0]
            lines.append(
                f"seq2seq: error: unrecognized option {name}{_did_you_mean(name, options)}"
            )
            after_option = "=" not in token
        elif after_option:  # the value of the option before it
            after_option = False
        else:
            lines.append(f"seq2seq: error: unexpected argument {token!r}")
    if len(lines) > 5:
        lines[5:] = [f"seq2seq: error: ... and {len(lines) - 5} more"]
    return lines


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean X?)`` with the closest of ``candidates`` to ``name``, or ``""``."""
    candidates = list(dict.fromkeys(candidates))
    last = name.lstrip("-").rsplit(".", 1)[-1]
    # the same last part: --trainer.max_epochs for --max_epochs or --model.max_epochs
    matches = [c for c in candidates if c != name and c.rsplit(".", 1)[-1] == last]
    if not matches:  # else similar spellings, not counting the group it names (--data.foo)
        others = [c for c in candidates if not name.startswith(c + ".")]
        matches = difflib.get_close_matches(name, others, n=3, cutoff=0.75)
    return f" (did you mean {' or '.join(matches[:3])}?)" if matches else ""


def _invalid_value_lines(key: str, inline: str, details: list[str]) -> list[str]:
    """``Parser key "key": ...`` (a value of the wrong type or an invalid class) in short."""
    value = None
    expected: list[str] = []
    choices: list[str] = []
    notes: list[str] = []
    prefix = ""
    for raw in details:
        line = raw.strip().removeprefix("- ").strip()
        if (
            not line
            or line in ("Errors:", "Does not validate against any of the Union subtypes")
            or line.startswith(("Subtypes:", "Given value type:", "Expected a path but "))
        ):
            continue
        if line.startswith("Given value: "):
            value = line.split(": ", 1)[1]
            continue
        match = re.fullmatch(r"Problem with given class_path '([^']*)':", line)
        if match:
            prefix = f"{match[1]}: "
            continue
        match = re.fullmatch(r"Expected a dot import path string: (.*)", line)
        if match:
            notes.append(f"{match[1]!r} is not a known class name or import path")
            continue
        match = re.fullmatch(r"Expected a (.+?)(?:\. Got value: (.*))?", line)
        if match and not prefix:
            if match[2] is not None:
                value = match[2]
            literal = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", match[1])
            if literal:
                choices.append(literal[1])
            else:
                expected.append(_type_name(match[1]))
            continue
        notes.append(prefix + line)
        prefix = ""
    if choices:
        expected.insert(0, "one of " + ", ".join(choices))
    summary = "seq2seq: error: invalid value"
    if value is not None and not inline and not value.startswith("NestedArg("):
        summary += f" {value if len(value) <= 60 else value[:57] + '...'!r}"
    summary += f" for --{key}"
    if inline:
        summary += f": {inline}"
    if expected and not notes:  # with notes (a class at fault) the other types mislead
        summary += f" (expected {' or '.join(dict.fromkeys(expected))})"
    notes = list(dict.fromkeys(notes))
    if len(notes) > 4:
        notes[4:] = ["..."]
    return [summary, *(f"  {note}" for note in notes)]


def _type_name(typehint: str) -> str:
    """``<class 'int'>`` -> ``int``, ``<class 'NoneType'>`` -> ``null``."""
    name = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", typehint).replace("typing.", "")
    return "null" if name == "NoneType" else name


class Seq2SeqCLI(LightningCLI):
    """LightningCLI with the links between data and model settings, and checkpoint aliases.

    ``--ckpt_path best`` and ``--ckpt_path last`` are resolved from the ``dirpath`` of the
    configured ``ModelCheckpoint`` (``last.ckpt`` there records the best checkpoint), so they
    also work in a new process after ``fit``. With a checkpoint, ``validate``, ``test`` and
    ``predict`` take the model's architecture from the checkpoint (with a warning naming the
    settings in which the config differs), while decoding settings (beam size, length penalty)
    come from the config and command line; ``fit --ckpt_path`` resumes with the config's
    architecture and stops with an error naming the settings that differ from the checkpoint's.
    A ``fit`` that would start a new run (no ``--ckpt_path``, or ``--ckpt_path last`` without a
    ``last.ckpt``) stops with an error when its checkpoint folder already holds checkpoints,
    before any data is read; smoke runs (``--trainer.fast_dev_run``) write none and run anyway.

    ``validate``, ``test`` and ``predict`` need ``--ckpt_path``: without one they stop with an
    argument error (exit status 2) rather than score the untrained model of the config;
    ``--ckpt_path untrained`` does that on purpose (a smoke test).

    ``fit`` checks that the log and checkpoint folders are writable before training starts
    (``predict`` its ``--prediction_writer.output_path`` before the checkpoint is read),
    and writes checkpoints atomically (:class:`~seq2seq.checkpoint.AtomicCheckpointIO`). A
    command removes the log and checkpoint folders it created that are still empty when it
    ends (also when it fails).
    """

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict):
        main_kwargs = {"description": _DESCRIPTION, **main_kwargs}
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        self.parser.usage = _USAGE  # after the subcommands, whose own usage starts with prog
        for action in self.parser._actions:  # the subcommands' one-line helps: seq2seq's words
            for choice in getattr(action, "_choices_actions", []):
                choice.help = _SUBCOMMAND_HELP.get(choice.dest, choice.help)

    def _prepare_subcommand_parser(self, klass, subcommand: str, **kwargs):
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand in _SUBCOMMAND_HELP:  # not Lightning's first sentences, cut short
            parser.description = _SUBCOMMAND_HELP[subcommand][0].upper() + (
                _SUBCOMMAND_HELP[subcommand][1:] + "."
            )
        for group in parser._action_groups:  # the method's argument group: the same words
            if group.title and group.title.startswith(("Runs the full", "Perform one", "Run inf")):
                group.title = f"{subcommand} arguments"
        if subcommand == "fit":
            for action in parser._actions:
                if action.dest == "ckpt_path":
                    action.help = (
                        "Resume the run of this checkpoint: last (the last.ckpt in the dirpath "
                        "of the config's ModelCheckpoint; without one, a new run starts, with a "
                        "warning) or a checkpoint file. From a checkpoint older than its "
                        "folder's last.ckpt (best, say) the resumed run overwrites the later "
                        "checkpoints, with a warning; to keep them, start a new run from it with "
                        "--init_from FILE --checkpoint_dir NEW."
                    )
        if subcommand in _USES:
            for action in parser._actions:
                if action.dest == "ckpt_path":
                    verb, verbs = _USES[subcommand]
                    action.help = (
                        f"The checkpoint to {verb}: best or last (found in the dirpath of the "
                        "config's ModelCheckpoint) or a checkpoint file. Required; --ckpt_path "
                        f"{UNTRAINED} {verbs} the model of the config with freshly initialised "
                        "weights instead (a smoke test)."
                    )
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        _batch_counts_parse_as_integers(parser)
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="parse")
        parser.link_arguments("data.max_positions", "model.max_positions", apply_on="parse")
        parser.link_arguments("data.tgt_lang", "model.tgt_lang", apply_on="parse")
        parser.add_lightning_class_args(TranslationWriter, "prediction_writer")
        parser.add_argument(
            "--checkpoint_dir",
            type=str | None,
            default=None,
            help="Folder of the run's checkpoints: replaces the dirpath of every ModelCheckpoint "
            "in trainer.callbacks (where fit writes them and where --ckpt_path best and last "
            "are looked up).",
        )
        parser.add_argument(
            "--init_from",
            type=str | None,
            default=None,
            help="fit only: start a new run from the model weights of this checkpoint (written "
            "by seq2seq fit or seq2seq average), with its model settings and SentencePiece "
            "model; optimizer, learning-rate schedule, step count and data position start "
            "afresh (fine-tuning). Not with --ckpt_path, which resumes a run.",
        )

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        if config.get("checkpoint_dir"):
            _set_checkpoint_dirs(config, config["checkpoint_dir"])
        ckpt_path = config.get("ckpt_path")
        self._resumed_step = None
        self._init_from = None
        if config.get("init_from"):
            self._parse_init_from(subcommand, config)
        if subcommand in _USES:
            if not ckpt_path:
                verb, verbs = _USES[subcommand]
                self._subcommand_parsers[subcommand].error(
                    f"{subcommand} needs --ckpt_path best, last or FILE, the checkpoint to "
                    f"{verb}; --ckpt_path {UNTRAINED} {verbs} the model of the config with "
                    "freshly initialised weights"
                )
            writer = config.get("prediction_writer") if subcommand == "predict" else None
            if writer is not None and writer.get("output_path"):
                # Before the checkpoint or the data are read, rather than after decoding.
                check_output_file(writer["output_path"], "--prediction_writer.output_path")
            if str(ckpt_path) == UNTRAINED:
                return
        if ckpt_path in ("best", "last") and not (subcommand == "fit" and ckpt_path == "last"):
            config["ckpt_path"] = str(resolve_ckpt_path(ckpt_path, _checkpoint_dirs(config)))
        elif ckpt_path == "last":
            # ``fit --ckpt_path last`` resumes if a last.ckpt exists, else starts from scratch.
            dirs = _checkpoint_dirs(config)
            try:
                config["ckpt_path"] = str(resolve_ckpt_path("last", dirs))
            except FileNotFoundError:
                config["ckpt_path"] = None
                if not config.get("trainer", {}).get("fast_dev_run"):
                    _refuse_earlier_checkpoints(dirs)
                where = ", ".join(str(d) for d in dirs) or "the configured checkpoint folder"
                if rank_zero_only.rank == 0:  # a mistyped folder would start over unseen
                    print(
                        f"seq2seq: warning: --ckpt_path last: no last.ckpt in {where}; "
                        "training from scratch",
                        file=sys.stderr,
                    )
        elif subcommand == "fit" and not ckpt_path:
            # A smoke run (fast_dev_run) writes no checkpoint, so it may run beside a real run's.
            if not config.get("trainer", {}).get("fast_dev_run"):
                _refuse_earlier_checkpoints(_checkpoint_dirs(config))
        elif subcommand == "fit" and not config.get("trainer", {}).get("fast_dev_run"):
            # Resuming from a file: fine in its own folder, not over another run's checkpoints.
            own = Path(os.path.realpath(Path(ckpt_path).parent))
            others = [d for d in _checkpoint_dirs(config) if Path(os.path.realpath(d)) != own]
            _refuse_earlier_checkpoints(others, resuming=ckpt_path)
        if config.get("ckpt_path"):  # a bad checkpoint is reported before any data is read
            checkpoint = load_checkpoint(config["ckpt_path"], mmap=True)
            check_model_checkpoint(checkpoint, config["ckpt_path"], trainer=True)
            self._resumed_step = checkpoint.get("global_step")
            if subcommand == "fit":
                _continue_log_version(config, checkpoint)
            if subcommand == "fit":
                _warn_resuming_behind_last(config["ckpt_path"], self._resumed_step)
            if subcommand == "fit" and "optimizer_states" not in checkpoint:
                raise CheckpointError(
                    f"{config['ckpt_path']} holds model weights only (e.g. written by "
                    "`seq2seq average`): training cannot resume from it; give a checkpoint "
                    "written by `seq2seq fit`, or start a new run from its weights with "
                    f"--init_from {config['ckpt_path']}"
                )
            saved = checkpoint.get(CHECKPOINT_KEY, {}).get("model_config", {})
            if subcommand == "fit" and saved and hasattr(config.get("model"), "get"):
                # The module refuses these when it loads the checkpoint, after the data is
                # prepared; say it before.
                differing = _other_architecture(saved, config["model"])
                if differing:
                    raise ValueError(
                        f"{config['ckpt_path']} was trained with other model settings than the "
                        f"config: {', '.join(differing)}; training resumes only with the "
                        "checkpoint's (give the config it was trained with)"
                    )
            if subcommand == "fit" and hasattr(config.get("data"), "get"):
                other = _other_languages(checkpoint, config["data"])
                if other:
                    raise ValueError(
                        f"{config['ckpt_path']} was trained {other}; training resumes only in "
                        "the checkpoint's direction (start a new run, in another "
                        "--checkpoint_dir, for the other one)"
                    )
            data_state = checkpoint.get(TranslationDataModule.__qualname__)
            if subcommand == "fit" and data_state and hasattr(config.get("data"), "get"):
                # Before SentencePiece and the data cache are built for settings that the
                # data module would refuse once the checkpoint is loaded.
                refusal = TranslationDataModule.resume_refusal(data_state, config["data"])
                if refusal:
                    raise ValueError(f"{config['ckpt_path']}: {refusal}")

    def _parse_init_from(self, subcommand: str, config) -> None:
        """Check ``--init_from`` and take the model settings from its checkpoint (before any
        data is read)."""
        path = config["init_from"]
        parser = self._subcommand_parsers[subcommand]
        if subcommand != "fit":
            parser.error(
                f"--init_from is for fit (a new run from a checkpoint's weights), not {subcommand}"
            )
        if config.get("ckpt_path"):
            parser.error(
                "give either --ckpt_path (resume a run: its optimizer, schedule and data "
                "position too) or --init_from (a new run from a checkpoint's weights), not both"
            )
        if path in ("best", "last") and not Path(path).exists():
            # The aliases name checkpoints of this run's folder, which a new run starts empty.
            raise FileNotFoundError(
                f"--init_from {path}: the aliases best and last name this run's own "
                "checkpoints (--ckpt_path); --init_from needs the file of the checkpoint to "
                "start from, e.g. checkpoints/multi30k_de_en/last.ckpt"
            )
        checkpoint = load_checkpoint(path, mmap=True)
        check_model_checkpoint(checkpoint, path)
        if tokenizer_from_checkpoint(checkpoint) is None:
            raise CheckpointError(f"--init_from {path} holds no SentencePiece model")
        saved = checkpoint.get(CHECKPOINT_KEY, {}).get("model_config", {})
        if saved:
            _warn_other_architecture("fit --init_from", path, saved, config["model"])
            for key, value in saved.items():
                config["model"][key] = value
            for key in _DATA_LINKED:
                if key in saved:
                    config["data"][key] = saved[key]
        other = _other_languages(checkpoint, config["data"])
        if other and rank_zero_only.rank == 0:
            print(
                f"seq2seq: warning: --init_from {path} was trained {other}; fit trains "
                "it on the configured pairs",
                file=sys.stderr,
            )
        self._init_from = path

    def _parse_ckpt_path(self) -> None:
        """Take the model architecture (not decoding settings) from ``--ckpt_path``."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if subcommand == "fit" or _untrained_or_none(ckpt_path) or not Path(ckpt_path).is_file():
            return
        checkpoint = load_checkpoint(ckpt_path, mmap=True)  # settings only
        data = self.config[subcommand]["data"]
        other = _other_languages(checkpoint, data)
        if other:
            if rank_zero_only.rank == 0:
                print(
                    f"seq2seq: warning: {ckpt_path} was trained {other}; {subcommand} uses the "
                    "checkpoint's languages",
                    file=sys.stderr,
                )
            src, tgt = language_pair(checkpoint)
            data["src_lang"], data["tgt_lang"] = src, tgt
            self.config[subcommand]["model"]["tgt_lang"] = tgt  # sacreBLEU's tokenizer choice
        saved = checkpoint.get(CHECKPOINT_KEY, {}).get("model_config", {})
        if saved:
            model = self.config[subcommand]["model"]
            _warn_other_architecture(subcommand, ckpt_path, saved, model)
            for key, value in saved.items():
                model[key] = value
            data = self.config[subcommand]["data"]
            for key in _DATA_LINKED:  # data.* settings that model.* settings follow
                if key in saved:
                    data[key] = saved[key]

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        no_bar = self._progress_bar_unwanted()
        if no_bar:
            kwargs.setdefault("enable_progress_bar", False)
        if self.subcommand == "predict":  # its output file is all it writes: no log folder
            kwargs["logger"] = False
            self.save_config_callback = None
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, TypeError) as err:
            clearer = _no_accelerator(err, self.config_init[self.subcommand].get("trainer", {}))
            if clearer is err:
                raise
            raise clearer from err
        if self.subcommand == "fit" and trainer.progress_bar_callback is None:
            if not _stdout_is_terminal():  # no bar, also with enable_progress_bar: false
                trainer.callbacks.append(TextProgress(trainer.log_every_n_steps))
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer

    def _progress_bar_unwanted(self) -> bool:
        """Whether a subcommand runs with stdout not a terminal (a log file, a pipe) and neither
        ``trainer.enable_progress_bar`` nor a progress-bar callback is configured: then no
        progress bar, whose redraws (carriage returns) would otherwise surround the score lines
        in the log. ``fit`` without a bar (this way or with ``enable_progress_bar: false``)
        into a log prints a line of progress every ``log_every_n_steps`` steps instead
        (:class:`seq2seq.callbacks.TextProgress`)."""
        if self.subcommand not in ("fit", "validate", "test", "predict"):
            return False
        trainer = self.config_init[self.subcommand].get("trainer", {})
        if trainer.get("enable_progress_bar") is not None:
            return False
        callbacks = trainer.get("callbacks") or []
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        if any(isinstance(c, ProgressBar) for c in callbacks):
            return False
        return not _stdout_is_terminal()

    def before_fit(self) -> None:
        """Checks the run's folders and locks its checkpoint folders (see :class:`_FolderLock`).

        Raises:
            OSError: if a log or checkpoint folder cannot be written, or a checkpoint folder is
                in use by another ``seq2seq fit``.
        """
        # A smoke run (fast_dev_run) writes no checkpoint: its folder is neither checked nor made.
        _check_writable(self.trainer, checkpoints=not self.trainer.fast_dev_run)
        if not self.trainer.fast_dev_run and self.trainer.is_global_zero:
            self._lock_checkpoint_folders()
        advice = _streaming_validation_advice(self.trainer, self.datamodule)
        if advice:
            rank_zero_warn(advice)
        if self.config[self.subcommand].get("ckpt_path"):
            # Resuming into the run's own checkpoint folder is the point, not a warning.
            warnings.filterwarnings("ignore", message="Checkpoint directory .* is not empty")
        if self.trainer.fast_dev_run:
            # A smoke run writes no checkpoint; Lightning's ModelCheckpoint(save_last=True)
            # still writes last.ckpt when training ends, over the real run's.
            for callback in self.trainer.checkpoint_callbacks:
                callback.save_last = False

    def _lock_checkpoint_folders(self) -> None:
        """Locks the ``dirpath`` of each ``ModelCheckpoint`` for this process (held until
        :meth:`_unlock_checkpoint_folders` or the process ends).

        Raises:
            OSError: if another ``seq2seq fit`` holds the lock of one of the folders.
        """
        self._folder_locks = getattr(self, "_folder_locks", [])
        folders = [
            Path(callback.dirpath)
            for callback in self.trainer.checkpoint_callbacks
            if isinstance(callback, ModelCheckpoint)
            and callback.dirpath
            and "://" not in str(callback.dirpath)
        ]
        for folder in dict.fromkeys(Path(os.path.realpath(f)) for f in folders):
            lock = _FolderLock(folder)
            lock.acquire()
            self._folder_locks.append(lock)
            if [p for p in folder.iterdir() if p.name != _LOCK_NAME] == []:
                # Lightning's warning of a non-empty checkpoint folder would be about the lock.
                warnings.filterwarnings(
                    "ignore", message=f"Checkpoint directory {re.escape(str(folder))} exists and"
                )

    def _unlock_checkpoint_folders(self) -> None:
        """Releases the locks of :meth:`_lock_checkpoint_folders`, removing their files."""
        for lock in getattr(self, "_folder_locks", []):
            lock.release()
        self._folder_locks = []

    def before_test(self) -> None:
        """Refuses a ``test`` without test splits before any data is read.

        Raises:
            ValueError: if ``--data.test_splits`` is empty.
        """
        if not getattr(self.datamodule, "test_set_names", True):
            raise ValueError(
                "test has nothing to score: --data.test_splits is empty; name the test "
                "split(s), e.g. --data.test_splits '[test]'"
            )

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict:
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if subcommand in _USES and str(kwargs.get("ckpt_path")) == UNTRAINED:
            kwargs["ckpt_path"] = None  # Lightning: the model's current (fresh) weights
        if subcommand == "test" and len(getattr(self.datamodule, "test_set_names", [])) > 1:
            # Lightning's table repeats every set's metrics under every set's column; the
            # module prints one row per set instead.
            kwargs["verbose"] = False
        return kwargs

    def _run_subcommand(self, subcommand: str) -> None:
        """Runs ``subcommand``; then (whether it failed or not) removes the folders it created
        that are still empty, e.g. the checkpoint folder of a run that trained nothing (on the
        process of global rank 0 only)."""
        new_folders = _missing_folders(self.trainer) if self.trainer.is_global_zero else []
        if self.trainer.is_global_zero:
            _warn_slow_bfloat16(self.trainer)
        try:
            self._run_and_explain(subcommand)
        finally:
            self._unlock_checkpoint_folders()
            if new_folders:
                _remove_empty_folders(new_folders, self.trainer)

    def _run_and_explain(self, subcommand: str) -> None:
        """``LightningCLI._run_subcommand``, with Ctrl-C and Lightning's hparams clash
        reported as what they are."""
        try:
            super()._run_subcommand(subcommand)
        except SystemExit as stop:
            # After Ctrl-C, Lightning shuts down gracefully (LastCheckpoint saves last.ckpt) and
            # calls sys.exit(1); report it as the interruption it is (main: status 130).
            interrupted = getattr(self.trainer, "interrupted", False)
            if stop.code == 1 and interrupted and not isinstance(stop, SIGTERMException):
                raise KeyboardInterrupt from None
            # A Ctrl-C inside a training batch stops at its end through Lightning's SIGTERM
            # path (seq2seq.callbacks.LastCheckpoint): report the interruption it was.
            if isinstance(stop, SIGTERMException) and any(
                getattr(callback, "stopped_on_ctrl_c", False) for callback in self.trainer.callbacks
            ):
                raise KeyboardInterrupt from None
            raise
        except RuntimeError as err:
            # Lightning's check that model and data module agree on shared settings: the
            # checkpoint's model (its settings, see _parse_ckpt_path) against the config's data.
            found = re.search(r"the keys \[([^\]]*)\]", str(err))
            if not str(err).startswith(_HPARAMS_CLASH) or found is None:
                raise
            keys = re.findall(r"'([^']+)'", found[1])
            model, data = self.model.hparams, self.datamodule.hparams
            values = "; ".join(
                f"{k}: checkpoint {model.get(k)!r}, config {data.get(k)!r}" for k in keys
            )
            hint = " ".join(f"--data.{k} {model.get(k)}" for k in keys)
            raise ValueError(
                f"the checkpoint was trained with other data settings than this config "
                f"({values}); pass {hint} or the config it was trained with"
            ) from err

    def predict(self, **kwargs):
        """``trainer.predict``, except for a ``predict_file`` without lines: then an empty
        output file and a notice on stderr, as ``translate`` gives no lines for no input.

        Raises:
            ValueError: if the output file is the ``predict_file`` or the checkpoint (which
                writing the translations would destroy).
        """
        writer = next((c for c in self.trainer.callbacks if isinstance(c, TranslationWriter)), None)
        predict_file = getattr(self.datamodule, "predict_file", None)
        if writer is not None and writer.output_path.exists():
            for name, path in (
                ("--data.predict_file", predict_file),
                ("--ckpt_path", kwargs.get("ckpt_path")),
            ):
                if path is not None and Path(path).exists():
                    if writer.output_path.samefile(path):
                        raise ValueError(
                            f"--prediction_writer.output_path {writer.output_path} is the "
                            f"{name} file; give another file name"
                        )
        if writer is None or predict_file is None or not _has_no_lines(predict_file):
            return self.trainer.predict(**kwargs)
        if self.trainer.is_global_zero:
            write_lines(writer.output_path, [])
            print(
                f"seq2seq: the predict file {predict_file} has no lines; wrote an empty "
                f"{writer.output_path}",
                file=sys.stderr,
            )
        return []

    def after_fit(self) -> None:
        """Say why a resumed run trained nothing when one of its limits (``max_time``,
        ``max_steps``, ``max_epochs``) was already reached: Lightning restores the run's
        progress and stops at once, with at most a line of its own."""
        trainer = self.trainer
        if self._resumed_step is None or self._resumed_step != trainer.global_step:
            return
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        remaining = None if timer is None else timer.time_remaining("train")
        if remaining is not None and remaining <= 0:
            spent = timedelta(seconds=round(timer.time_elapsed("train")))
            why = f"had already spent {spent} of its --trainer.max_time"
            raise_ = "--trainer.max_time"
        elif trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
            why = f"is at step {trainer.global_step}, --trainer.max_steps is {trainer.max_steps}"
            raise_ = "--trainer.max_steps"
        elif trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs > 0:
            why = f"had already trained --trainer.max_epochs {trainer.max_epochs} epochs"
            raise_ = "--trainer.max_epochs"
        else:
            return
        if trainer.is_global_zero:
            print(
                f"seq2seq: nothing trained: the resumed run {why}; raise {raise_} to train on",
                file=sys.stderr,
            )

    def after_instantiate_classes(self) -> None:
        if getattr(self, "_init_from", None) and self.subcommand == "fit":
            self._load_initial_weights(self._init_from)
            return
        ckpt_path = self.config[self.subcommand].get("ckpt_path") if self.subcommand else None
        if (
            not _untrained_or_none(ckpt_path)
            and Path(ckpt_path).is_file()
            and not (self.subcommand == "fit" and getattr(self.datamodule, "tokenizer_path", None))
        ):
            # Evaluate, predict and resume training with the tokenizer the checkpoint was
            # trained with (a resumed run trains no SentencePiece model, also on a corpus that
            # has grown since); an explicit --data.tokenizer_path wins for fit.
            checkpoint = load_checkpoint(ckpt_path, mmap=True)
            tokenizer = tokenizer_from_checkpoint(checkpoint)
            if tokenizer is not None:
                self.datamodule.tokenizer = tokenizer
                self.model.tokenizer = tokenizer

    def _load_initial_weights(self, path: str) -> None:
        """``fit --init_from``: the checkpoint's SentencePiece model and model weights, before
        the data is prepared (no SentencePiece model is trained)."""
        checkpoint = load_checkpoint(path, mmap=True)
        tokenizer = tokenizer_from_checkpoint(checkpoint)
        named = getattr(self.datamodule, "tokenizer_path", None)
        if named and Path(named).is_file():
            if Tokenizer.load(named).to_bytes() != tokenizer.to_bytes():
                raise ValueError(
                    f"--data.tokenizer_path {named} is another SentencePiece model than the one "
                    f"--init_from {path} was trained with; leave data.tokenizer_path unset (the "
                    "checkpoint's is used)"
                )
        self.datamodule.tokenizer = tokenizer
        self.model.tokenizer = tokenizer
        state = {
            key[len("model.") :]: value
            for key, value in checkpoint["state_dict"].items()
            if key.startswith("model.")
        }
        self.model.model.load_state_dict(state)
        step = checkpoint.get("global_step")
        rank_zero_info(
            f"initialised the model from {path}"
            + (f" (trained {step} steps)" if step is not None else "")
            + "; optimizer, learning-rate schedule, step count and data position start afresh"
        )


def _streaming_validation_advice(trainer: L.Trainer, datamodule) -> str | None:
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


def _no_accelerator(err: Exception, trainer: dict) -> Exception:
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


def _check_writable(trainer: L.Trainer, checkpoints: bool = True) -> None:
    """Fails before training if a log or (with ``checkpoints``) a checkpoint folder cannot be
    created or written.

    Raises:
        OSError: naming the setting and the folder, with the error number of the failure.
    """
    folders = [(logger.save_dir, "the logger's save_dir") for logger in trainer.loggers]
    folders += [
        (callback.dirpath, "ModelCheckpoint's dirpath")
        for callback in trainer.callbacks
        if checkpoints and isinstance(callback, ModelCheckpoint)
    ]
    folders.append((trainer.default_root_dir, "trainer.default_root_dir"))
    for folder, setting in folders:
        if not folder or "://" in str(folder):
            continue
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            raise OSError(
                err.errno,
                f"cannot write to {folder} ({setting}): {err.strerror or err}; choose a "
                "writable folder before training",
            ) from err


#: The lock file of a checkpoint folder in use by ``seq2seq fit`` (see :class:`_FolderLock`).
_LOCK_NAME = ".seq2seq.lock"


class _FolderLock:
    """An exclusive lock on ``folder``: ``flock`` on the file :data:`_LOCK_NAME` in it, which
    holds the process id of the holder. The operating system releases the lock when the
    process ends, however it ends; :meth:`release` also removes the file. Without ``fcntl``
    (not POSIX) nothing is locked."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / _LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Takes the lock, without waiting.

        Raises:
            OSError: if another process holds it (naming the folder and that process's id),
                or the lock file cannot be created.
        """
        try:
            import fcntl
        except ImportError:  # not POSIX
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._holder(fd)
                os.close(fd)
                raise self._in_use(holder) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            if _same_inode(current, os.fstat(fd)):
                break
            os.close(fd)  # the holder before removed the file meanwhile: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def check_free(self) -> None:
        """Checks, without taking the lock or creating its file, that no other process holds
        it (a later :meth:`acquire` can still find it taken).

        Raises:
            OSError: if another process holds it, as :meth:`acquire` does.
        """
        try:
            import fcntl
        except ImportError:  # not POSIX
            return
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError:  # no lock file, or one acquire reports on
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise self._in_use(self._holder(fd)) from None
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _in_use(self, holder: int | None) -> OSError:
        """The error that the lock is held by process ``holder`` (``None``: unknown)."""
        pid = f" (pid {holder})" if holder else ""
        return OSError(
            f"{self.folder} is in use by another seq2seq fit{pid}, which writes its "
            "checkpoints there; wait for it to end, or give this run another folder with "
            "--checkpoint_dir DIR"
        )

    @staticmethod
    def _holder(fd: int) -> int | None:
        """The process id written in the lock file ``fd``, if any."""
        try:
            return int(os.pread(fd, 32, 0).decode().strip())
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        """Removes the lock file and releases the lock (nothing if not held)."""
        if self._fd is None:
            return
        import fcntl

        fd, self._fd = self._fd, None
        try:
            if _same_inode(os.stat(self.path), os.fstat(fd)):
                self.path.unlink()
        except OSError:
            pass
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _same_inode(a: os.stat_result | None, b: os.stat_result) -> bool:
    return a is not None and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (not a log file or a pipe)."""
    return hasattr(sys.stdout, "isatty") and sys.stdout.isatty()


def _untrained_or_none(ckpt_path: str | Path | None) -> bool:
    """Whether ``ckpt_path`` names no checkpoint file: not given, or ``untrained``."""
    return not ckpt_path or str(ckpt_path) == UNTRAINED


def _run_folders(trainer: L.Trainer) -> list[Path]:
    """The local folders a run of ``trainer`` writes into (absolute, not necessarily existing):
    each ``ModelCheckpoint``'s ``dirpath``, the ``save_dir`` of each logger, for a TensorBoard
    or CSV logger its ``root_dir`` and, once that exists, its ``log_dir`` (which fixes the
    run's version number, as the logger itself would; before, the logger would warn of a
    missing folder), and ``default_root_dir``. Remote paths (``s3://...``) are left out."""
    folders: list = [
        callback.dirpath for callback in trainer.callbacks if isinstance(callback, ModelCheckpoint)
    ]
    for logger in trainer.loggers:
        folders.append(getattr(logger, "save_dir", None))
        if isinstance(logger, (TensorBoardLogger, CSVLogger)):
            folders.append(logger.root_dir)
            if os.path.isdir(logger.root_dir):
                folders.append(logger.log_dir)
    folders.append(trainer.default_root_dir)
    return [
        Path(os.path.realpath(os.path.expanduser(folder)))
        for folder in folders
        if isinstance(folder, (str, os.PathLike)) and str(folder) and "://" not in str(folder)
    ]


def _missing_folders(trainer: L.Trainer) -> list[Path]:
    """The folders of :func:`_run_folders` and their parents that do not exist (yet); a path
    that cannot be checked (e.g. no permission) counts as existing. Empty if the folders
    cannot be listed."""
    try:
        folders = _run_folders(trainer)
    except Exception:  # nothing is removed then; the command itself reports any real fault
        return []
    missing = []
    for folder in folders:
        for path in (folder, *folder.parents):
            try:
                os.lstat(path)
                break
            except FileNotFoundError:
                missing.append(path)
            except OSError:
                break
    return list(dict.fromkeys(missing))


def _remove_empty_folders(new_folders: list[Path], trainer: L.Trainer) -> None:
    """Removes each of ``new_folders`` (folders that did not exist when the command started)
    that is now an empty folder, deepest first, so that a parent emptied by the removal of its
    children goes too; also the empty folders of :func:`_run_folders` found only now (such as a
    ``ModelCheckpoint`` folder inside the new ``log_dir``) that lie inside one of
    ``new_folders``. A folder holding anything, or that existed before, is left alone; a folder
    that cannot be removed is left as it is, silently."""
    new = set(new_folders)
    try:
        found = [f for f in _run_folders(trainer) if new.intersection(f.parents)]
    except Exception:  # cleaning up after an error must not replace that error
        found = []
    for folder in sorted(set(found) | new, key=lambda p: len(p.parts), reverse=True):
        try:
            if folder.is_dir() and not folder.is_symlink():
                folder.rmdir()  # only ever removes an empty folder
        except OSError:
            pass


def _has_no_lines(path: str | Path) -> bool:
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


def _model_checkpoints(config) -> list:
    """The ``init_args`` of each configured ``ModelCheckpoint`` callback (``None`` where it has
    none)."""
    found = []
    for callback in config.get("trainer", {}).get("callbacks") or []:
        class_path = getattr(callback, "class_path", None) or (
            callback.get("class_path") if isinstance(callback, dict) else None
        )
        if class_path and class_path.endswith("ModelCheckpoint"):
            init_args = getattr(callback, "init_args", None) or (
                callback.get("init_args") if isinstance(callback, dict) else None
            )
            found.append(init_args)
    return found


def _set_checkpoint_dirs(config, folder: str) -> None:
    """``--checkpoint_dir``: make ``folder`` the ``dirpath`` of every ``ModelCheckpoint``.

    Raises:
        ValueError: if the config has no ``ModelCheckpoint`` callback.
    """
    targets = [init_args for init_args in _model_checkpoints(config) if init_args is not None]
    if not targets:
        raise ValueError(
            f"--checkpoint_dir {folder}: the config has no ModelCheckpoint in trainer.callbacks "
            "whose folder it could set"
        )
    for init_args in targets:
        init_args["dirpath"] = folder


def _checkpoint_dirs(config) -> list[Path]:
    """The ``dirpath`` of each configured ``ModelCheckpoint`` callback."""
    return [
        Path(init_args["dirpath"])
        for init_args in _model_checkpoints(config)
        if hasattr(init_args, "get") and init_args.get("dirpath")
    ]


def _cpu_has_bfloat16_instructions(cpuinfo: str | Path = "/proc/cpuinfo") -> bool | None:
    """Whether the CPU lists AVX512-BF16 or AMX among its flags (``None``: cannot tell, e.g.
    no ``/proc/cpuinfo`` outside Linux)."""
    try:
        flags = Path(cpuinfo).read_text(errors="replace").split()
    except OSError:
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _warn_slow_bfloat16(trainer: L.Trainer) -> None:
    """One warning line for bfloat16 on a CPU without bfloat16 instructions, where oneDNN
    emulates them: training ran 3.5x slower than ``32-true`` there (3,569 against 1,024 target
    tokens/s, ``benchmarks/cpu_vs_marian.py`` on an AVX-512 Xeon without AVX512-BF16)."""
    precision = str(getattr(trainer, "precision", ""))
    if not precision.startswith("bf16") or trainer.strategy.root_device.type != "cpu":
        return
    if _cpu_has_bfloat16_instructions() is False:
        print(
            f"seq2seq: warning: --trainer.precision {precision} on a CPU without bfloat16 "
            "instructions (no avx512_bf16 or amx_bf16 in /proc/cpuinfo): they are emulated "
            "and run several times slower than --trainer.precision 32-true",
            file=sys.stderr,
        )


def _continue_log_version(config, checkpoint: dict) -> None:
    """A resumed ``fit`` logs into the version folder of the run it resumes
    (``lightning_logs/<name>/version_N``), as fairseq's TensorBoard folder continues, instead of
    a new ``version_N+1``: the configured TensorBoard logger, if it has the name the checkpoint
    recorded and no version of its own. (Each process writes event files of its own, so
    nothing is overwritten; Lightning's CSV logger would rewrite ``metrics.csv``, so a CSV
    logger keeps starting a new version.)"""
    saved = (checkpoint.get(CHECKPOINT_KEY) or {}).get("log") or {}
    logger = config.get("trainer", {}).get("logger")
    if not saved or not hasattr(logger, "get") or not hasattr(logger.get("init_args"), "get"):
        return
    class_path = str(logger.get("class_path", ""))
    if class_path.rsplit(".", 1)[-1] != "TensorBoardLogger":
        return
    init_args = logger["init_args"]
    name = init_args.get("name") or "lightning_logs"
    if init_args.get("version") is None and name == saved.get("name"):
        init_args["version"] = saved["version"]


def _warn_resuming_behind_last(ckpt_path: str | Path, step: int | None) -> None:
    """Warns (one line, global rank 0) when ``fit --ckpt_path`` names a checkpoint older than
    the ``last.ckpt`` of its own folder (``best``, say): the resumed run writes its checkpoints
    over the later ones, ``last.ckpt`` included (as fairseq's ``--restore-file`` does)."""
    path = Path(ckpt_path)
    last = path.parent / "last.ckpt"
    if step is None or not last.is_file() or os.path.samefile(last, path):
        return
    try:
        last_step = load_checkpoint(last, mmap=True).get("global_step")
    except (OSError, CheckpointError):
        return
    if last_step is not None and last_step > step and rank_zero_only.rank == 0:
        print(
            f"seq2seq: warning: --ckpt_path {path} is at step {step}, behind {last} (step "
            f"{last_step}): the resumed run writes its checkpoints over the later ones; to keep "
            f"them, resume with --ckpt_path last, or start a new run from it with --init_from "
            f"{path} --checkpoint_dir NEW_FOLDER",
            file=sys.stderr,
        )


def _other_languages(checkpoint: dict, data: dict | Namespace) -> str | None:
    """``"de->en (data.src_lang de, data.tgt_lang en), not en->de as configured"`` when the
    checkpoint's language pair differs from the config's ``data`` settings, else ``None``."""
    saved = language_pair(checkpoint)
    if saved is None or not hasattr(data, "get"):
        return None
    mine = (data.get("src_lang"), data.get("tgt_lang"))
    if None in mine or tuple(saved) == mine:
        return None
    return (
        f"{saved[0]}->{saved[1]} (data.src_lang {saved[0]}, data.tgt_lang {saved[1]}), not "
        f"{mine[0]}->{mine[1]} as configured"
    )


_DATA_LINKED = ("vocab_size", "max_positions")
"""Model settings given by ``data.*`` settings (``link_arguments``), which an evaluated
checkpoint's values replace too."""


def _other_architecture(saved: dict, model: dict | Namespace) -> list[str]:
    """The settings in which the model settings ``saved`` in a checkpoint differ from the
    config's ``model`` settings (dropout rates left out), each as ``model.KEY SAVED (config
    VALUE)``, ``data.KEY`` for those the data settings give (:data:`_DATA_LINKED`)."""
    return [
        f"{'data' if key in _DATA_LINKED else 'model'}.{key} {cli_value(value)} "
        f"(config {cli_value(model.get(key))})"
        for key, value in saved.items()
        if key not in _NON_STRUCTURAL and key in model and model.get(key) != value
    ]


def _warn_other_architecture(
    subcommand: str, ckpt_path: str | Path, saved: dict, model: dict | Namespace
) -> None:
    """Warns on stderr (one line, global rank 0 only) when the model settings saved in the
    checkpoint ``ckpt_path`` differ from the config's ``model`` settings, which ``subcommand``
    (``validate``, ``test`` or ``predict``) replaces by the checkpoint's (``vocab_size`` and
    ``max_positions`` are named as the ``data.*`` settings that set them). Dropout rates, which
    do not act outside training, are left out; decoding settings (``beam_size``,
    ``length_penalty``, ...) are not saved as architecture: the config's apply.
    """
    differing = _other_architecture(saved, model)
    if differing and rank_zero_only.rank == 0:
        print(
            f"seq2seq: warning: {ckpt_path} was trained with other model settings than the "
            f"config: {', '.join(differing)}; {subcommand} uses the checkpoint's",
            file=sys.stderr,
        )


def _refuse_earlier_checkpoints(
    checkpoint_dirs: Sequence[Path], resuming: str | Path | None = None
) -> None:
    """Refuses to start a new ``fit`` in a checkpoint folder that already holds checkpoints
    (``*.ckpt`` files): the new run's ``last.ckpt`` would replace the earlier run's, and
    ``--ckpt_path best`` or ``seq2seq average --dir`` would mix the two runs. With
    ``resuming`` (a checkpoint of another folder), the same for a run resumed from it. Called
    before anything is read or written. A folder that does not exist or cannot be listed
    passes (``fit`` reports an unwritable folder later).

    A folder in use by another ``seq2seq fit`` is reported as such (see :class:`_FolderLock`;
    checked on global rank 0 only).

    Raises:
        OSError: if another ``seq2seq fit`` holds the lock of one of the folders.
        FileExistsError: naming the folder, what it holds (``last.ckpt`` and its step, the
            number of other checkpoints) and the ways out.
    """
    for folder in dict.fromkeys(checkpoint_dirs):
        if rank_zero_only.rank == 0:  # the other processes of a DDP run find rank 0's lock
            _FolderLock(Path(os.path.realpath(folder))).check_free()
        try:
            found = sorted(p.name for p in folder.iterdir() if p.suffix == ".ckpt" and p.is_file())
        except OSError:
            continue
        if not found:
            continue
        others = len(found) - ("last.ckpt" in found)
        plural = "s" if others != 1 else ""
        if "last.ckpt" in found:
            try:
                step = load_checkpoint(folder / "last.ckpt", mmap=True).get("global_step")
            except (OSError, CheckpointError):
                step = None
            held = "last.ckpt" + (f" at step {step}" if step is not None else "")
            if others:
                held += f" and {others} other checkpoint{plural}"
            clash = "a new run there would replace its last.ckpt: resume it with --ckpt_path last"
        else:
            names = ", ".join(found[:3]) + (", ..." if others > 3 else "")
            held = f"{others} checkpoint{plural}, {names}, and no last.ckpt"
            clash = (
                "a new run there would mix its checkpoints with them: resume from one with "
                "--ckpt_path FILE"
            )
        if resuming is not None:
            own = Path(resuming).parent
            harm = (
                "replace its last.ckpt" if others < len(found) else "mix its checkpoints with them"
            )
            raise FileExistsError(
                f"{folder} already holds the checkpoints of another run ({held}); the run "
                f"resumed from {resuming} would {harm}: continue it in the checkpoint's own "
                f"folder with --checkpoint_dir {own} or in another one with --checkpoint_dir "
                f"DIR, or remove the .ckpt files from {folder}"
            )
        raise FileExistsError(
            f"{folder} already holds the checkpoints of an earlier run ({held}); {clash}, "
            "give the new run another folder with --checkpoint_dir DIR, or remove the .ckpt "
            f"files from {folder}"
        )


def _check_config_syntax(argv: Sequence[str]) -> None:
    """Exit with status 2 and one line naming the file, line and column when a YAML file given
    on the command line (``--config``, a ``--trainer`` piece, ...) is not valid YAML
    (jsonargparse reports such an error without naming the file)."""
    values = [a.split("=", 1)[1] if a.startswith("--") and "=" in a else a for a in argv]
    paths = [v for v in values if v.endswith((".yaml", ".yml")) and Path(v).is_file()]
    for name in paths:
        try:
            yaml.safe_load(Path(name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue  # a missing or unreadable file: jsonargparse's error names it
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{name}, line {mark.line + 1}, column {mark.column + 1}" if mark else name
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
            if context and start is not None:
                problem += f" ({context} at line {start.line + 1}, column {start.column + 1})"
            print(f"seq2seq: error: YAML syntax error in {where}: {problem}", file=sys.stderr)
            raise SystemExit(2) from None


class _DropAdvertisement(logging.Filter):
    """Drops Lightning's "💡 Tip: ... try installing litlogger" notice (not about the run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


_DROP_ADVERTISEMENT = _DropAdvertisement()


def _silence_lightning_notices(subcommand: str | None = None) -> None:
    """Keep the output to what concerns the run: no litlogger advertisement, no PyTorch
    deprecation warning raised inside Lightning's own code on every command, no
    ``ModelCheckpoint`` "could not find the monitored key" before the first validation, nor
    its "dirpath has changed" when ``validate``/``test``/``predict`` read another folder's
    checkpoint, and under DDP
    no advice to log the held-out scores with ``sync_dist=True`` (``TranslationModule`` sums
    them over the processes itself, so every process logs the same values)."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DROP_ADVERTISEMENT)
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    warnings.filterwarnings(
        "ignore", message=r"It is recommended to use `self\.log\('(val|test)/.*sync_dist=True"
    )
    # Warned (instead of raised) only while no validation has run, e.g. a run stopped by
    # max_steps before its first one: LastCheckpoint says so in words of the run instead.
    warnings.filterwarnings(
        "ignore", message=r"`ModelCheckpoint\(monitor=.*could not find the monitored key"
    )
    if subcommand in _USES:
        # Evaluating a checkpoint of another folder writes no checkpoint: which best_k_models
        # ModelCheckpoint reloads does not matter there.
        warnings.filterwarnings("ignore", message=r"The dirpath has changed from ")


def cli_main(args: Sequence[str] | None = None) -> Seq2SeqCLI | None:
    """Entry point of the ``seq2seq`` console script.

    Args:
        args: command-line arguments without the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The :class:`Seq2SeqCLI` that ran (for ``fit``/``validate``/``test``/``predict``), or
        ``None`` for ``translate`` and ``average``.
    """
    argv = list(sys.argv[1:] if args is None else args)
    _check_config_syntax(argv)
    _silence_lightning_notices(argv[0] if argv else None)
    if argv and argv[0] in ("translate", "average", "export"):
        from seq2seq import commands

        getattr(commands, argv[0])(argv[1:])
        return None
    return Seq2SeqCLI(
        TranslationModule,
        TranslationDataModule,
        args=None if args is None else argv,
        parser_class=Seq2SeqArgumentParser,
        parser_kwargs={"allow_abbrev": False},  # --trainer.max_ep is a typo, not max_epochs
        save_config_kwargs={"overwrite": True},
        seed_everything_default=1,
    )


#: Errors that come from what the user asked for (a path, a file, a setting, a device) rather
#: than from a fault in the program: reported in one line, without a traceback. Every
#: ``ValueError`` raised by seq2seq names the setting or file at fault.
USER_ERRORS = (
    OSError,  # missing/unreadable files and folders, failed downloads, full disks
    ValueError,  # bad settings and bad input data (UnicodeDecodeError included)
    CheckpointError,
    pickle.UnpicklingError,  # a file given as --ckpt_path that is no checkpoint
    MisconfigurationException,  # e.g. a GPU accelerator on a machine without one
)

_DESCRIPTION = "Train, evaluate and use encoder-decoder Transformer translation models."
_USAGE = (
    "seq2seq [-c CONFIG] {fit,validate,test,predict} [OPTIONS]\n"
    "       seq2seq {translate,average,export} [OPTIONS]"
)
_SUBCOMMAND_HELP = {
    "fit": "train a model (or resume a run with --ckpt_path last)",
    "validate": "score a checkpoint on the validation set (data.val_split)",
    "test": "score a checkpoint on the test sets (data.test_splits): BLEU, chrF, TER",
    "predict": "translate data.predict_file with a checkpoint, through the Trainer",
}

_COMMANDS_HELP = """
Further commands (each has --help):
  translate           translate text with a checkpoint alone (stdin/stdout or --input/--output)
  average             average the parameters of several checkpoints
  export              export a checkpoint to CTranslate2 or Hugging Face Transformers

seq2seq --version prints the versions of seq2seq, torch, lightning, sentencepiece and sacrebleu."""


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
        0 on success, 1 after one of :data:`USER_ERRORS` (printed as ``seq2seq: error: ...``
        on stderr; set ``SEQ2SEQ_TRACEBACK=1`` to see the traceback), 143 after a SIGTERM
        (Lightning stops gracefully; ``fit`` saves ``last.ckpt``). Other exceptions propagate
        with their traceback; argument errors exit with status 2.
    """
    argv = sys.argv[1:]
    if argv[:1] in (["--version"], ["-V"]):
        print(version_line())
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        try:
            cli_main()
        finally:
            print(_COMMANDS_HELP, file=sys.stdout if argv else sys.stderr)
        return 0
    shown = warnings.showwarning
    warnings.showwarning = _warning_lines(shown)
    try:
        cli_main()
    except KeyboardInterrupt:
        print("seq2seq: interrupted", file=sys.stderr)
        return 130
    except SIGTERMException:  # Lightning's graceful stop on SIGTERM: a SystemExit without code
        print("seq2seq: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except (*USER_ERRORS, RuntimeError) as err:
        if _traceback_wanted():
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        if isinstance(err, RuntimeError) and not isinstance(err, USER_ERRORS):
            if not message.startswith(_HPARAMS_CLASH):
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


_PACKAGE = Path(__file__).resolve().parent


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


_HPARAMS_CLASH = "Error while merging hparams"


if __name__ == "__main__":
    raise SystemExit(main())
