"""Checkpoints: the format (:mod:`.format`, a leaf), loading and averaging (:mod:`.load`,
no Lightning), the models they hold built for translation, alone or as an ensemble
(:mod:`.models`, imported where used), the checks of a checkpoint loaded into a
``TranslationModule`` (:mod:`.restore`) and the training side (:mod:`.training`: atomic
writing for Lightning, random generator and loop states for an exact resume).

The training-side names are imported on first use, so that ``import seq2seq.checkpoint``
(e.g. by :class:`~seq2seq.translator.Translator`) does not import Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

from seq2seq.checkpoint.format import (
    AVERAGED_FROM,
    CHECKPOINT_KEY,
    LIGHTNING_VERSION,
    NON_STRUCTURAL,
    differing_settings,
    language_pair,
    model_config,
    tokenizer_blob,
    tokenizer_tensor,
)
from seq2seq.checkpoint.load import (
    CheckpointError,
    IncompatibleCheckpointsError,
    UnsafeCheckpointError,
    average_checkpoints,
    check_model_checkpoint,
    check_same_vocabulary,
    load_checkpoint,
    missing_checkpoint,
    resolve_ckpt_path,
    resume_flags,
)

_TRAINING = {
    "AtomicCheckpointIO",
    "capture_rng_state",
    "keep_cut_epoch_unfinished",
    "restore_rng_state",
    "run_validation_again",
    "settle_validation_progress",
}

__all__ = [
    "AVERAGED_FROM",
    "CHECKPOINT_KEY",
    "LIGHTNING_VERSION",
    "NON_STRUCTURAL",
    "CheckpointError",
    "IncompatibleCheckpointsError",
    "UnsafeCheckpointError",
    "average_checkpoints",
    "check_model_checkpoint",
    "check_same_vocabulary",
    "differing_settings",
    "language_pair",
    "load_checkpoint",
    "missing_checkpoint",
    "model_config",
    "resolve_ckpt_path",
    "resume_flags",
    "tokenizer_blob",
    "tokenizer_tensor",
    *sorted(_TRAINING),
]


def __getattr__(name: str) -> Any:
    # PEP 562: the Lightning-dependent names load seq2seq.checkpoint.training when first asked.
    if name in _TRAINING:
        return getattr(importlib.import_module("seq2seq.checkpoint.training"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
