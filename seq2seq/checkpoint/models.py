"""The models that checkpoint files hold, built for translation: a :class:`CheckpointModel`
(a Transformer with its tokenizer and :class:`~seq2seq.nn.DecodingConfig`), and the checks that
several checkpoints can decode together as an :class:`~seq2seq.nn.Ensemble`
(:meth:`seq2seq.translator.Translator.from_checkpoint`).

No Lightning; the tokenizer is SentencePiece's (:mod:`seq2seq.data.tokenizer`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from seq2seq.checkpoint.format import (
    CHECKPOINT_KEY,
    IMPORTED_FROM,
    differing_settings,
    language_pairs,
    model_config,
    tokenizer_blob,
)
from seq2seq.checkpoint.load import (
    IncompatibleCheckpointsError,
    check_model_checkpoint,
    check_same_vocabulary,
    load_checkpoint,
    missing_checkpoint,
    weights_digest,
)
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.vocabulary import tokenizer_from_bytes
from seq2seq.nn import DecodingConfig, Transformer, TransformerConfig
from seq2seq.text_decoding import apply_overrides, decode_batch

__all__ = ["CheckpointModel", "check_ensemble_paths", "load_model"]


class CheckpointModel:
    """A checkpoint's :class:`~seq2seq.nn.Transformer` (or an Ensemble), its tokenizer and its
    :class:`~seq2seq.nn.DecodingConfig`: what translating needs, without the training module.

    It offers what decoding code reads of a ``TranslationModule`` (``model``, ``tokenizer``,
    ``decoding``, ``model_config``, ``device``, :meth:`translate_batch`).

    Args:
        model: the Transformer.
        tokenizer: its SentencePiece model.
        decoding: the decoding settings (``None``: the defaults).
        pairs: the ``(src, tgt)`` language pairs it was trained on (``None``: not known, as
            for an imported model), for the zero-shot warning of
            :meth:`seq2seq.translator.Translator.translate`.
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        decoding: DecodingConfig | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.decoding = decoding or DecodingConfig()
        self.pairs = None if pairs is None else tuple(pairs)

    @property
    def model_config(self) -> dict[str, Any]:
        """The architecture, :meth:`TransformerConfig.to_dict` of the model's config."""
        return self.model.config.to_dict()

    @property
    def device(self) -> torch.device:
        """Where the weights are."""
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> CheckpointModel:
        self.model.to(device)
        return self

    def eval(self) -> CheckpointModel:
        self.model.eval()
        return self

    def translate_batch(
        self, batch: Mapping[str, Any], beam_size: int | None = None, n_best: int = 1, **decoding
    ) -> list[list[tuple[str, float]]]:
        """:func:`~seq2seq.text_decoding.decode_batch` with :attr:`decoding`, overridden by
        this call's ``beam_size`` and ``decoding`` (DecodingConfig fields).

        Raises:
            ValueError: as :func:`~seq2seq.text_decoding.apply_overrides` and ``decode_batch``.
        """
        config = apply_overrides(self.decoding, {"beam_size": beam_size, **decoding})
        return decode_batch(self.model, self.tokenizer, batch, config, n_best)


def check_ensemble_weights(paths: Sequence[str | Path], models: Sequence[CheckpointModel]) -> None:
    """Refuse two checkpoints of an ensemble that hold the same weights (``last.ckpt`` beside
    the checkpoint of its step), as :func:`~seq2seq.checkpoint.load.average_checkpoints` does.

    Raises:
        IncompatibleCheckpointsError: naming both files.
    """
    seen: dict[str, str | Path] = {}
    for path, loaded in zip(paths, models, strict=True):
        digest = weights_digest(loaded.model.state_dict())
        if digest in seen:
            raise IncompatibleCheckpointsError(
                f"{path} holds the same weights as {seen[digest]}: the ensemble would weigh "
                "them double; leave one out"
            )
        seen[digest] = path


def check_ensemble_paths(paths: Sequence[str | Path]) -> None:
    """Refuse missing files, folders and files named twice among the checkpoints of an
    ensemble, before any of them is read.

    Raises:
        FileNotFoundError: naming a file that does not exist.
        ValueError: naming the folder, or the file (both names when two name one file).
    """
    for i, path in enumerate(paths):
        if not Path(path).exists():
            raise FileNotFoundError(missing_checkpoint(path))
        if Path(path).is_dir():
            raise ValueError(
                f"{path} is a folder (an exported CTranslate2 model?): an ensemble takes "
                "checkpoint files (.ckpt); a CTranslate2 folder runs alone"
            )
        for earlier in paths[:i]:
            if os.path.samefile(earlier, path):  # both exist: checked in turn above
                what = (
                    f"{path} is named twice"
                    if str(earlier) == str(path)
                    else f"{earlier} and {path} are the same file"
                )
                raise ValueError(
                    f"{what} in the ensemble; give each checkpoint once (a model taken twice "
                    "would weigh double)"
                )


def load_model(
    path: str | Path,
    decoding: Mapping[str, Any],
    reference: tuple[str | Path, dict[str, Any]] | None = None,
) -> tuple[CheckpointModel, dict[str, Any]]:
    """The :class:`CheckpointModel` of a checkpoint file: its Transformer with its weights, its
    tokenizer, and its decoding settings (nested or, in older checkpoints, flat
    hyperparameters: :meth:`~seq2seq.nn.DecodingConfig.from_dict`) overridden by ``decoding``.

    Args:
        path: the checkpoint file.
        decoding: the caller's decoding fields and architecture fields (see
            :meth:`seq2seq.translator.Translator.from_checkpoint`).
        reference: ``(file, identity)`` of the first checkpoint of an ensemble: this one
            must carry its SentencePiece model and language pair
            (:func:`~seq2seq.checkpoint.check_same_vocabulary`), checked before the model is
            built.

    Returns:
        ``(model, identity)``; ``identity`` holds the checkpoint's tokenizer and language pair
        alone (not its weights), as a ``reference``.

    Raises:
        As :meth:`seq2seq.translator.Translator.from_checkpoint`.
    """
    checkpoint = load_checkpoint(path)
    check_model_checkpoint(checkpoint, path)
    extra = checkpoint.get(CHECKPOINT_KEY, {})
    identity = {
        CHECKPOINT_KEY: {"tokenizer": extra.get("tokenizer")},
        "datamodule_hyper_parameters": checkpoint.get("datamodule_hyper_parameters"),
    }
    if reference is not None:
        check_same_vocabulary(*reference, path, identity, "ensemble")
    blob = tokenizer_blob(checkpoint)
    if "model_config" not in extra or blob is None:
        raise ValueError(
            f"{path} carries no model configuration or tokenizer; it was not written by "
            "seq2seq (or was trained without a tokenizer attached)"
        )
    saved = model_config(checkpoint)
    architecture = set(TransformerConfig.field_names()) | set(saved)
    fields = set(DecodingConfig.field_names())
    unknown = set(decoding) - fields - architecture
    if unknown:
        raise ValueError(f"unknown decoding settings: {sorted(unknown)}")
    # Checked here, in the caller's terms: the model's own check would speak of a config.
    differing = [
        f"{key}: checkpoint {old!r} vs requested {new!r}"
        for key, old, new in differing_settings(saved, decoding)
    ]
    if differing:
        given = ", ".join(f"{key}={decoding[key]!r}" for key in decoding if key in saved)
        raise ValueError(
            f"checkpoint was built with other model settings: {'; '.join(differing)} "
            f"({given} given to from_checkpoint); leave the architecture out, it is the "
            "checkpoint's"
        )
    saved_decoding = DecodingConfig.from_dict(checkpoint.get("hyper_parameters") or {})
    settings = apply_overrides(saved_decoding, {k: v for k, v in decoding.items() if k in fields})
    tokenizer = tokenizer_from_bytes(blob)
    config = TransformerConfig.from_dict(saved)
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(
            f"{path}: its tokenizer has {tokenizer.vocab_size} pieces but its model "
            f"vocab_size is {config.vocab_size}"
        )
    model = Transformer(config)
    prefix = "model."  # TranslationModule keeps the Transformer as its `model`
    state = checkpoint["state_dict"]
    model.load_state_dict({k.removeprefix(prefix): v for k, v in state.items()})
    # An imported model records the languages it was imported with, not what it learned.
    pairs = None if IMPORTED_FROM in extra else language_pairs(checkpoint)
    return CheckpointModel(model, tokenizer, settings, pairs), identity
