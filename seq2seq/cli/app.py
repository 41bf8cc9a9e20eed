"""``Seq2SeqCLI``: LightningCLI with seq2seq's links, checkpoint aliases and run guards.

Only LightningCLI's hooks live here; what they do lives beside: the parser and its words
(:mod:`~seq2seq.cli.parser`, :mod:`~seq2seq.cli.messages`), checkpoint arguments
(:mod:`~seq2seq.cli.checkpoint_args`), run folders (:mod:`~seq2seq.cli.run_folder`) and checks
of the machine (:mod:`~seq2seq.cli.environment`).
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ProgressBar, Timer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn

from seq2seq import compat
from seq2seq.callbacks import ExactResume, LastCheckpoint, TextProgress, TranslationWriter
from seq2seq.checkpoint import AtomicCheckpointIO
from seq2seq.cli.callback_args import (
    check_callback_monitors,
    check_single_callbacks,
    configured_callbacks,
    set_patience,
    warn_callback_modes,
)
from seq2seq.cli.checkpoint_args import (
    CheckpointReader,
    apply_checkpoint_architecture,
    apply_init_from,
    checkpoint_tokenizer,
    load_initial_weights,
    resolve_ckpt_arguments,
    resume_over_init_from,
    set_checkpoint_dirs,
    warn_default_sizes,
)
from seq2seq.cli.environment import (
    has_no_lines,
    no_accelerator,
    stdout_is_terminal,
    streaming_validation_advice,
    suggest_bfloat16,
    warn_slow_bfloat16,
)
from seq2seq.cli.messages import (
    DESCRIPTION,
    HPARAMS_CLASH,
    SUBCOMMAND_HELP,
    UNTRAINED,
    USES,
    usage,
)
from seq2seq.cli.parser import Seq2SeqArgumentParser, batch_counts_parse_as_integers
from seq2seq.cli.run_folder import (
    FolderLock,
    RunConfig,
    check_writable,
    lock_checkpoint_folders,
    missing_folders,
    remove_empty_folders,
)
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.evaluation import write_lines
from seq2seq.module import TranslationModule
from seq2seq.text_decoding import as_config

__all__ = ["FolderLock", "Seq2SeqCLI", "run_lightning_cli"]


class Seq2SeqCLI(compat.SkipCheckpointHparams, LightningCLI):
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

    def __init__(self, *args, **kwargs) -> None:
        # State of one command, set by the hooks below.
        self._read = CheckpointReader()
        self._resumed_step: int | None = None
        self._init_from: str | None = None
        self._scored_subset: tuple[tuple[str, str], ...] | None = None
        self._argv: list[str] = []
        self._folder_locks: list[FolderLock] = []
        self._new_folders: list = []
        try:
            super().__init__(*args, **kwargs)
        except SystemExit as stop:
            # After Ctrl-C, Lightning shuts down gracefully (LastCheckpoint saves last.ckpt) and
            # calls sys.exit(1); report it as the interruption it is (main: status 130).
            trainer = getattr(self, "trainer", None)
            interrupted = getattr(trainer, "interrupted", False)
            if stop.code == 1 and interrupted and not isinstance(stop, SIGTERMException):
                raise KeyboardInterrupt from None
            # A Ctrl-C inside a training batch stops at its end through Lightning's SIGTERM
            # path (seq2seq.callbacks.LastCheckpoint): report the interruption it was.
            if isinstance(stop, SIGTERMException) and any(
                getattr(callback, "stopped_on_ctrl_c", False)
                for callback in getattr(trainer, "callbacks", [])
            ):
                raise KeyboardInterrupt from None
            raise
        except RuntimeError as err:
            clash = self._data_settings_clash(err)
            if clash is None:
                raise
            raise clash from err
        finally:
            # Whether the command failed or not: the folders it created and left empty go.
            for lock in self._folder_locks:
                lock.release()
            self._folder_locks = []
            if self._new_folders:
                remove_empty_folders(self._new_folders, self.trainer)

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict):
        main_kwargs = {"description": DESCRIPTION, **main_kwargs}
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        self.parser.usage = usage()  # after the subcommands, whose own usage starts with prog
        for choice in compat.subcommand_choice_actions(self.parser):  # one-line helps: ours
            choice.help = SUBCOMMAND_HELP.get(choice.dest, choice.help)
        for subcommand, parser in compat.subcommand_parsers(self).items():
            _reword_subcommand_help(subcommand, parser)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        batch_counts_parse_as_integers(parser)
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
            "--patience",
            type=int | None,
            default=None,
            help="fit only: validations without a better monitored score before training "
            "stops: replaces the patience of every EarlyStopping in trainer.callbacks "
            "(fairseq's --patience).",
        )
        parser.add_argument(
            "--init_from",
            type=str | None,
            default=None,
            help="fit only: start a new run from the model weights of this checkpoint (written "
            "by seq2seq fit, average or import), with its model settings and tokenizer; "
            "optimizer, learning-rate schedule, step count and data position start "
            "afresh (fine-tuning). With --ckpt_path: only that of the run it started, "
            "which is resumed.",
        )

    def parse_arguments(self, parser, args) -> None:
        self._argv = list(sys.argv[1:] if args is None else args)
        with compat.print_config_skipped():  # printed below, with the shortcuts applied
            super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        fail = compat.subcommand_parsers(self)[subcommand].error
        if config.get("checkpoint_dir"):
            set_checkpoint_dirs(config, config["checkpoint_dir"])
        if config.get("patience") is not None:
            set_patience(config, config["patience"])
        check_single_callbacks(config)
        if subcommand == "fit" and config.get("init_from") and config.get("ckpt_path"):
            resume_over_init_from(config, self._read)
        if config.get("init_from"):
            self._init_from = apply_init_from(subcommand, config, fail, self._read)
        compat.print_config_if_requested(parser, self.config)  # the model settings taken too
        self._resumed_step = resolve_ckpt_arguments(subcommand, config, fail, self._read)
        if subcommand == "fit" and not config.get("init_from") and not config.get("ckpt_path"):
            warn_default_sizes(config)
        if subcommand == "fit":
            _warn_unread_direction(config.get("data") or {}, self._argv)
            check_callback_monitors(config)
            warn_callback_modes(config)

    def before_instantiate_classes(self) -> None:
        """``validate``/``test``/``predict``: the model architecture and language pair of
        ``--ckpt_path`` replace the config's (see
        :func:`~seq2seq.cli.checkpoint_args.apply_checkpoint_architecture`)."""
        if self.subcommand:
            config = self.config[self.subcommand]
            decoding = config["model"].get("decoding")
            if decoding is not None:  # DecodingConfig's own refusal, naming the config key
                as_config(decoding.as_dict(), lambda name: f"model.decoding.{name}")
            self._scored_subset = apply_checkpoint_architecture(self.subcommand, config, self._read)

    def after_instantiate_classes(self) -> None:
        """The checkpoint's SentencePiece model (and with ``--init_from`` its weights) into the
        model and data module; Lightning's call arguments for ``--ckpt_path untrained`` and
        several test sets; the folders the command creates noted for the cleanup."""
        subcommand = self.subcommand
        if not subcommand:
            return
        config = self.config[subcommand]
        if self._init_from and subcommand == "fit":
            load_initial_weights(self.model, self.datamodule, self._init_from, self._read)
        else:
            tokenizer = checkpoint_tokenizer(subcommand, config, self.datamodule, self._read)
            if tokenizer is not None:
                self.datamodule.tokenizer = tokenizer
                self.model.tokenizer = tokenizer
        call = self.config_init[subcommand]
        if subcommand in USES and str(call.get("ckpt_path")) == UNTRAINED:
            call["ckpt_path"] = None  # Lightning: the model's current (fresh) weights
        if self._scored_subset and hasattr(self.datamodule, "heldout_by_pair"):
            self.datamodule.heldout_by_pair = True  # named as in the checkpoint's run
        if subcommand in ("validate", "test") and _heldout_loaders(self.datamodule, subcommand) > 1:
            # Lightning's table repeats every set's metrics under every set's column; the
            # module prints one row per set instead.
            call["verbose"] = False
        if subcommand == "fit" and config.get("checkpoint_dir"):
            for holder in (self.model, *self.trainer.callbacks):  # named in resume advice
                if isinstance(holder, TranslationModule | LastCheckpoint):
                    holder.checkpoint_dir = str(config["checkpoint_dir"])
        name = _logger_name_given(self._argv, self.trainer)
        for callback in self.trainer.callbacks if subcommand == "fit" and name else ():
            if isinstance(callback, LastCheckpoint):
                callback.logger_name = name
        if self.trainer.is_global_zero:
            self._new_folders = missing_folders(self.trainer)
            warn_slow_bfloat16(self.trainer)
            if subcommand == "fit":  # once training starts: not before a one-line error
                self.trainer.callbacks.append(_SuggestBfloat16())

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
            clearer = no_accelerator(err, self.config_init[self.subcommand].get("trainer", {}))
            if clearer is err:
                raise
            raise clearer from err
        if self.subcommand == "fit" and trainer.progress_bar_callback is None:
            if not stdout_is_terminal():  # no bar, also with enable_progress_bar: false
                trainer.callbacks.append(TextProgress(trainer.log_every_n_steps))
        for callback in trainer.callbacks:
            if isinstance(callback, RunConfig) and self.subcommand == "fit":
                callback.resumed_step = self._resumed_step
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
        if any(isinstance(c, ProgressBar) for c in configured_callbacks(trainer)):
            return False
        return not stdout_is_terminal()

    def before_fit(self) -> None:
        """Checks the run's folders and locks its checkpoint folders (see :class:`FolderLock`).

        Raises:
            OSError: if a log or checkpoint folder cannot be written, or a checkpoint folder is
                in use by another ``seq2seq fit``.
        """
        # A smoke run (fast_dev_run) writes no checkpoint: its folder is neither checked nor made.
        check_writable(self.trainer, checkpoints=not self.trainer.fast_dev_run)
        if not self.trainer.fast_dev_run and self.trainer.is_global_zero:
            self._folder_locks = lock_checkpoint_folders(self.trainer)
        advice = streaming_validation_advice(self.trainer, self.datamodule)
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
        if writer is None or predict_file is None or not has_no_lines(predict_file):
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
        """Say where the run's checkpoints are (:func:`_checkpoint_summary`), or why a resumed
        run trained nothing when one of its limits (``max_time``, ``max_steps``,
        ``max_epochs``) was already reached: Lightning restores the run's progress and stops at
        once, with at most a line of its own."""
        trainer = self.trainer
        resume = next((c for c in trainer.callbacks if isinstance(c, ExactResume)), None)
        validated = resume is not None and resume.validated_at_start
        if self._resumed_step is None or self._resumed_step != trainer.global_step or validated:
            summary = _checkpoint_summary(trainer)
            if trainer.is_global_zero:
                for line in (_early_stop_reason(trainer), summary):
                    if line:
                        print(line)
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

    def _data_settings_clash(self, err: RuntimeError) -> ValueError | None:
        """Lightning's check that model and data module agree on shared settings, failed: the
        checkpoint's model (its settings, see ``before_instantiate_classes``) against the
        config's data, as a ``ValueError`` saying what to pass; ``None`` for other errors."""
        found = re.search(r"the keys \[([^\]]*)\]", str(err))
        model = getattr(self, "model", None)
        datamodule = getattr(self, "datamodule", None)
        if not str(err).startswith(HPARAMS_CLASH) or found is None or model is None:
            return None
        keys = re.findall(r"'([^']+)'", found[1])
        model, data = model.hparams, datamodule.hparams
        values = "; ".join(
            f"{k}: checkpoint {model.get(k)!r}, config {data.get(k)!r}" for k in keys
        )
        hint = " ".join(f"--data.{k} {model.get(k)}" for k in keys)
        return ValueError(
            f"the checkpoint was trained with other data settings than this config "
            f"({values}); pass {hint} or the config it was trained with"
        )


class _SuggestBfloat16(L.Callback):
    """:func:`~seq2seq.cli.environment.suggest_bfloat16` when training starts."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            suggest_bfloat16(trainer)


def _reword_subcommand_help(subcommand: str, parser: LightningArgumentParser) -> None:
    """A subcommand's ``--help`` in seq2seq's words: its description, the title of the Trainer
    method's argument group, and the help of ``--ckpt_path``."""
    if subcommand in SUBCOMMAND_HELP:  # not Lightning's first sentences, cut short
        parser.description = SUBCOMMAND_HELP[subcommand][0].upper() + (
            SUBCOMMAND_HELP[subcommand][1:] + "."
        )
    for group in compat.action_groups(parser):  # the method's argument group: the same words
        if group.title and group.title.startswith(("Runs the full", "Perform one", "Run inf")):
            group.title = f"{subcommand} arguments"
    ckpt_path = next((a for a in compat.parser_actions(parser) if a.dest == "ckpt_path"), None)
    if ckpt_path is None:
        return
    if subcommand == "fit":
        ckpt_path.help = (
            "Resume the run of this checkpoint: last (the last.ckpt in the dirpath "
            "of the config's ModelCheckpoint; without one, a new run starts, with a "
            "warning) or a checkpoint file. From a checkpoint older than its "
            "folder's last.ckpt (best, say) the resumed run overwrites the later "
            "checkpoints, with a warning; to keep them, start a new run from it with "
            "--init_from FILE --checkpoint_dir NEW."
        )
    elif subcommand in USES:
        verb, verbs = USES[subcommand]
        ckpt_path.help = (
            f"The checkpoint to {verb}: best or last (found in the dirpath of the "
            "config's ModelCheckpoint) or a checkpoint file. Required; --ckpt_path "
            f"{UNTRAINED} {verbs} the model of the config with freshly initialised "
            "weights instead (a smoke test)."
        )


def run_lightning_cli(args: Sequence[str] | None) -> Seq2SeqCLI:
    """Runs ``fit``/``validate``/``test``/``predict`` with ``args`` (``None``: ``sys.argv``)."""
    return Seq2SeqCLI(
        TranslationModule,
        TranslationDataModule,
        args=args,
        parser_class=Seq2SeqArgumentParser,
        parser_kwargs={"allow_abbrev": False},  # --trainer.max_ep is a typo, not max_epochs
        save_config_callback=RunConfig,  # config.yaml, or beside it that of a resume or test
        save_config_kwargs={"overwrite": True},
        seed_everything_default=1,
        # --model.optimizer / --model.lr_scheduler only: Lightning's top-level --optimizer and
        # --lr_scheduler would replace configure_optimizers, past the module's resume checks.
        auto_configure_optimizers=False,
    )


def _checkpoint_summary(trainer) -> str | None:
    """``checkpoints: FOLDER: best FILE (val/bleu 41.64), last.ckpt (step N)``: the files that
    ``--ckpt_path best`` and ``last`` name, after a fit that wrote checkpoints; else ``None``."""
    callback = trainer.checkpoint_callback
    if trainer.fast_dev_run or callback is None or not callback.dirpath:
        return None
    folder = Path(callback.dirpath)
    parts = []
    if callback.best_model_path and Path(callback.best_model_path).is_file():
        score = callback.best_model_score
        scored = "" if score is None else f" ({callback.monitor} {float(score):.2f})"
        parts.append(f"best {Path(callback.best_model_path).name}{scored}")
    if (folder / "last.ckpt").is_file():
        parts.append(f"last.ckpt (step {trainer.global_step})")
    if not parts:
        return None
    if folder.is_relative_to(Path.cwd()):
        folder = folder.relative_to(Path.cwd())
    return f"checkpoints: {folder}: {', '.join(parts)}"


def _warn_unread_direction(data, argv: Sequence[str]) -> None:
    """Warns when ``--data.src_lang`` or ``--data.tgt_lang`` is given to a ``fit`` of several
    ``data.pairs``, which trains every pair and reads neither (a config's values are the
    defaults of every config, so only the command line's are named)."""
    pairs = data.get("pairs") or []
    flags = [arg.split("=", 1)[0] for arg in argv]
    given = [flag for flag in _DIRECTION if flag in flags]
    if len(pairs) > 1 and given and rank_zero_only.rank == 0:
        print(
            f"seq2seq: warning: {' and '.join(given)} {'are' if len(given) > 1 else 'is'} not "
            f"read by fit with several data.pairs: it trains every pair ({', '.join(pairs)}); "
            "to train one direction, list it alone in --data.pairs",
            file=sys.stderr,
        )


_DIRECTION = ("--data.src_lang", "--data.tgt_lang")


def _early_stop_reason(trainer) -> str | None:
    """``Trainer.fit stopped by EarlyStopping: <its reason>`` after a fit it stopped (as
    Lightning says which limit ended a fit), else ``None``."""
    for callback in trainer.callbacks:
        reason = getattr(callback, "stopping_reason_message", None)
        if isinstance(callback, EarlyStopping) and reason:
            return f"`Trainer.fit` stopped by EarlyStopping: {reason.removesuffix(_SIGNAL)}"
    return None


_SIGNAL = " Signaling Trainer to stop."  # the end of Lightning's reasons, for the trainer


def _heldout_loaders(datamodule, stage: str) -> int:
    """The loaders of a data module's ``validate`` or ``test`` stage: one per pair and set."""
    keys = getattr(datamodule, "heldout_keys", None)
    if keys:
        return len(keys(stage))
    return len(getattr(datamodule, "test_set_names", [])) if stage == "test" else 1


def _logger_name_given(argv: Sequence[str], trainer) -> str | None:
    """The TensorBoard logger's name where the command line gave it
    (``--trainer.logger.init_args.name``), which a resume needs again; else ``None``."""
    given = any(re.match(r"--trainer\.logger\.(init_args\.)?name(=|$)", arg) for arg in argv)
    logger = trainer.logger
    return logger.name if given and isinstance(logger, TensorBoardLogger) else None
