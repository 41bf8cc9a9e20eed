"""What :class:`~seq2seq.module.TranslationModule` reads, checks and adjusts in a checkpoint
(:mod:`.format`) before Lightning restores it (``on_load_checkpoint``): the architecture, the
SentencePiece model (also the data module's, at ``setup``) and, with an exponential moving
average, which weights train on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from seq2seq.checkpoint.format import (
    EMA_KEY,
    TRAINING_WEIGHTS,
    differing_settings,
    model_config,
    tokenizer_blob,
)
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.vocabulary import tokenizer_from_bytes

__all__ = [
    "check_model_settings",
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
