"""The decoding caches of three tricks of :mod:`seq2seq.nn.fast`, switched there: ``cache``
(a time-major self-attention cache, :class:`TimeMajorKVCache`), ``slots`` (beams kept in their
parent's row, :func:`slots_in_place`) and ``compact`` (rows that stay take the places of finished
ones, :func:`survivor_rows`, :class:`CompactKVCache`). Their plain counterparts are
:class:`~seq2seq.nn.kv_cache.KVCache` and the rows in order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seq2seq.nn import fast
from seq2seq.nn.kv_cache import KVCache

__all__ = [
    "CompactKVCache",
    "TimeMajorKVCache",
    "cross_attention_cache",
    "self_attention_cache",
    "slots_in_place",
    "survivor_rows",
]


class TimeMajorKVCache(KVCache):
    """A self-attention :class:`~seq2seq.nn.kv_cache.KVCache` stored time-major,
    ``(capacity, B, H, Dh)``, that beam search reorders cheaply.

    The keys of the steps so far are one contiguous block, so a reorder copies just that prefix
    (into a spare buffer kept from the previous reorder, then the two swap) and, when fewer than
    half of the rows move (beams staying in their parent's row, :func:`slots_in_place`; rows
    leaving, :func:`survivor_rows`), only the rows that move. A batch-major buffer copies every
    row's whole capacity instead.
    """

    def __init__(self, static: bool = False, capacity: int = 64) -> None:
        super().__init__(static, capacity)
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
        n, rows = self.length, index.numel()
        if (rows == self.rows or fast.is_enabled("compact")) and _copy_moved(
            (self._k[:n], self._v[:n]), 1, index
        ):
            self._k, self._v = self._k[:, :rows], self._v[:, :rows]
            return
        if self._k.requires_grad:  # differentiable (out= does not support autograd)
            self._k, self._v = self._k.index_select(1, index), self._v.index_select(1, index)
            return
        cap, _, h, dh = self._k.shape
        if self._spare is None or self._spare[0].shape != (cap, rows, h, dh):
            self._spare = (self._k.new_empty(cap, rows, h, dh), self._v.new_empty(cap, rows, h, dh))
        spare_k, spare_v = self._spare
        torch.index_select(self._k[:n], 1, index, out=spare_k[:n])
        torch.index_select(self._v[:n], 1, index, out=spare_v[:n])
        self._spare = (self._k, self._v)
        self._k, self._v = spare_k, spare_v


class CompactKVCache(KVCache):
    """A cross-attention :class:`~seq2seq.nn.kv_cache.KVCache` from which finished sentences
    leave by moving only the rows that change (:func:`survivor_rows`), not by copying all."""

    def reorder(self, index: Tensor) -> None:
        if self._k is not None and _copy_moved((self._k, self._v), 0, index):
            self._k, self._v = self._k[: index.numel()], self._v[: index.numel()]
        else:
            super().reorder(index)


def _copy_moved(buffers: tuple[Tensor, ...], dim: int, index: Tensor) -> bool:
    """``buf.index_select(dim, index)`` done in place on the first ``index.numel()`` rows of
    each buffer (the caller narrows to them) where fewer than half of them change: only the rows
    with ``index[i] != i`` are copied. ``False`` (nothing done) where more change, or for
    tensors that require grad."""
    rows = index.numel()
    if rows > buffers[0].size(dim) or buffers[0].requires_grad:
        return False
    moved = (index != torch.arange(rows, device=index.device)).nonzero().squeeze(1)
    if 2 * moved.numel() >= rows:
        return False
    if moved.numel():
        sources = index[moved]
        for buf in buffers:
            buf.index_copy_(dim, moved, buf.index_select(dim, sources))
    return True


def survivor_rows(done: Tensor) -> Tensor:
    """The rows that stay when the rows marked in ``done`` (``(B,)`` bool) leave a decoding
    batch: ``(B',)`` long, for :meth:`~seq2seq.nn.kv_cache.DecoderCache.reorder` (row ``i``
    becomes row ``index[i]``).

    Rows carry no order (each search keeps every row's sentence), so with the ``compact`` trick
    the rows that stay at or past ``B'`` take the places of the finished ones below it, and the
    caches copy only those (:class:`CompactKVCache`, :class:`TimeMajorKVCache`). Switched off:
    the rows that stay, in order.
    """
    keep = (~done).nonzero().squeeze(1)
    if not fast.is_enabled("compact"):
        return keep
    n = keep.numel()
    index = torch.arange(n, device=done.device)
    index[done[:n].nonzero().squeeze(1)] = keep[keep >= n]  # as many of each
    return index


def self_attention_cache() -> type[KVCache]:
    """The class of the self-attention caches of a new decoding run."""
    return TimeMajorKVCache if fast.is_enabled("cache") else KVCache


def cross_attention_cache() -> type[KVCache]:
    """The class of the cross-attention caches of a new decoding run."""
    return CompactKVCache if fast.is_enabled("compact") else KVCache


def slots_in_place(parent: Tensor) -> Tensor:
    """An order of the new beams of each sentence that keeps them in their parent's slot.

    Beam slots carry no order (beams are compared by score only), so each parent's first
    (best) child takes the parent's slot and the other children fill the free slots, in order;
    reordering the caches then leaves the first children's rows where they are
    (:class:`TimeMajorKVCache` copies only the others). Switched off: the identity.

    Args:
        parent: ``(A, K)`` long parent slot of each new beam.

    Returns:
        ``(A, K)`` long ``order``: slot ``s`` receives new beam ``order[:, s]``.
    """
    a, k = parent.shape
    slot_ids = torch.arange(k, device=parent.device)
    if not fast.is_enabled("slots"):
        return slot_ids.expand(a, k)
    same = parent.unsqueeze(2) == parent.unsqueeze(1)  # (A, K, K): beams j, i share a parent
    first = ~(same & (slot_ids.unsqueeze(1) > slot_ids)).any(dim=2)  # no earlier sibling
    taken = (parent.unsqueeze(2) == slot_ids).any(dim=1)  # (A, K): slot is some beam's parent
    free = torch.sort(taken.long() * k + slot_ids, dim=1).values % k  # free slots first
    rank = (~first).long().cumsum(dim=1) - 1  # position of a later sibling among them
    slot = torch.where(first, parent, free.gather(1, rank.clamp_min(0)))
    return torch.empty_like(slot).scatter_(1, slot, slot_ids.expand(a, k).contiguous())
