"""The checkpoint format of seq2seq: what a checkpoint holds besides Lightning's entries.

A leaf module (it imports nothing else of seq2seq), shared by training, the
:class:`~seq2seq.translator.Translator`, averaging and the exporters. Lightning writes the
weights (``state_dict``), the hyperparameters of the module and data module and the loop
states; seq2seq adds ``checkpoint[CHECKPOINT_KEY]``, a dictionary of:

* ``"model_config"``: the fields of :class:`seq2seq.nn.TransformerConfig`;
* ``"tokenizer"``: the serialized SentencePiece model as a uint8 tensor (optional);
* ``"rng"``: the random generators' states for an exact resume (training only);
* ``"precision"``: the run's ``--trainer.precision`` (training only), which a resume with
  another one is told about;
* ``"log"``: the logger's name and version, and the checkpoint folder, so that a resumed run
  logs into the same folder (a copy of the checkpoints, in another folder, into a new one);
* ``"optimizer"``, ``"lr_scheduler"``: the classes of the run's optimizer and learning-rate
  schedule (training only; ``None``: no schedule), which a resume must configure again
  (:data:`OPTIMIZER_KEY`, :data:`SCHEDULE_KEY`, spelt by :func:`class_name`;
  :func:`seq2seq.checkpoint.restore.check_resumed_training`);
* :data:`IMPORTED_FROM`: in a checkpoint written by ``seq2seq import``, where it came from;
* :data:`INIT_FROM`: in the checkpoints of a run started with ``fit --init_from``, that file;
* :data:`ORIGIN`: the fingerprint of the initial weights the run's weights descend from
  (:func:`weights_origin`), by which ``seq2seq average`` refuses unrelated runs.

The decoding settings are the module's hyperparameter ``"decoding"``, a plain dictionary of
:class:`seq2seq.nn.DecodingConfig`'s fields (flat keys in checkpoints written before it
existed; :meth:`~seq2seq.nn.DecodingConfig.from_dict` reads both).

With an exponential moving average of the weights (:class:`seq2seq.callbacks.EMA`),
``state_dict`` holds the averaged weights, which every reader (``test``, ``translate``,
``average``, ``export``, ``--init_from``) takes, and two more top-level keys hold what a resumed
run needs: :data:`TRAINING_WEIGHTS` (the weights the optimizer trains) and :data:`EMA_KEY` (the
average's settings and number of updates).

The language pair, or the pairs of a multilingual run (``data.pairs``), are the data module's
(``datamodule_hyper_parameters``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "AVERAGED_FROM",
    "checkpoint_label",
    "CHECKPOINT_KEY",
    "EMA_KEY",
    "IMPORTED_FROM",
    "INIT_FROM",
    "LIGHTNING_VERSION",
    "NON_STRUCTURAL",
    "OPTIMIZER_KEY",
    "ORIGIN",
    "SCHEDULE_KEY",
    "TRAINING_WEIGHTS",
    "class_name",
    "differing_settings",
    "language_pair",
    "language_pairs",
    "model_config",
    "pair_names",
    "split_pair",
    "tokenizer_blob",
    "tokenizer_tensor",
    "tensors_digest",
    "weights_name",
    "weights_origin",
]

CHECKPOINT_KEY = "seq2seq"
"""Key of seq2seq's own entries in a checkpoint."""

LIGHTNING_VERSION = "pytorch-lightning_version"
"""Key of the Lightning version in every checkpoint Lightning writes (its ``Trainer`` needs it
to restore one)."""

AVERAGED_FROM = "averaged_from"
"""Key that ``seq2seq average`` writes into its result: the list of averaged files."""


def checkpoint_label(checkpoint: Mapping[str, Any]) -> str | None:
    """``step<N>`` (Lightning's ``global_step``), ``step<N>.avg<K>`` for an average of K
    checkpoints (:data:`AVERAGED_FROM`, N the newest one's step): what names the files of a
    ``validate`` or ``test`` of it; None without a step."""
    step = checkpoint.get("global_step")
    if step is None:
        return None
    averaged = checkpoint.get(AVERAGED_FROM)
    return f"step{step}" + (f".avg{len(averaged)}" if averaged else "")


IMPORTED_FROM = "imported_from"
"""Key of ``checkpoint[CHECKPOINT_KEY]`` that ``seq2seq import`` writes: the source folder and
its Hugging Face class (such a checkpoint has no training state to resume)."""

INIT_FROM = "init_from"
"""Key of ``checkpoint[CHECKPOINT_KEY]`` in the checkpoints of a run started with ``fit
--init_from``: that checkpoint's path. Such a run took its model settings from there, not from
its config, so its resume takes them from its own checkpoint."""

ORIGIN = "origin"
"""Key of ``checkpoint[CHECKPOINT_KEY]``: :func:`weights_origin` of the weights a fresh ``fit``
started from (its random initialisation, or the ``--init_from`` weights where that checkpoint
records no origin of its own; where it does, the run inherits it). Resumes and averages keep
it. Checkpoints of different origins are refused by ``seq2seq average``: independently
initialised networks compute alike with differently ordered hidden units, so the mean of their
parameters is no model (the seed of a run decides its origin: runs of one seed share it)."""

TRAINING_WEIGHTS = "training_state_dict"
"""Key of the training weights in a checkpoint whose ``state_dict`` holds an exponential moving
average of them (written by :class:`seq2seq.callbacks.EMA`; a resumed ``fit`` trains on)."""

EMA_KEY = "ema"
"""Key of the moving average's settings in such a checkpoint: ``decay``, ``start_step``,
``every_n_steps`` and ``updates`` (the number of averaging steps so far)."""

OPTIMIZER_KEY = "optimizer"
"""Key of ``checkpoint[CHECKPOINT_KEY]``: the class of a training run's optimizer
(:func:`class_name`)."""

SCHEDULE_KEY = "lr_scheduler"
"""Key of ``checkpoint[CHECKPOINT_KEY]``: the class of a training run's learning-rate schedule
(:func:`class_name`; ``None``: none), which a resume must configure again."""


def class_name(instance: object | None) -> str | None:
    """``module.QualifiedName`` of a schedule's or optimizer's class (or of a class given
    itself), ``None`` for none: the spelling of :data:`OPTIMIZER_KEY` and :data:`SCHEDULE_KEY`."""
    if instance is None:
        return None
    cls = instance if isinstance(instance, type) else type(instance)
    return f"{cls.__module__}.{cls.__qualname__}"


NON_STRUCTURAL = frozenset({"dropout", "attention_dropout", "activation_dropout"})
"""Model settings that act in training only. Every other field of the model configuration is
structural: it changes the weights' shapes or what they compute, so a checkpoint must be used
with its own value."""


def model_config(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The model configuration a checkpoint was built with (``{}`` if it records none)."""
    return dict((checkpoint.get(CHECKPOINT_KEY) or {}).get("model_config") or {})


def tokenizer_blob(checkpoint: Mapping[str, Any]) -> bytes | None:
    """The serialized SentencePiece model a checkpoint carries, or ``None``."""
    blob = (checkpoint.get(CHECKPOINT_KEY) or {}).get("tokenizer")
    return None if blob is None else blob.cpu().numpy().tobytes()


def tokenizer_tensor(data: bytes) -> torch.Tensor:
    """``data`` (a serialized SentencePiece model) as the uint8 tensor a checkpoint stores:
    a tensor, so that the checkpoint loads with ``torch.load(weights_only=True)``."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def language_pair(checkpoint: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(src_lang, tgt_lang)`` of the data module a checkpoint was trained with (Lightning
    saves its settings as ``datamodule_hyper_parameters``; ``data.pairs`` of one pair counts
    as that pair), or ``None`` if it does not say or was trained on several pairs."""
    pairs = language_pairs(checkpoint)
    return pairs[0] if pairs is not None and len(pairs) == 1 else None


def language_pairs(checkpoint: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """The ``(src, tgt)`` pairs a checkpoint was trained on: its data module's ``pairs``
    (``"de-en"`` strings) where set, else its one ``(src_lang, tgt_lang)``; ``None`` if it
    records neither (a checkpoint of another origin)."""
    settings = checkpoint.get("datamodule_hyper_parameters") or {}
    pairs = settings.get("pairs")
    if pairs:
        return tuple(split_pair(str(pair)) for pair in pairs)
    src, tgt = settings.get("src_lang"), settings.get("tgt_lang")
    return ((src, tgt),) if isinstance(src, str) and isinstance(tgt, str) else None


def split_pair(pair: str) -> tuple[str, str]:
    """``"de-en"`` -> ``("de", "en")``: a ``data.pairs`` entry, cut at its first ``-``."""
    src, _, tgt = pair.partition("-")
    return src, tgt


def pair_names(pairs: Sequence[tuple[str, str]], shown: int = 8) -> str:
    """``de-en, fr-en`` for messages: the first ``shown`` pairs, then ``...`` and the count."""
    names = [f"{src}-{tgt}" for src, tgt in pairs]
    if len(names) <= shown + 2:
        return ", ".join(names)
    return f"{', '.join(names[:shown])}, ... ({len(names)} in all)"


def differing_settings(
    saved: Mapping[str, Any], wanted: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """The structural model settings in which ``wanted`` differs from a checkpoint's.

    Only keys present in both are compared (a checkpoint written before a setting existed
    says nothing about it), and the :data:`NON_STRUCTURAL` dropout rates are left out.

    Args:
        saved: the checkpoint's model configuration (:func:`model_config`).
        wanted: the settings asked for (a config, command-line flags, another checkpoint's).

    Returns:
        ``(name, saved value, wanted value)`` for each differing setting, in ``saved``'s order.
    """
    return [
        (key, value, wanted[key])
        for key, value in saved.items()
        if key in wanted and wanted[key] != value and key not in NON_STRUCTURAL
    ]


def weights_name(checkpoint: Mapping[str, Any]) -> str:
    """Which weights ``checkpoint["state_dict"]`` holds, for messages: ``"EMA weights (decay
    0.999, 1200 updates)"`` or ``"weights"``."""
    ema = checkpoint.get(EMA_KEY)
    if not isinstance(ema, Mapping):
        return "weights"
    return f"EMA weights (decay {ema.get('decay')}, {ema.get('updates')} updates)"


def weights_origin(model: torch.nn.Module) -> str:
    """A fingerprint of ``model``'s parameters: the first 16 hex digits of their
    :func:`tensors_digest`, in ``named_parameters`` order."""
    return tensors_digest(model.named_parameters())[:16]


def tensors_digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The SHA-256 (hex) of the names and bytes (on CPU, in their dtype) of named tensors."""
    digest = hashlib.sha256()
    for name, tensor in named:
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
