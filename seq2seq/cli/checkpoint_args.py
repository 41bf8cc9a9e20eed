"""Checkpoint arguments of the LightningCLI commands: ``--ckpt_path`` (``best``, ``last``, a
file, ``untrained``), ``--init_from`` and ``--checkpoint_dir``, reconciled with the config
before any data is read, each checkpoint file read once per command."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only

from seq2seq.checkpoint import (
    CheckpointError,
    check_model_checkpoint,
    language_pair,
    load_checkpoint,
    missing_checkpoint,
    resolve_ckpt_path,
)
from seq2seq.checkpoint.format import (
    CHECKPOINT_KEY,
    IMPORTED_FROM,
    INIT_FROM,
    ORIGIN,
    class_name,
    differing_settings,
    language_pairs,
    weights_name,
)
from seq2seq.checkpoint.restore import (
    check_resumed_optimizer,
    check_resumed_plateau_mode,
    check_resumed_schedule,
    tokenizer_from_checkpoint,
)
from seq2seq.cli.callback_args import callback_init_args
from seq2seq.cli.checkpoint_languages import (
    check_target_tags,
    chosen_pairs,
    configured_pairs,
    new_languages,
    other_languages,
    report_new_languages,
    saved_pair_setting,
    use_chosen_pairs,
)
from seq2seq.cli.log_version import continue_log_version
from seq2seq.cli.messages import UNTRAINED, USES, cli_value
from seq2seq.cli.run_folder import refuse_earlier_checkpoints
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.vocabulary import load_tokenizer
from seq2seq.files import check_output_file, new_folder_hint
from seq2seq.nn import TransformerConfig


class CheckpointReader:
    """Reads each checkpoint file once per command (memory-mapped: its tensors are read only
    where used), for the several checks and settings a command takes from it."""

    def __init__(self) -> None:
        self._read: dict[str, dict[str, Any]] = {}

    def __call__(self, path: str | Path) -> dict[str, Any]:
        """The checkpoint dict of ``path``.

        Raises:
            OSError, CheckpointError: as :func:`seq2seq.checkpoint.load_checkpoint`.
        """
        key = os.path.realpath(path)
        if key not in self._read:
            self._read[key] = load_checkpoint(path, mmap=True)
        return self._read[key]


def resolve_ckpt_arguments(
    subcommand: str, config, fail: Callable[[str], None], read: CheckpointReader
) -> int | None:
    """Resolves ``--ckpt_path`` of ``subcommand`` in ``config`` (``best``/``last`` to the file in
    the configured checkpoint folder) and checks it against the config, before any data is
    read: a ``fit`` over an earlier run's checkpoints, a weights-only checkpoint for ``fit``,
    other model settings, another language pair or data seed are refused.

    Args:
        subcommand: ``fit``, ``validate``, ``test`` or ``predict``.
        config: the subcommand's parsed config (changed in place).
        fail: reports an argument error (exit status 2); does not return.
        read: the command's :class:`CheckpointReader`.

    Returns:
        The global step of the checkpoint ``fit`` resumes from (``None``: none).

    Raises:
        FileNotFoundError, FileExistsError, OSError, CheckpointError, ValueError: naming the
            checkpoint or folder and what to do.
    """
    ckpt_path = config.get("ckpt_path")
    fast_dev_run = config.get("trainer", {}).get("fast_dev_run")
    if subcommand in USES:
        if not ckpt_path:
            verb, verbs = USES[subcommand]
            fail(
                f"{subcommand} needs --ckpt_path best, last or FILE, the checkpoint to "
                f"{verb}; --ckpt_path {UNTRAINED} {verbs} the model of the config with "
                "freshly initialised weights"
            )
        writer = config.get("prediction_writer") if subcommand == "predict" else None
        if writer is not None and writer.get("output_path"):
            # Before the checkpoint or the data are read, rather than after decoding.
            check_output_file(writer["output_path"], "--prediction_writer.output_path")
        if str(ckpt_path) == UNTRAINED:
            return None
    if ckpt_path and ckpt_path not in ("best", "last") and not Path(ckpt_path).exists():
        raise FileNotFoundError(missing_checkpoint(ckpt_path, aliases=("best", "last")))
    if ckpt_path in ("best", "last") and not (subcommand == "fit" and ckpt_path == "last"):
        config["ckpt_path"] = str(
            resolve_ckpt_path(ckpt_path, checkpoint_dirs(config), config.get("checkpoint_dir"))
        )
    elif ckpt_path == "last":
        # ``fit --ckpt_path last`` resumes if a last.ckpt exists, else starts from scratch.
        dirs = checkpoint_dirs(config)
        try:
            config["ckpt_path"] = str(resolve_ckpt_path("last", dirs))
        except FileNotFoundError:
            config["ckpt_path"] = None
            if not fast_dev_run:
                refuse_earlier_checkpoints(dirs, checkpoint_dir=config.get("checkpoint_dir"))
            where = ", ".join(f"{d}{new_folder_hint(Path(d))}" for d in dirs)  # new? misspelt?
            where = where or "the configured checkpoint folder"
            if rank_zero_only.rank == 0:  # a mistyped folder would start over unseen
                print(
                    f"seq2seq: warning: --ckpt_path last: no last.ckpt in {where}; "
                    "training from scratch",
                    file=sys.stderr,
                )
    elif subcommand == "fit" and not ckpt_path:
        # A smoke run (fast_dev_run) writes no checkpoint, so it may run beside a real run's.
        if not fast_dev_run:
            refuse_earlier_checkpoints(
                checkpoint_dirs(config), checkpoint_dir=config.get("checkpoint_dir")
            )
    elif subcommand == "fit" and not fast_dev_run:
        # Resuming from a file: fine in its own folder, not over another run's checkpoints;
        # a file that no run can resume from is named first, whatever its folder.
        checkpoint = read(ckpt_path)
        check_model_checkpoint(checkpoint, ckpt_path, trainer=True)
        _refuse_unresumable(ckpt_path, checkpoint)
        own = Path(os.path.realpath(Path(ckpt_path).parent))
        others = [d for d in checkpoint_dirs(config) if Path(os.path.realpath(d)) != own]
        refuse_earlier_checkpoints(others, resuming=ckpt_path)
    if not config.get("ckpt_path"):
        return None
    path = config["ckpt_path"]
    checkpoint = read(path)  # a bad checkpoint is reported before any data is read
    check_model_checkpoint(checkpoint, path, trainer=True)
    step = checkpoint.get("global_step")
    if subcommand == "fit":
        other_run = ""
        if ckpt_path == "last" and not config.get("checkpoint_dir"):
            # another run's model: likeliest a run of its own --checkpoint_dir, resumed without
            other_run = (
                f"; --ckpt_path last took it from {Path(path).parent}, the config's checkpoint "
                "folder: a run started with --checkpoint_dir DIR resumes with --checkpoint_dir DIR"
            )
        _check_resumable(config, path, checkpoint, step, other_run)
    return step


def _configured_class(value: Any) -> str | None | bool:
    """:func:`~seq2seq.checkpoint.format.class_name` of a ``model.optimizer`` or
    ``model.lr_scheduler`` value (``None``: null); ``False`` where the value names no class (the
    default)."""
    if value is None:
        return None
    path = value.get("class_path") if hasattr(value, "get") else None
    module, _, name = path.rpartition(".") if isinstance(path, str) else ("", "", "")
    try:
        cls = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        return False
    return class_name(cls) if inspect.isclass(cls) else False


def _refuse_unresumable(path: str, checkpoint: dict) -> None:
    """Raises CheckpointError for a checkpoint that holds no training state to resume:
    written by ``seq2seq import`` or weights only (``seq2seq average``)."""
    imported = (checkpoint.get(CHECKPOINT_KEY) or {}).get(IMPORTED_FROM)
    if imported is not None:
        source = imported.get("folder") if hasattr(imported, "get") else imported
        raise CheckpointError(
            f"{path} was written by `seq2seq import` (from {source}): it holds no training "
            f"state to resume; start a new run from its weights with --init_from {path}"
        )
    if "optimizer_states" not in checkpoint:
        raise CheckpointError(
            f"{path} holds model weights only (e.g. written by `seq2seq average`): training "
            "cannot resume from it; give a checkpoint written by `seq2seq fit`, or start a "
            f"new run from its weights with --init_from {path}"
        )


def _check_resumable(
    config, path: str, checkpoint: dict, step: int | None, other_run: str = ""
) -> None:
    """``fit --ckpt_path``: refuses what the module or data module would refuse only after the
    data is prepared (``other_run`` ends the refusals that say the checkpoint is another run's
    model), then continues the run's log version and warns when resuming behind the folder's
    ``last.ckpt``."""
    _refuse_unresumable(path, checkpoint)
    saved = checkpoint.get(CHECKPOINT_KEY, {}).get("model_config", {})
    if saved and hasattr(config.get("model"), "get"):
        if _settings_from_a_checkpoint(checkpoint):
            # The run took its model settings from its --init_from checkpoint, not from the
            # config (a fine-tuning config names none): its resume takes them from its own,
            # as its start did, naming those the config gives in a warning as its start did.
            warn_other_architecture("fit --ckpt_path", path, saved, _named_settings(config))
            _take_model_settings(saved, config)
        differing = other_architecture(saved, config["model"])
        if differing:
            raise ValueError(
                f"{path} was trained with other model settings than the config: "
                f"{', '.join(differing)}; training resumes only with the checkpoint's (give "
                f"the config it was trained with){other_run}"
            )
    if hasattr(config.get("data"), "get"):
        other = other_languages(checkpoint, config["data"])
        if other:
            what, others = (
                ("language pairs", "other pairs")
                if "data.pairs" in other
                else ("direction", "the other direction")
            )
            raise ValueError(
                f"{path} was trained {other}; training resumes only in the checkpoint's "
                f"{what} (start a new run, in another --checkpoint_dir, for {others})"
                f"{other_run}"
            )
    if hasattr(config.get("model"), "get"):  # before any data is prepared, as the module would
        checks = (("optimizer", check_resumed_optimizer), ("lr_scheduler", check_resumed_schedule))
        for key, check in checks:
            name = _configured_class(config["model"].get(key))
            if name is not False and key in (checkpoint.get(CHECKPOINT_KEY) or {}):
                check(checkpoint, name)
        schedule = config["model"].get("lr_scheduler")
        if str(_configured_class(schedule)).endswith(".ReduceLROnPlateau"):
            mode = (schedule.get("init_args") or {}).get("mode", "min")
            check_resumed_plateau_mode(checkpoint, mode)
    data_state = checkpoint.get(TranslationDataModule.__qualname__)
    if data_state and hasattr(config.get("data"), "get"):
        # Before SentencePiece and the data cache are built for settings that the data
        # module would refuse once the checkpoint is loaded.
        refusal = TranslationDataModule.resume_refusal(data_state, config["data"])
        if refusal:
            raise ValueError(f"{path}: {refusal}")
    continue_log_version(config, checkpoint, path)  # after the refusals: a refused run logs nothing
    warn_resuming_behind_last(path, step)


def resume_over_init_from(config, read: CheckpointReader) -> None:
    """``fit --init_from X --ckpt_path C`` where run ``C`` started from ``X``: resumes ``C``
    (``--init_from`` unset, with a note), so that a fine-tuning command with ``--ckpt_path
    last`` added resumes as any other; with ``last`` and no ``last.ckpt`` yet, a new run
    from ``X`` (``--ckpt_path`` unset), as fairseq's ``--finetune-from-model`` beside
    ``checkpoint_last.pt``. Other pairs are left for :func:`apply_init_from` to refuse."""
    init_from, ckpt_path = config["init_from"], config["ckpt_path"]
    if ckpt_path == "last":
        try:
            ckpt_path = config["ckpt_path"] = str(
                resolve_ckpt_path("last", checkpoint_dirs(config))
            )
        except FileNotFoundError:
            config["ckpt_path"] = None  # nothing to resume: the run starts from --init_from
            return
    started = _started_from(ckpt_path, read)
    if started is not None and _same_file(started, init_from):
        config["ckpt_path"], config["init_from"] = ckpt_path, None
        rank_zero_info(
            f"resuming {ckpt_path}; --init_from {init_from}, where its run started, is not "
            "read again"
        )


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).samefile(b)
    except OSError:  # one of them moved or removed: by name
        return Path(a).resolve() == Path(b).resolve()


def _other_start(config, read: CheckpointReader) -> str:
    """`` (C is a run started from Y)``: what ``--ckpt_path`` resumes, against ``--init_from``
    (:func:`resume_over_init_from` left them both)."""
    path = config["ckpt_path"]
    if path in ("best", "last") or not Path(path).is_file():
        return ""
    started = _started_from(path, read)
    what = f"a run started from {started}" if started else "a run not started by --init_from"
    return f" ({path} is {what})"


def _started_from(path: str, read: CheckpointReader) -> str | None:
    """The ``--init_from`` checkpoint the run of checkpoint file ``path`` started from, if any
    (``None`` also for an alias or a missing file, which other checks name)."""
    if path in ("best", "last") or not Path(path).is_file():
        return None
    return (read(path).get(CHECKPOINT_KEY) or {}).get(INIT_FROM)


def apply_init_from(
    subcommand: str, config, fail: Callable[[str], None], read: CheckpointReader
) -> str:
    """Checks ``--init_from`` and takes the model settings from its checkpoint (before any
    data is read).

    Returns:
        The checkpoint path.

    Raises:
        FileNotFoundError, CheckpointError: for a checkpoint that cannot start a run.
    """
    path = config["init_from"]
    if subcommand != "fit":
        fail(f"--init_from is for fit (a new run from a checkpoint's weights), not {subcommand}")
    if config.get("ckpt_path"):
        fail(
            "give either --ckpt_path (resume a run: its optimizer, schedule and data "
            "position too) or --init_from (a new run from a checkpoint's weights), not both"
            f"{_other_start(config, read)}"
        )
    if path in ("best", "last") and not Path(path).exists():
        # The aliases name checkpoints of this run's folder, which a new run starts empty.
        raise FileNotFoundError(
            f"--init_from {path}: the aliases best and last name this run's own "
            "checkpoints (--ckpt_path); --init_from needs the file of the checkpoint to "
            "start from, e.g. checkpoints/multi30k_de_en/last.ckpt"
        )
    checkpoint = read(path)
    check_model_checkpoint(checkpoint, path)
    if tokenizer_from_checkpoint(checkpoint) is None:
        raise CheckpointError(f"--init_from {path} holds no SentencePiece model")
    saved = checkpoint.get(CHECKPOINT_KEY, {}).get("model_config", {})
    if saved:
        warn_other_architecture("fit --init_from", path, saved, _named_settings(config))
        _take_model_settings(saved, config)
    other = other_languages(checkpoint, config["data"])
    if other:
        check_target_tags(path, checkpoint, config["data"])
        # With languages new to the checkpoint, report_new_languages says it in one line.
        new = new_languages(checkpoint, configured_pairs(config["data"]))
        if not new and rank_zero_only.rank == 0:
            print(
                f"seq2seq: warning: --init_from {path} was trained {other}; fit trains "
                "it on the configured pairs",
                file=sys.stderr,
            )
    return path


#: The sizes that make a Transformer's shape, for :func:`warn_default_sizes`.
_SIZES = ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff")


def warn_default_sizes(config) -> None:
    """``fit`` of a new run whose config gives none of the model sizes: one line (global rank
    0) saying it trains the default Transformer from fresh weights, where a fine-tuning config
    (which names no sizes) meant ``--init_from``."""
    model = config.get("model") or {}
    if any(model.get(key, _DEFAULTS[key]) != _DEFAULTS[key] for key in _SIZES):
        return
    if rank_zero_only.rank == 0:
        print(
            "seq2seq: warning: fit trains a new model of the default sizes (d_model "
            f"{_DEFAULTS['d_model']}, {_DEFAULTS['n_encoder_layers']} + "
            f"{_DEFAULTS['n_decoder_layers']} layers, d_ff {_DEFAULTS['d_ff']}) from fresh "
            "weights, as the config names none; to fine-tune a pretrained model give --init_from "
            "CHECKPOINT",
            file=sys.stderr,
        )


def _take_model_settings(saved: dict, config) -> None:
    """The checkpoint's model settings into ``config``, with the ``data.*`` settings that
    model settings follow (:data:`DATA_LINKED`)."""
    for key, value in saved.items():
        config["model"][key] = value
    for key in DATA_LINKED:
        if key in saved:
            config["data"][key] = saved[key]


def apply_checkpoint_architecture(
    subcommand: str, config, read: CheckpointReader
) -> tuple[tuple[str, str], ...] | None:
    """``validate``/``test``/``predict``: the model architecture and the language pair (or
    ``data.pairs``) of ``--ckpt_path``, warning where the config differs; ``validate`` and
    ``test`` score a subset of its pairs named in ``data.pairs``, ``predict`` translates one
    (:func:`chosen_pairs`), with a note. Decoding settings (``beam_size``, ``length_penalty``,
    ...) are not saved as architecture: the config's apply.

    Returns:
        the subset of the checkpoint's pairs scored, else ``None``.
    """
    ckpt_path = config.get("ckpt_path")
    if subcommand == "fit" or untrained_or_none(ckpt_path) or not Path(ckpt_path).is_file():
        return None
    checkpoint = read(ckpt_path)  # settings only
    data = config["data"]
    subset = chosen_pairs(subcommand, ckpt_path, checkpoint, data)
    other = None if subset else other_languages(checkpoint, data)
    if subset:
        use_chosen_pairs(subcommand, ckpt_path, checkpoint, subset, config)
    if other:
        several = len(language_pairs(checkpoint) or ()) > 1
        hint = "; to score some of its pairs, list them in data.pairs" if several else ""
        if rank_zero_only.rank == 0:
            print(
                f"seq2seq: warning: {ckpt_path} was trained {other}; {subcommand} uses the "
                f"checkpoint's languages{hint if subcommand != 'predict' else ''}",
                file=sys.stderr,
            )
        if "pairs" in data:  # the data module's setting (None: bilingual)
            data["pairs"] = saved_pair_setting(checkpoint)
        pair = language_pair(checkpoint)
        if pair is not None:
            data["src_lang"], data["tgt_lang"] = pair
            config["model"]["tgt_lang"] = pair[1]  # sacreBLEU's tokenizer choice
    saved = checkpoint.get(CHECKPOINT_KEY, {}).get("model_config", {})
    if saved:
        lineage = _settings_from_a_checkpoint(checkpoint)  # the config names none, or a few
        named = _named_settings(config) if lineage else config["model"]
        warn_other_architecture(subcommand, ckpt_path, saved, named)
        _take_model_settings(saved, config)
    return subset


def _named_settings(config) -> dict:
    """The model settings ``config`` names (:data:`DATA_LINKED` ones in ``data.*``): those not
    at their defaults, which a fine-tuning config, naming none, leaves."""
    data = config.get("data")
    settings = {k: v for k, v in config["model"].items() if k not in DATA_LINKED}
    if hasattr(data, "get"):
        settings.update({key: data[key] for key in DATA_LINKED if key in data})
    return {k: v for k, v in settings.items() if k not in _DEFAULTS or v != _DEFAULTS[k]}


def _settings_from_a_checkpoint(checkpoint: dict) -> bool:
    """Whether the model settings were never a config's: an imported checkpoint, or one of a
    run started with ``--init_from``."""
    extra = checkpoint.get(CHECKPOINT_KEY) or {}
    return IMPORTED_FROM in extra or bool(extra.get(INIT_FROM))


def checkpoint_tokenizer(subcommand: str, config, datamodule, read: CheckpointReader):
    """The SentencePiece model of ``--ckpt_path`` that the command tokenises with, else
    ``None``: evaluating, predicting and resuming use the checkpoint's (a resumed run trains
    no SentencePiece model, also on a corpus that has grown since); an explicit
    ``--data.tokenizer_path`` wins for ``fit``."""
    ckpt_path = config.get("ckpt_path")
    if untrained_or_none(ckpt_path) or not Path(ckpt_path).is_file():
        return None
    if subcommand == "fit" and getattr(datamodule, "tokenizer_path", None):
        return None
    return tokenizer_from_checkpoint(read(ckpt_path))


def load_initial_weights(model, datamodule, path: str, read: CheckpointReader) -> None:
    """``fit --init_from``: the checkpoint's SentencePiece model and model weights, before
    the data is prepared (no SentencePiece model is trained).

    Raises:
        ValueError: if ``--data.tokenizer_path`` names another SentencePiece model.
    """
    checkpoint = read(path)
    tokenizer = tokenizer_from_checkpoint(checkpoint)
    named = getattr(datamodule, "tokenizer_path", None)
    if named and Path(named).is_file():
        if load_tokenizer(named).to_bytes() != tokenizer.to_bytes():
            raise ValueError(
                f"--data.tokenizer_path {named} is another SentencePiece model than the one "
                f"--init_from {path} was trained with; leave data.tokenizer_path unset (the "
                "checkpoint's is used)"
            )
    datamodule.tokenizer = tokenizer
    model.tokenizer = tokenizer
    model.initialised_from = str(path)
    model.origin = (checkpoint.get(CHECKPOINT_KEY) or {}).get(ORIGIN)  # else these weights'
    if rank_zero_only.rank == 0:
        report_new_languages(path, checkpoint, datamodule, tokenizer)
    state = {
        key[len("model.") :]: value
        for key, value in checkpoint["state_dict"].items()
        if key.startswith("model.")
    }
    model.model.load_state_dict(state)
    step = checkpoint.get("global_step")
    rank_zero_info(
        f"initialised the model from the {weights_name(checkpoint)} of {path}"
        + (f" (trained {step} steps)" if step is not None else "")
        + "; optimizer, learning-rate schedule, step count and data position start afresh"
    )


def untrained_or_none(ckpt_path: str | Path | None) -> bool:
    """Whether ``ckpt_path`` names no checkpoint file: not given, or ``untrained``."""
    return not ckpt_path or str(ckpt_path) == UNTRAINED


def set_checkpoint_dirs(config, folder: str) -> None:
    """``--checkpoint_dir``: make ``folder`` the ``dirpath`` of every ``ModelCheckpoint``.

    Raises:
        ValueError: if the config has no ``ModelCheckpoint`` callback.
    """
    targets = [init_args for init_args in callback_init_args(config) if init_args is not None]
    if not targets:
        raise ValueError(
            f"--checkpoint_dir {folder}: the config has no ModelCheckpoint in trainer.callbacks "
            "whose folder it could set"
        )
    for init_args in targets:
        init_args["dirpath"] = folder


def checkpoint_dirs(config) -> list[Path]:
    """The ``dirpath`` of each configured ``ModelCheckpoint`` callback."""
    return [
        Path(init_args["dirpath"])
        for init_args in callback_init_args(config)
        if hasattr(init_args, "get") and init_args.get("dirpath")
    ]


def warn_resuming_behind_last(ckpt_path: str | Path, step: int | None) -> None:
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


DATA_LINKED = ("vocab_size", "max_positions")
"""Model settings given by ``data.*`` settings (``link_arguments``), which an evaluated
checkpoint's values replace too."""

#: The model settings' defaults (TransformerConfig's; the data module's for DATA_LINKED).
_DEFAULTS = {
    **{f.name: f.default for f in dataclasses.fields(TransformerConfig)},
    **{
        key: inspect.signature(TranslationDataModule).parameters[key].default for key in DATA_LINKED
    },
}


def other_architecture(saved: dict, model: dict | Namespace) -> list[str]:
    """The settings in which the model settings ``saved`` in a checkpoint differ from the
    config's ``model`` settings (:func:`~seq2seq.checkpoint.format.differing_settings`), each
    as ``model.KEY SAVED (config VALUE)``, ``data.KEY`` for those the data settings give
    (:data:`DATA_LINKED`)."""
    return [
        f"{'data' if key in DATA_LINKED else 'model'}.{key} {cli_value(value)} "
        f"(config {cli_value(wanted)})"
        for key, value, wanted in differing_settings(saved, model)
    ]


def warn_other_architecture(
    subcommand: str, ckpt_path: str | Path, saved: dict, model: dict | Namespace
) -> None:
    """Warns on stderr (one line, global rank 0 only) when the model settings saved in the
    checkpoint ``ckpt_path`` differ from the config's ``model`` settings
    (:func:`other_architecture`), which ``subcommand`` (``validate``, ``test``, ``predict`` or
    ``fit --init_from``) replaces by the checkpoint's."""
    differing = other_architecture(saved, model)
    if differing and rank_zero_only.rank == 0:
        print(
            f"seq2seq: warning: {ckpt_path} was trained with other model settings than the "
            f"config: {', '.join(differing)}; {subcommand} uses the checkpoint's",
            file=sys.stderr,
        )
