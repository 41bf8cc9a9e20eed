"""The time-major self-attention cache of the ``cache`` trick of :mod:`seq2seq.nn.fast`
(``fast.enabled(False, "cache")`` switches it off); its plain counterpart is the batch-major
:class:`~seq2seq.nn.kv_cache.KVCache`, whose shapes and methods it keeps."""

from __future__ import annotations

import torch
from torch import Tensor

from seq2seq.nn.kv_cache import KVCache

__all__ = ["TimeMajorKVCache"]


class TimeMajorKVCache(KVCache):
    """A self-attention :class:`~seq2seq.nn.kv_cache.KVCache` stored time-major,
    ``(capacity, B, H, Dh)``, which the searches reorder cheaply.

    The keys of the steps so far are one contiguous block, so a reorder copies just that prefix
    (into a spare buffer kept from the previous reorder, then the two swap) and, when fewer than
    half of the rows move (beams staying in their parent's row,
    :func:`~seq2seq.nn.fast.slots_in_place`), only the rows that move. A batch-major buffer
    copies every row's whole capacity instead.
    """

    def __init__(self, static: bool = False, capacity: int = 64) -> None:
        if static:  # set_static's batch-major keys would be read as time-major
            raise ValueError("TimeMajorKVCache holds self-attention keys only (static=False)")
        super().__init__(False, capacity)
        self._spare: tuple[Tensor, Tensor] | None = None

    @property
    def rows(self) -> int:
        return 0 if self._k is None else self._k.size(1)

    @property
    def keys(self) -> Tensor:
        assert self._k is not None, "empty cache"
        return self._k[: self.length].permute(1, 2, 0, 3)

    @property
    def values(self) -> Tensor:
        assert self._v is not None, "empty cache"
        return self._v[: self.length].permute(1, 2, 0, 3)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start, end = self.length, self.length + k.size(2)
        if self._k is None or end > self._k.size(0):
            size = max(self.capacity, end, 2 * (0 if self._k is None else self._k.size(0)))
            b, h, _, dh = k.shape
            new_k, new_v = (k.new_empty(size, b, h, dh) for _ in range(2))
            if start:
                new_k[:start], new_v[:start] = self._k[:start], self._v[:start]
            self._k, self._v, self._spare = new_k, new_v, None
        self._k[start:end] = k.permute(2, 0, 1, 3)
        self._v[start:end] = v.permute(2, 0, 1, 3)
        self.length = end
        return self.keys, self.values

    def reorder(self, index: Tensor) -> None:
        if self._k is None:
            return
        if self._k.requires_grad:  # differentiable (out= does not support autograd)
            self._k, self._v = self._k.index_select(1, index), self._v.index_select(1, index)
            return
        n, rows = self.length, index.numel()
        if rows == self.rows:
            moved = (index != torch.arange(rows, device=index.device)).nonzero().squeeze(1)
            if 2 * moved.numel() < rows:  # copy the rows that change only
                sources = index[moved]
                for buf in (self._k[:n], self._v[:n]):
                    buf.index_copy_(1, moved, buf.index_select(1, sources))
                return
        cap, _, h, dh = self._k.shape
        if self._spare is None or self._spare[0].shape != (cap, rows, h, dh):
            self._spare = (self._k.new_empty(cap, rows, h, dh), self._v.new_empty(cap, rows, h, dh))
        spare_k, spare_v = self._spare
        torch.index_select(self._k[:n], 1, index, out=spare_k[:n])
        torch.index_select(self._v[:n], 1, index, out=spare_v[:n])
        self._spare = (self._k, self._v)
        self._k, self._v = spare_k, spare_v
