"""What :class:`~seq2seq.module.TranslationModule` reads, checks and adjusts in a checkpoint
(:mod:`.format`) before Lightning restores it (``on_load_checkpoint``): the architecture, the
SentencePiece model (also the data module's, at ``setup``), with an exponential moving average
which weights train on, and in a resumed ``fit`` the optimizer and schedule (also checked by
the command line before any data is prepared)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.optim.lr_scheduler import ReduceLROnPlateau

from seq2seq.checkpoint.format import (
    CHECKPOINT_KEY,
    EMA_KEY,
    OPTIMIZER_KEY,
    SCHEDULE_KEY,
    TRAINING_WEIGHTS,
    class_name,
    differing_settings,
    model_config,
    tokenizer_blob,
)
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.vocabulary import tokenizer_from_bytes

__all__ = [
    "changed_settings",
    "check_model_settings",
    "check_resumed_optimizer",
    "check_resumed_plateau_mode",
    "check_resumed_schedule",
    "check_resumed_training",
    "check_same_tokenizer",
    "check_vocab_size",
    "tokenizer_from_checkpoint",
    "train_on_training_weights",
]


def tokenizer_from_checkpoint(checkpoint: Mapping[str, Any]) -> Tokenizer | None:
    """The SentencePiece model stored in ``checkpoint["seq2seq"]["tokenizer"]`` (a uint8
    tensor of the serialized model), or ``None`` if the checkpoint carries none."""
    blob = tokenizer_blob(checkpoint)
    return None if blob is None else tokenizer_from_bytes(blob)


def check_model_settings(checkpoint: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` naming each structural setting in which ``config`` (the module's
    architecture) differs from the checkpoint's (:func:`~.format.differing_settings`)."""
    differing = [
        f"{key}: checkpoint {old!r} vs config {new!r}"
        for key, old, new in differing_settings(model_config(checkpoint), config)
    ]
    if differing:
        raise ValueError("checkpoint was built with other model settings: " + "; ".join(differing))


def check_vocab_size(tokenizer: Tokenizer, vocab_size: int, where: str) -> None:
    """Raises ``ValueError`` if ``tokenizer`` (called ``where`` in the message) has other than
    the module's ``vocab_size`` pieces."""
    if tokenizer.vocab_size != vocab_size:
        raise ValueError(
            f"{where} has {tokenizer.vocab_size} pieces but model.vocab_size is "
            f"{vocab_size}: set data.vocab_size/model.vocab_size to the "
            "size the tokenizer was trained with, or retrain the tokenizer"
        )


def check_same_tokenizer(carried: Tokenizer, attached: Tokenizer | None) -> None:
    """Raises ``ValueError`` if the checkpoint's SentencePiece model (``carried``) is not
    byte-for-byte the data module's (``attached``, ``None``: none to compare with)."""
    if attached is not None and attached.to_bytes() != carried.to_bytes():
        raise ValueError(
            f"the checkpoint's SentencePiece model differs from the data module's "
            f"({attached.name}) although both have {carried.vocab_size} pieces: "
            "the checkpoint was trained on other text or with other data.* tokenizer "
            "settings; use the data settings it was trained with"
        )


def train_on_training_weights(checkpoint: dict[str, Any], callbacks: Iterable[Any]) -> None:
    """For a ``fit`` resumed from a checkpoint written with :class:`seq2seq.callbacks.EMA`:
    puts its :data:`~.format.TRAINING_WEIGHTS` in ``state_dict`` and the average under
    :data:`~.format.EMA_KEY`, which the callback takes back; warns, if no EMA is among the
    trainer's ``callbacks``, that the average is dropped."""
    ema = checkpoint.setdefault(EMA_KEY, {})
    ema["state_dict"] = checkpoint["state_dict"]
    checkpoint["state_dict"] = checkpoint.pop(TRAINING_WEIGHTS)
    if not any(type(c).__name__ == "EMA" for c in callbacks):
        rank_zero_warn(
            "the checkpoint holds an exponential moving average of the weights, but "
            "no seq2seq.callbacks.EMA is configured: training goes on from its "
            "training weights and the average is dropped"
        )


#: Schedule classes whose state is another's: Lightning's plateau class is torch's with a
#: ``monitor`` of its own.
_SAME_STATE = {
    "lightning.pytorch.cli.ReduceLROnPlateau": "torch.optim.lr_scheduler.ReduceLROnPlateau"
}


def check_resumed_schedule(checkpoint: Mapping[str, Any], name: str | None) -> None:
    """Raises ``ValueError`` if the run of ``checkpoint`` (a Lightning checkpoint that ``fit``
    resumes) trained with another schedule than the class ``name`` (:func:`~.format.class_name`):
    Lightning would load one schedule's state into the other, or give a new schedule none (its
    warm-up would start again); torch's and Lightning's ``ReduceLROnPlateau`` count as one. For
    checkpoints written before the class was recorded, only whether the run had a schedule is
    compared."""
    recorded = checkpoint.get(CHECKPOINT_KEY) or {}
    if SCHEDULE_KEY in recorded:
        saved = recorded[SCHEDULE_KEY]
        if _SAME_STATE.get(saved, saved) == _SAME_STATE.get(name, name):
            return
    else:
        had = bool(checkpoint.get("lr_schedulers"))
        if had == (name is not None):
            return
        saved = "a schedule" if had else None
    raise ValueError(
        f"the checkpoint was trained with lr_scheduler {saved or 'null (a constant rate)'}, "
        f"this run's is {name or 'null (a constant rate)'}: a resumed run continues its "
        "schedule's state, which another schedule cannot take; resume with the schedule it "
        "was trained with (model.lr_scheduler), or start a new run from its weights "
        "(--init_from)"
    )


def check_resumed_plateau_mode(checkpoint: Mapping[str, Any], mode: str) -> None:
    """Raises ``ValueError`` if the ``ReduceLROnPlateau`` of ``checkpoint``'s run had another
    ``mode`` than ``mode``: the checkpoint's mode and best value would be restored while a
    monitor left to the mode followed the configured one (the rate falling as it improves)."""
    saved = ((checkpoint.get("lr_schedulers") or [{}])[0] or {}).get("mode")
    if saved not in (None, mode):
        raise ValueError(
            f"the checkpoint's lr_scheduler ReduceLROnPlateau has mode {saved}, this run's "
            f"{mode}: a resumed run keeps the mode and best value of its schedule; resume with "
            f"mode {saved} (model.lr_scheduler.init_args.mode), or start a new run from its "
            "weights (--init_from)"
        )


def check_resumed_optimizer(checkpoint: Mapping[str, Any], name: str) -> None:
    """Raises ``ValueError`` if the run of ``checkpoint`` trained with another optimizer class
    than ``name`` (:func:`~.format.class_name`), whose state this one cannot take."""
    saved = (checkpoint.get(CHECKPOINT_KEY) or {}).get(OPTIMIZER_KEY, name)
    if saved != name:
        raise ValueError(
            f"the checkpoint was trained with optimizer {saved}, this run's is {name}: a "
            "resumed run continues the optimizer's state, which another optimizer cannot take; "
            "resume with the optimizer it was trained with (model.optimizer), or start a new "
            "run from its weights (--init_from)"
        )


#: Entries of a schedule's state dict that are its state, not its settings; and the monitor
#: of Lightning's plateau class, which the resumed run steps on as configured.
_SCHEDULE_STATE = frozenset(
    {"base_lrs", "last_epoch", "_step_count", "_is_initial", "_get_lr_called_within_step",
     "_last_lr", "lr_lambdas", "best", "num_bad_epochs", "cooldown_counter", "mode_worse",
     "monitor"}
)  # fmt: skip
#: Optimizer settings that choose an implementation, not the arithmetic.
_IMPLEMENTATION = frozenset({"foreach", "fused", "capturable", "differentiable"})


def changed_settings(
    checkpoint: Mapping[str, Any], optimizer: torch.optim.Optimizer, schedule: object | None
) -> list[str]:
    """``"name SAVED (configured NEW)"`` for each setting of the optimizer (``lr``, ``betas``,
    ``weight_decay`` ...) and of the schedule (``warmup_steps``, ``patience`` ...) in which
    ``optimizer`` and ``schedule``, a resumed run's (built over a stand-in parameter, with
    the checkpoint's classes), differ from the run of ``checkpoint``: Lightning restores the
    checkpoint's, which the resumed run trains with."""

    def plain(value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    changes = []
    groups = [s.get("param_groups") or [{}] for s in checkpoint.get("optimizer_states") or []]
    saved = groups[0][0] if groups else {}
    for key, value in optimizer.defaults.items():
        if key == "lr":  # the schedule's base rate; without a schedule the rate itself
            old = saved.get("initial_lr", saved.get("lr") if schedule is None else None)
        else:
            old = None if key in _IMPLEMENTATION else saved.get(key)
        if old is not None and plain(old) != plain(value):
            changes.append(f"{key} {plain(old)} (configured {plain(value)})")
    saved_schedules = checkpoint.get("lr_schedulers") or [{}]
    if schedule is not None:
        for key, value in schedule.state_dict().items():
            old = saved_schedules[0].get(key)
            # A configured None (CosineLR's max_steps) is set from the run, not a setting.
            if key in _SCHEDULE_STATE or old is None or value is None:
                continue
            if plain(old) != plain(value):
                changes.append(f"{key} {plain(old)} (configured {plain(value)})")
    return changes


def check_resumed_training(
    checkpoint: Mapping[str, Any], optimizer: torch.optim.Optimizer, schedule: object | None
) -> None:
    """Refuses a resume with another optimizer or schedule class than the run of
    ``checkpoint`` (:func:`check_resumed_optimizer`, :func:`check_resumed_schedule`) and warns
    of the settings that the run keeps from it instead of the configured ones
    (:func:`changed_settings`); ``optimizer`` and ``schedule`` as configured, built over a
    stand-in parameter.

    Raises:
        ValueError: for another class, or another ``ReduceLROnPlateau`` mode.
    """
    check_resumed_optimizer(checkpoint, class_name(optimizer))
    check_resumed_schedule(checkpoint, class_name(schedule))
    if isinstance(schedule, ReduceLROnPlateau):
        check_resumed_plateau_mode(checkpoint, schedule.mode)
    changes = changed_settings(checkpoint, optimizer, schedule)
    if changes:
        rank_zero_warn(
            "resuming keeps the checkpoint's optimizer and schedule settings, not the "
            f"configured ones: {', '.join(changes)}; to train on with other ones, start a new "
            "run from its weights (--init_from)"
        )
