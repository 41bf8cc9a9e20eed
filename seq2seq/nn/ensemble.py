"""Ensembles of Transformers at decoding time: the per-step log-probabilities of several models.

An :class:`Ensemble` offers what the searches (:mod:`seq2seq.nn.rules`) use of a
:class:`~seq2seq.nn.Transformer` (``encode``, ``decode``, ``new_cache``, ``vocab_size``,
``pad_id``, ``max_positions``), so they run on it unchanged. Shapes follow the legend in
:mod:`seq2seq.nn.attention`.

The ensemble's next-token distribution is the normalised geometric mean of the models'
distributions: :meth:`Ensemble.decode` returns the mean over models of each model's
log-softmax, and the search's own log-softmax renormalises it,
``log p(y) = mean_m log p_m(y) - log sum_y' exp(mean_m log p_m(y'))``. This is what
OpenNMT-py's (and Eole's) ensemble decoder does by default (``onmt/decoders/ensemble.py``,
``EnsembleGenerator``: the mean of the models' log-probabilities; ``-avg_raw_probs`` switches
to probabilities). fairseq's ``EnsembleModel.forward_decoder`` takes the log of the averaged
probabilities instead (``logsumexp_m(log p_m) - log M``, an arithmetic mean), which favours a
token that any one model rates highly, where the geometric mean favours those every model
accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from seq2seq.nn.kv_cache import DecoderCache
from seq2seq.nn.layers import check_length
from seq2seq.nn.transformer import Transformer

__all__ = ["Ensemble", "EnsembleCache"]


class EnsembleCache:
    """Incremental-decoding state of an :class:`Ensemble`: one
    :class:`~seq2seq.nn.DecoderCache` per model, reordered and expanded together.

    Args:
        caches: one cache per model, in the ensemble's order.

    Attributes:
        caches: as given.
    """

    def __init__(self, caches: Sequence[DecoderCache]) -> None:
        self.caches = list(caches)

    @property
    def length(self) -> int:
        """Number of target positions already decoded (the same in every model's cache)."""
        return self.caches[0].length

    def reorder(self, index: Tensor, include_cross: bool = False) -> None:
        """:meth:`DecoderCache.reorder` of every model's cache with the same ``(B',)`` long
        ``index`` (row ``i`` becomes old row ``index[i]``)."""
        for cache in self.caches:
            cache.reorder(index, include_cross)

    def expand_beams(self, beam: int) -> None:
        """:meth:`DecoderCache.expand_beams` of every model's cache: ``B`` rows become
        ``B * beam``, sentence-major."""
        for cache in self.caches:
            cache.expand_beams(beam)


class Ensemble(nn.Module):
    """Several :class:`~seq2seq.nn.Transformer` models decoding as one.

    The models may differ in architecture (layers, width, heads, Pre-/Post-LN, positions), but
    must share the vocabulary: the same ``vocab_size`` and padding id. (The BOS and EOS ids are
    the tokenizer's, given to the search; the models must have been trained with one
    SentencePiece model, which the caller checks: :meth:`seq2seq.translator.Translator.
    from_checkpoint` compares the models that checkpoints carry.) Each model encodes the source
    and keeps its own cache; :meth:`decode` averages their float32 log-probabilities (see the
    module docstring: a normalised geometric mean once the search renormalises, as
    OpenNMT-py's ensemble decoder; fairseq averages probabilities instead).

    Args:
        models: two or more Transformers (one also works, and decodes as that model with its
            logits replaced by their log-softmax).

    Attributes:
        models: the Transformers, an ``nn.ModuleList``.
        vocab_size: the shared vocabulary size ``V``.
        pad_id: the shared padding id (never generated).
        max_positions: the smallest ``max_positions`` of the models: the longest source and
            target every model can hold.

    Raises:
        ValueError: if ``models`` is empty, or a model's ``vocab_size`` or ``pad_id`` differs
            from the first model's (naming the model's 0-based index and both values).
    """

    def __init__(self, models: Sequence[Transformer]) -> None:
        super().__init__()
        models = list(models)
        if not models:
            raise ValueError("an Ensemble needs at least one model")
        first = models[0]
        for i, model in enumerate(models[1:], start=1):
            for name in ("vocab_size", "pad_id"):
                if getattr(model, name) != getattr(first, name):
                    raise ValueError(
                        f"ensemble model {i} has {name} {getattr(model, name)}, model 0 has "
                        f"{getattr(first, name)}: the models of an ensemble must share one "
                        "vocabulary"
                    )
        self.models = nn.ModuleList(models)
        self.vocab_size = first.vocab_size
        self.pad_id = first.pad_id
        self.max_positions = min(model.max_positions for model in models)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> list[Tensor]:
        """Encode a batch of source sentences with every model.

        Args:
            src: ``(B, S)`` long token ids (right-padded).
            src_mask: ``(B, 1, 1, S)`` bool, ``True`` at real tokens; ``None`` = no padding.

        Returns:
            One ``(B, S, D_m)`` memory per model (``D_m`` that model's ``d_model``).

        Raises:
            ValueError: if ``S > max_positions`` (the smallest of the models').
        """
        check_length(src.size(1), self.max_positions)
        return [model.encode(src, src_mask) for model in self.models]

    def decode(
        self,
        tgt: Tensor,
        memory: Sequence[Tensor | None] | None,
        src_mask: Tensor | None = None,
        cache: EnsembleCache | None = None,
        process: Callable[[Tensor], Tensor] | None = None,
        output_index: Tensor | None = None,
    ) -> Tensor:
        """Mean next-token log-probabilities of the models for a batch of target prefixes.

        Args:
            tgt: ``(B, T)`` long decoder input, starting with BOS. With a cache: only the new
                step(s), as for :meth:`Transformer.decode`.
            memory: the per-model memories of :meth:`encode` (``None``, or ``None`` entries,
                once the cache holds the cross-attention keys/values).
            src_mask: ``(B, 1, 1, S)`` bool source mask as given to :meth:`encode`.
            cache: from :meth:`new_cache`, updated in place.
            process: maps each model's ``(B, T, V)`` logits to those it decodes with, before
                that model's log-softmax (the searches' repetition penalty, see
                :mod:`seq2seq.nn.rules`); ``None``: the logits as they are.
            output_index: ``(N,)`` long positions of ``(B * T)`` to compute, as for
                :meth:`Transformer.decode` (teacher forcing; then ``(N, V)`` is returned).

        Returns:
            ``(B, T, V)`` float32: ``mean_m log_softmax(logits_m)``. Not normalised itself (its
            ``exp`` sums to at most 1 per position); the searches' log-softmax normalises it.

        Raises:
            ValueError: if the decoded positions would exceed ``max_positions``.
        """
        memories = [None] * len(self.models) if memory is None else list(memory)
        caches = [None] * len(self.models) if cache is None else cache.caches
        offset = 0 if cache is None else cache.length
        check_length(offset + tgt.size(1), self.max_positions)
        total: Tensor | None = None
        for model, mem, model_cache in zip(self.models, memories, caches, strict=True):
            logits = model.decode(tgt, mem, src_mask, model_cache, output_index)
            if process is not None:
                logits = process(logits)
            # float32 whatever the computation's dtype, as the searches' own log-softmax.
            log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
            total = log_probs if total is None else total.add_(log_probs)
        return total.div_(len(self.models))

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        output_index: Tensor | None = None,
    ) -> Tensor:
        """Teacher-forced ``decode(tgt, encode(src, src_mask), src_mask)``: ``(B, T, V)``
        float32 mean log-probabilities of ``(B, S)`` sources and ``(B, T)`` decoder inputs
        (``(N, V)`` at ``output_index``, as :meth:`Transformer.forward`)."""
        memory = self.encode(src, src_mask)
        return self.decode(tgt, memory, src_mask, output_index=output_index)

    def new_cache(self, capacity: int = 64) -> EnsembleCache:
        """Empty incremental-decoding state for :meth:`decode`: one
        :meth:`Transformer.new_cache` per model, ``capacity`` target positions preallocated."""
        return EnsembleCache([model.new_cache(capacity) for model in self.models])
