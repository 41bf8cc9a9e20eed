"""Key/value caches for incremental decoding.

Shapes follow the legend in :mod:`seq2seq.nn.attention`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["DecoderCache", "KVCache"]


class KVCache:
    """Keys and values of one attention layer, kept between incremental decoding steps.

    Self-attention (``static=False``) writes the new steps' keys/values in place into a buffer
    ``(B, H, capacity, Dh)`` that doubles when full, so a step copies only its own.
    Cross-attention (``static=True``) stores the memory's keys/values at the first call and
    reuses them; one stored row can serve ``group`` consecutive query rows, the beams of a
    sentence (:meth:`DecoderCache.expand_beams`).

    Args:
        static: whether the cache holds cross-attention keys/values.
        capacity: self-attention steps to allocate at first (it grows past them).

    Attributes:
        static: as given.
        length: stored positions ``L`` (target steps for self-attention, ``S`` for cross).
        group: query rows per stored row (cross-attention; 1 = one to one).
    """

    def __init__(self, static: bool, capacity: int = 64) -> None:
        self.static = static
        self.capacity = max(int(capacity), 1)
        self.length = 0
        self.group = 1
        self._k: Tensor | None = None  # (B, H, capacity, Dh); static: (B, H, S, Dh)
        self._v: Tensor | None = None

    @property
    def is_empty(self) -> bool:
        """Whether nothing has been stored yet."""
        return self._k is None

    @property
    def rows(self) -> int:
        """Stored batch rows ``B`` (0 when empty)."""
        return 0 if self._k is None else self._k.size(0)

    @property
    def keys(self) -> Tensor:
        """``(B, H, L, Dh)`` stored keys (a view)."""
        assert self._k is not None, "empty cache"
        return self._k[:, :, : self.length]

    @property
    def values(self) -> Tensor:
        """``(B, H, L, Dh)`` stored values (a view)."""
        assert self._v is not None, "empty cache"
        return self._v[:, :, : self.length]

    def set_static(self, k: Tensor, v: Tensor) -> None:
        """Store cross-attention keys and values ``(B, H, S, Dh)``, contiguous: every step's
        products then read them in place instead of copying the projection's strided view."""
        self._k, self._v, self.length = k.contiguous(), v.contiguous(), k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the ``(B, H, t, Dh)`` keys/values of ``t`` new steps; returns all stored ones,
        ``(B, H, L + t, Dh)`` each."""
        start, end = self.length, self.length + k.size(2)
        if self._k is None or end > self._k.size(2):
            size = max(self.capacity, end, 2 * (0 if self._k is None else self._k.size(2)))
            b, h, _, dh = k.shape
            new_k, new_v = (k.new_empty(b, h, size, dh) for _ in range(2))
            if start:
                new_k[:, :, :start], new_v[:, :, :start] = self.keys, self.values
            self._k, self._v = new_k, new_v
        self._k[:, :, start:end], self._v[:, :, start:end] = k, v
        self.length = end
        return self.keys, self.values

    def reorder(self, index: Tensor) -> None:
        """Select batch rows: row ``i`` becomes old row ``index[i]`` (``(B',)`` long)."""
        if self._k is not None:
            self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)


class DecoderCache:
    """Incremental-decoding state of a whole decoder: one self- and one cross-attention
    :class:`KVCache` per layer. Cross-attention keys/values depend on the source only, so they
    stay one row per sentence, shared by its beams (:meth:`expand_beams`).

    Args:
        n_layers: number of decoder layers.
        capacity: target positions to allocate at first in each self-attention cache.
        self_attention: the class of the self-attention caches.

    Attributes:
        layers: ``(self_attention_cache, cross_attention_cache)`` per layer.
        step_plan: what :func:`seq2seq.nn.step.decoder_step` keeps for the search (the
            decoder's weights, looked up at its first step, and the source mask's additive
            bias; ``None`` before), opaque here.
    """

    def __init__(
        self, n_layers: int, capacity: int = 64, self_attention: type[KVCache] = KVCache
    ) -> None:
        self.layers = [(self_attention(False, capacity), KVCache(True)) for _ in range(n_layers)]
        self.step_plan: Any = None  # seq2seq.nn.step._StepPlan

    @property
    def length(self) -> int:
        """Number of target positions already decoded."""
        return self.layers[0][0].length if self.layers else 0

    def reorder(self, index: Tensor, include_cross: bool = False) -> None:
        """Select batch rows of every cache: row ``i`` becomes old row ``index[i]``.

        Args:
            index: ``(B',)`` long indices into the current batch.
            include_cross: also select the cross-attention keys/values (needed whenever the
                new batch holds other sentences, not just other beams). After
                :meth:`expand_beams`, each group of ``beam`` new rows must come from one
                sentence's group of old rows; the sentence of each group is selected.
        """
        for self_kv, cross_kv in self.layers:
            self_kv.reorder(index)
            if include_cross:
                g = cross_kv.group
                cross_kv.reorder(index if g == 1 else index[::g] // g)

    def expand_beams(self, beam: int) -> None:
        """Turn ``B`` rows (one per sentence) into ``B * beam`` rows, sentence-major.

        Self-attention caches copy each row ``beam`` times; cross-attention caches keep one row
        per sentence and serve its ``beam`` query rows together (``KVCache.group``).
        """
        for self_kv, cross_kv in self.layers:
            if self_kv.rows:
                rows = torch.arange(self_kv.rows, device=self_kv.keys.device)
                self_kv.reorder(rows.repeat_interleave(beam))
            cross_kv.group *= beam
