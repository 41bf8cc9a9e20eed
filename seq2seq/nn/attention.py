"""Multi-head attention, mask helpers and key/value caches.

Shape legend used in every docstring of :mod:`seq2seq.nn`:

* ``B``  batch size
* ``S``  source length
* ``T``  target length
* ``D``  model width (``d_model``)
* ``H``  number of attention heads (``n_heads``)
* ``Dh`` head width, ``D / H``
* ``V``  vocabulary size

Mask convention: every mask is ``torch.bool`` and ``True`` means "may attend", the convention of
:func:`torch.nn.functional.scaled_dot_product_attention`. A key padding mask has shape
``(B, 1, 1, S)``; causality is expressed with ``is_causal=True`` or a ``(T, T)`` lower triangle.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.nn.linear import Linear, linear

__all__ = [
    "DecoderCache",
    "KVCache",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "attend_first_if_empty",
    "key_bias",
    "padding_mask",
]


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Key padding mask of a batch of token sequences.

    Args:
        tokens: ``(B, S)`` long token ids.
        pad_id: id of the padding token.

    Returns:
        ``(B, 1, 1, S)`` bool mask, ``True`` at real (non-padding) tokens. It broadcasts over
        heads and query positions in :class:`MultiHeadAttention`.
    """
    return (tokens != pad_id)[:, None, None, :]


def attend_first_if_empty(mask: Tensor) -> Tensor:
    """Let rows of a key mask that allow no key at all attend to the first key instead.

    ``F.scaled_dot_product_attention`` returns NaN (and NaN gradients) for a query whose keys are
    all masked, which happens for a source made only of padding. Such rows are given the first
    key position, so their output is a finite (meaningless) vector and every other row is left
    untouched. :class:`seq2seq.nn.Transformer` applies this to the source mask in ``encode`` and
    ``decode``; callers of :class:`MultiHeadAttention` with masks of their own should do the same.

    Args:
        mask: bool mask of shape ``(..., S)``, ``True`` = may attend.

    Returns:
        Bool mask of the same shape.
    """
    fixed = mask.clone()
    fixed[..., :1] |= ~mask.any(dim=-1, keepdim=True)
    return fixed


def key_bias(mask: Tensor, n_heads: int, dtype: torch.dtype, rows: int | None = None) -> Tensor:
    """A bool key mask as the additive bias of single-query attention.

    Args:
        mask: bool mask broadcastable to ``(G, H, 1, L)``, ``True`` = may attend (e.g. a
            ``(G, 1, 1, L)`` key padding mask).
        n_heads: number of heads ``H``.
        dtype: dtype of the scores.
        rows: ``G`` (default: ``mask.size(0)``; give it for a mask broadcast over rows).

    Returns:
        ``(G * H, 1, L)`` tensor, ``0`` where ``mask`` allows the key and ``-inf`` elsewhere.
    """
    g, length = mask.size(0) if rows is None else rows, mask.size(-1)
    bias = torch.zeros((g, n_heads, 1, length), dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, float("-inf")).view(g * n_heads, 1, length)


def _autocast_off(device_type: str):
    """A context that disables autocast on ``device_type`` if it is on (a no-op otherwise)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """Caches keep float16/bfloat16 keys and values in float32: single-query attention then
    computes in float32 (like the fused kernel) without converting the whole cache each step."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class KVCache:
    """Keys and values of one attention layer, kept between incremental decoding steps.

    Two kinds exist:

    * ``static=False`` (decoder self-attention): each call appends the keys/values of the new
      target step(s). Storage is a time-major buffer ``(capacity, B, H, Dh)`` written in place
      at the current length; it doubles when full, so steps cost no concatenation. Time-major
      keeps the valid prefix ``[:length]`` one contiguous block: a step appends one contiguous
      ``(B, H, Dh)`` slab, and the single-query products read the prefix as ``B * H`` matrices
      ``(length, Dh)`` (row stride ``B * H * Dh``) that share their memory pages, where a
      batch-major buffer ``(B, H, capacity, Dh)`` puts each row's prefix on pages of its own.
      When the decoder's working set does not fit in the CPU's caches, the two products of a
      step then take about 1.7x less time over 32 steps, and the same with warm caches
      (``benchmarks/kv_cache_layout.py``).
    * ``static=True`` (cross-attention): keys/values ``(B, H, S, Dh)`` of the encoder memory,
      computed at the first call and reused unchanged afterwards.

    float16/bfloat16 keys and values are stored in float32 (see :attr:`keys`).

    A static cache can serve ``group`` consecutive query rows per stored row (the beams of one
    sentence, see :meth:`DecoderCache.expand_beams`): their single-step queries then attend to
    the sentence's keys/values together, which are stored and read once per sentence.

    Attributes:
        static: whether the cache holds cross-attention keys/values.
        length: number of valid positions (target steps for self-attention, ``S`` for cross).
        capacity: preallocated number of positions for self-attention.
        group: query rows per stored row (static caches; 1 = one to one).
    """

    def __init__(self, static: bool, capacity: int = 64) -> None:
        self.static = static
        self.capacity = max(int(capacity), 1)
        self.length = 0
        self.group = 1
        self._k: Tensor | None = None  # static: (B, H, S, Dh); else (capacity, B, H, Dh)
        self._v: Tensor | None = None
        # Self-attention: 1-D tensors holding the storage of _k/_v, and a spare pair that a
        # reorder writes into before the two pairs swap (see reorder).
        self._flat: tuple[Tensor, Tensor] | None = None
        self._spare: tuple[Tensor, Tensor] | None = None

    @property
    def is_empty(self) -> bool:
        """Whether nothing has been stored yet."""
        return self._k is None

    @property
    def rows(self) -> int:
        """Number of stored batch rows ``B`` (0 when empty)."""
        if self._k is None:
            return 0
        return self._k.size(0 if self.static else 1)

    @property
    def keys(self) -> Tensor:
        """``(B, H, length, Dh)`` stored keys (a view, no copy; float32 for float16/bfloat16
        inputs)."""
        assert self._k is not None, "empty cache"
        return self._k if self.static else self._k[: self.length].permute(1, 2, 0, 3)

    @property
    def values(self) -> Tensor:
        """``(B, H, length, Dh)`` stored values (a view, no copy; float32 for float16/bfloat16
        inputs)."""
        assert self._v is not None, "empty cache"
        return self._v if self.static else self._v[: self.length].permute(1, 2, 0, 3)

    def set_static(self, k: Tensor, v: Tensor) -> None:
        """Store cross-attention keys and values ``(B, H, S, Dh)``."""
        dtype = _storage_dtype(k.dtype)
        self._k = k.to(dtype).contiguous()
        self._v = v.to(dtype).contiguous()
        self.length = k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append new self-attention keys/values and return all stored ones.

        Args:
            k: ``(B, H, t, Dh)`` keys of the ``t`` new steps.
            v: ``(B, H, t, Dh)`` values of the ``t`` new steps.

        Returns:
            ``(keys, values)``, each ``(B, H, length + t, Dh)``.
        """
        new_len = self.length + k.size(2)
        if self._k is None or new_len > self._k.size(0):
            cap = max(self.capacity, new_len, 2 * (0 if self._k is None else self._k.size(0)))
            b, h, _, dh = k.shape
            dtype = _storage_dtype(k.dtype)
            flat = (
                k.new_empty(cap * b * h * dh, dtype=dtype),
                k.new_empty(cap * b * h * dh, dtype=dtype),
            )
            new_k, new_v = (f.view(cap, b, h, dh) for f in flat)
            if self._k is not None and self.length:
                new_k[: self.length] = self._k[: self.length]
                new_v[: self.length] = self._v[: self.length]
            self._k, self._v, self._flat = new_k, new_v, flat
        self._k[self.length : new_len] = k.permute(2, 0, 1, 3)
        self._v[self.length : new_len] = v.permute(2, 0, 1, 3)
        self.length = new_len
        return self.keys, self.values

    def reorder(self, index: Tensor, moved: Tensor | None = None) -> None:
        """Select batch rows in place: row ``i`` becomes old row ``index[i]``.

        Self-attention caches copy the valid positions into a second buffer kept from the
        previous reorder (allocated once, reused while it is large enough) and swap the two,
        so beam search reorders without allocating. When ``moved`` lists the rows ``i`` with
        ``index[i] != i`` (same number of rows) and they are fewer than half, only those rows
        are copied.

        Args:
            index: ``(B',)`` long indices into the current batch (may repeat rows).
            moved: optional ``(M,)`` long rows ``i`` where ``index[i] != i``, when
                ``B' == B``.
        """
        if self._k is None:
            return
        if self.static:
            self._k = self._k.index_select(0, index)
            self._v = self._v.index_select(0, index)
            return
        rows, n = index.numel(), self.length
        if moved is not None and 2 * moved.numel() < rows and not self._k.requires_grad:
            if moved.numel():
                sources = index[moved]
                for buf in (self._k[:n], self._v[:n]):
                    buf.index_copy_(1, moved, buf.index_select(1, sources))
            return
        cap, _, h, dh = self._k.shape
        if self._k.requires_grad:  # differentiable path (out= does not support autograd)
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = old.new_empty((cap, rows, h, dh))
                new[:n] = old[:n].index_select(1, index)
                setattr(self, name, new)
            self._flat = self._spare = None
            return
        size = cap * rows * h * dh
        if self._spare is None or self._spare[0].numel() < size:
            self._spare = (self._k.new_empty(size), self._v.new_empty(size))
        spare_k, spare_v = (f[:size].view(cap, rows, h, dh) for f in self._spare)
        torch.index_select(self._k[:n], 1, index, out=spare_k[:n])
        torch.index_select(self._v[:n], 1, index, out=spare_v[:n])
        self._k, self._v = spare_k, spare_v
        self._flat, self._spare = self._spare, self._flat


class DecoderCache:
    """Incremental-decoding state of a whole decoder: one self- and one cross-attention
    :class:`KVCache` per layer.

    Beam search reorders only the self-attention caches between steps (``reorder(index)``);
    cross-attention keys/values depend on the source sentence only, which all beams of a sentence
    share, so they are never reordered within a sentence. They are computed once per sentence,
    from the un-expanded memory, and stay one row per sentence: :meth:`expand_beams` turns the
    batch of ``B`` sentences into ``B * beam`` rows after the first step by copying the
    self-attention caches only, and the ``beam`` queries of a sentence then attend to its
    cross-attention keys/values together (one batched product per sentence instead of one per
    beam). Dropping finished sentences goes through ``reorder(index, include_cross=True)``.

    Args:
        n_layers: number of decoder layers.
        capacity: initial number of target positions preallocated per self-attention cache.
    """

    def __init__(self, n_layers: int, capacity: int = 64) -> None:
        self.layers = [(KVCache(False, capacity), KVCache(True)) for _ in range(n_layers)]
        self._bias: tuple[Tensor, Tensor] | None = None  # (source mask, its key bias)

    def source_bias(self, src_mask: Tensor, n_heads: int, dtype: torch.dtype) -> Tensor:
        """The cross-attention key bias of ``src_mask`` (:func:`key_bias` of
        :func:`attend_first_if_empty`), computed once per mask tensor: a search passes the same
        mask at every step until it drops sentences."""
        if self._bias is None or self._bias[0] is not src_mask:
            bias = key_bias(attend_first_if_empty(src_mask), n_heads, dtype)
            self._bias = (src_mask, bias)
        return self._bias[1]

    @property
    def length(self) -> int:
        """Number of target positions already decoded."""
        return self.layers[0][0].length if self.layers else 0

    def reorder(self, index: Tensor, include_cross: bool = False) -> None:
        """Select batch rows of every cache: row ``i`` becomes old row ``index[i]``.

        Args:
            index: ``(B',)`` long indices into the current batch.
            include_cross: also select the cross-attention keys/values (needed whenever the
                new batch holds different sentences, not just different beams). After
                :meth:`expand_beams`, each group of ``beam`` new rows must come from one
                sentence's group of old rows; the sentence of each group is selected.
        """
        moved = None
        first = self.layers[0][0] if self.layers else None
        if first is not None and first.rows and index.numel() == first.rows:
            # Same number of rows (beams reordered): copy only the rows that change.
            same = index == torch.arange(index.numel(), device=index.device)
            moved = (~same).nonzero().squeeze(1)
        for self_kv, cross_kv in self.layers:
            self_kv.reorder(index, moved)
            if include_cross:
                g = cross_kv.group
                cross_kv.reorder(index if g == 1 else index[::g] // g)

    def expand_beams(self, beam: int) -> None:
        """Turn ``B`` rows (one per sentence) into ``B * beam`` rows, sentence-major.

        Self-attention caches copy each row ``beam`` times; cross-attention caches keep one row
        per sentence and serve its ``beam`` query rows together (``KVCache.group``).
        """
        if beam == 1:
            return
        for self_kv, cross_kv in self.layers:
            if self_kv.rows:
                rows = torch.arange(self_kv.rows, device=self_kv._k.device)
                self_kv.reorder(rows.repeat_interleave(beam))
            cross_kv.group *= beam


class RotaryEmbedding:
    """Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", Sec. 3.4, Eq. 34).

    Rotates each pair of query/key coordinates ``(x_i, x_{i + Dh/2})`` at position ``p`` by the
    angle ``p * theta_i`` with ``theta_i = base^(-2i / Dh)``, so that the dot product of a query
    at position ``m`` and a key at position ``n`` depends on ``m - n`` only. The pairs are the
    two halves of the head (the arrangement of GPT-NeoX and Hugging Face's LLaMA), which is the
    paper's interleaved pairing up to a fixed permutation of the head's coordinates.

    The cosine/sine tables are computed in float64 on first use per device and kept in float32
    (float64 for float64 inputs); the rotation runs in that precision and returns the input's
    dtype. They are plain attributes, not buffers: nothing enters the state dict and
    ``module.to(dtype)`` leaves them in full precision.

    Args:
        head_dim: head width ``Dh`` (even).
        max_positions: number of positions in the tables.
        base: the ``base`` of ``theta_i`` (10000 in the paper).

    Raises:
        ValueError: if ``head_dim`` is odd.
    """

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0) -> None:
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head width, got {head_dim}")
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.base = base
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    def tables(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)``, each ``(max_positions, Dh / 2)`` in ``dtype``."""
        key = (device, dtype)
        if key not in self._tables:
            half = self.head_dim // 2
            theta = self.base ** (-torch.arange(half, dtype=torch.float64) * 2 / self.head_dim)
            angles = torch.arange(self.max_positions, dtype=torch.float64)[:, None] * theta
            self._tables[key] = (
                angles.cos().to(device, dtype),
                angles.sin().to(device, dtype),
            )
        return self._tables[key]

    def __call__(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate ``(B, H, L, Dh)`` queries or keys at positions ``offset .. offset + L - 1``.

        Returns:
            ``(B, H, L, Dh)``, ``x``'s dtype.
        """
        length = x.size(-2)
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.tables(x.device, work)
        cos, sin = cos[offset : offset + length], sin[offset : offset + length]
        x1, x2 = x.to(work).chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def __repr__(self) -> str:
        return f"RotaryEmbedding(head_dim={self.head_dim}, base={self.base})"


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017, Sec. 3.2, Eq. 1).

    ``Attention(Q, K, V) = softmax(Q K^T / sqrt(Dh) + M) V`` per head, heads concatenated and
    projected, computed by :func:`torch.nn.functional.scaled_dot_product_attention`. Self-attention
    uses one fused ``D -> 3D`` QKV projection; cross-attention uses a ``D -> D`` query projection
    and a fused ``D -> 2D`` key/value projection of the memory.

    Args:
        d_model: model width ``D``.
        n_heads: number of heads ``H``; must divide ``d_model``.
        dropout: dropout probability on the attention weights (training only).
        bias: whether the projections have biases.
        self_attention: ``True`` for self-attention, ``False`` for cross-attention.
        rotary_max_positions: self-attention only: rotate queries and keys with
            :class:`RotaryEmbedding` over this many positions (``None``: no rotation).

    Raises:
        ValueError: if ``d_model`` is not divisible by ``n_heads``, or rotary positions are
            asked for cross-attention or an odd head width.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        self_attention: bool = True,
        rotary_max_positions: int | None = None,
    ) -> None:
        super().__init__()
        if n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.self_attention = self_attention
        if self_attention:
            self.qkv = Linear(d_model, 3 * d_model, bias=bias)
        else:
            self.q = Linear(d_model, d_model, bias=bias)
            self.kv = Linear(d_model, 2 * d_model, bias=bias)
        self.out = Linear(d_model, d_model, bias=bias)
        if rotary_max_positions is not None and not self_attention:
            raise ValueError("rotary positions apply to self-attention only")
        self.rotary = (
            None
            if rotary_max_positions is None
            else RotaryEmbedding(self.head_dim, rotary_max_positions)
        )
        # Visualisation: when ``record_weights`` is set, each call also computes the attention
        # probabilities explicitly and keeps them in ``weights`` (see Transformer.attention_maps).
        self.record_weights = False
        self.weights: Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights per ``D x D`` projection (as if Q, K, V were separate), zero
        biases."""
        fused = [self.qkv] if self.self_attention else [self.q, self.kv]
        for lin in [*fused, self.out]:
            for block in lin.weight.split(self.d_model, dim=0):
                nn.init.xavier_uniform_(block)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def _heads(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """``(B, L, n*D)`` -> ``n`` views ``(B, H, L, Dh)``."""
        b, length, _ = x.shape
        return x.view(b, length, n, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Attend from ``query`` to itself (self-attention) or to ``key_value`` (cross).

        Args:
            query: ``(B, T, D)`` float queries (and keys/values for self-attention).
            key_value: ``(B, S, D)`` memory for cross-attention; ignored for self-attention, and
                may be ``None`` when ``cache`` already holds the cross-attention keys/values.
            mask: bool mask broadcastable to ``(B, H, T, L)`` (``L`` = number of keys), ``True``
                = may attend, e.g. ``(B, 1, 1, S)`` key padding. Every query row must allow at
                least one key (see :func:`attend_first_if_empty`), otherwise its output is NaN.
            is_causal: self-attention only: query ``i`` attends to keys ``<= i`` (plus all cached
                positions when a cache is given). Combined with ``mask`` if both are given.
            cache: self-attention: the new keys/values are appended and attention covers all
                cached steps. Cross-attention: keys/values are computed from ``key_value`` on the
                first call, stored, and reused afterwards.

        Returns:
            ``(B, T, D)`` attention output, same dtype as ``query``.
        """
        b, t, _ = query.shape
        if self.self_attention:
            q, k, v = self._heads(self.qkv(query), 3)
            past = 0 if cache is None else cache.length
            if self.rotary is not None:  # positions continue from the cached steps
                q, k = self.rotary(q, past), self.rotary(k, past)
            if cache is not None:
                k, v = cache.append(k, v)
        else:
            (q,) = self._heads(self.q(query), 1)
            if cache is not None and not cache.is_empty:
                k, v = cache.keys, cache.values
            else:
                if key_value is None:
                    raise ValueError("cross-attention needs key_value (or a filled cache)")
                k, v = self._heads(self.kv(key_value), 2)
                if cache is not None:
                    cache.set_static(k, v)
                    k, v = cache.keys, cache.values
            past = 0
        if cache is not None and cache.group > 1 and t != 1:
            raise ValueError("a cross-attention cache shared by beams serves single steps only")
        if cache is not None and t == 1:
            # One query per row (incremental decoding) attends to every cached key: no causal
            # mask, and two batched matrix products on the cache buffers beat the fused kernel
            # at this shape.
            keys = cache.keys
            bias = None if mask is None else key_bias(mask, self.n_heads, keys.dtype, len(keys))
            dropout = self.dropout if self.training else 0.0
            out = self._one_query(q, keys, cache.values, bias, dropout)
            return self.out(out.to(query.dtype).view(b, 1, self.d_model))
        if is_causal and (past > 0 or mask is not None):
            # SDPA's is_causal is top-left aligned and cannot be combined with a mask: build the
            # (T, past + T) lower triangle explicitly, only when it actually restricts something.
            if t > 1:
                causal = torch.ones(t, past + t, dtype=torch.bool, device=query.device).tril(past)
                mask = causal if mask is None else mask & causal
            is_causal = False
        if cache is not None:  # float32 storage of a low-precision computation
            k, v = k.to(q.dtype), v.to(q.dtype)
        if self.record_weights:
            self.weights = _attention_probs(q, k, mask, is_causal)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
        )
        return self.out(out.transpose(1, 2).reshape(b, t, self.d_model))

    def step(
        self,
        query: Tensor,
        cache: KVCache,
        memory: Tensor | None = None,
        bias: Tensor | None = None,
        residual: Tensor | None = None,
    ) -> Tensor:
        """One incremental-decoding step in inference: each row holds one new target position.

        The same function as :meth:`forward` with ``T = 1`` and a cache, on ``(N, D)`` rows and
        with fewer operations: the key mask comes as a bias computed once per step for all
        layers (:func:`key_bias`), and the residual connection joins the output projection
        (:func:`~seq2seq.nn.linear.linear`). No dropout: for modules in eval mode.

        Args:
            query: ``(N, D)`` queries (self-attention: also the new keys/values).
            cache: self-attention: the new keys/values are appended. Cross-attention: keys and
                values computed from ``memory`` if the cache is empty, else the stored ones;
                with ``cache.group = g`` each stored row serves ``g`` consecutive query rows.
            memory: ``(B, S, D)`` encoder output; cross-attention with an empty cache only.
            bias: cross-attention only: ``(B * H, 1, S)`` additive key mask in the keys' dtype
                (:func:`key_bias`; every row with a ``0``) or ``None``.
            residual: optional ``(N, D)`` tensor added to the output.

        Returns:
            ``(N, D)``: ``residual + Attention(query)``.

        Raises:
            ValueError: for cross-attention with an empty cache and no ``memory``.
        """
        n = query.size(0)
        h, dh = self.n_heads, self.head_dim
        if self.self_attention:
            qkv = self.qkv(query).view(n, 3, h, dh)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # (N, H, Dh) views
            if self.rotary is not None:
                q = self.rotary(q.unsqueeze(2), cache.length).squeeze(2)
                k = self.rotary(k.unsqueeze(2), cache.length).squeeze(2)
            keys, values = cache.append(k.unsqueeze(2), v.unsqueeze(2))
        else:
            if cache.is_empty:
                if memory is None:
                    raise ValueError("cross-attention needs key_value (or a filled cache)")
                cache.set_static(*self._heads(self.kv(memory), 2))
            keys, values = cache.keys, cache.values
            q = self.q(query).view(n, h, dh)
        out = self._one_query(q, keys, values, bias)
        return linear(
            out.to(query.dtype), self.out.weight, self.out.bias, self.out._packed, residual=residual
        )

    def _one_query(
        self, q: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None, dropout: float = 0.0
    ) -> Tensor:
        """``softmax(q K^T / sqrt(Dh) + bias) V`` for a single query per row, computed in the
        keys' dtype (float32 for float16/bfloat16 inputs, as the fused kernel accumulates).

        The query scaling and the bias join the first batched product (``baddbmm``). With
        :attr:`record_weights` the attention probabilities are kept in :attr:`weights` as
        ``(N, H, 1, L)``.

        Args:
            q: ``(N, H, Dh)`` or ``(N, H, 1, Dh)`` queries, ``N = G * g``: each of the ``G``
                stored rows serves ``g`` consecutive query rows (the beams of a sentence).
            keys: ``(G, H, L, Dh)`` keys.
            values: ``(G, H, L, Dh)`` values.
            bias: ``(G * H, 1, L)`` additive key mask in the keys' dtype (:func:`key_bias`)
                or ``None``.
            dropout: dropout probability on the attention weights.

        Returns:
            ``(N, D)`` attention output (heads merged), in the keys' dtype.
        """
        n, h, dh = q.size(0), self.n_heads, self.head_dim
        groups = keys.size(0)
        g = n // groups
        scale = 1.0 / math.sqrt(dh)
        with _autocast_off(q.device.type):
            # (N, H, Dh) -> (G, H, g, Dh) -> (G * H, g, Dh): the g queries of a row together.
            q = q.view(groups, g, h, dh).transpose(1, 2).to(keys.dtype)
            keys_t = keys.flatten(0, 1).transpose(1, 2)  # (G * H, Dh, L), a view
            q = q.reshape(groups * h, g, dh)
            if bias is None:  # beta=0: the (broadcast) zero input is ignored
                scores = torch.baddbmm(q.new_zeros(()), q, keys_t, beta=0.0, alpha=scale)
            else:
                scores = torch.baddbmm(bias, q, keys_t, alpha=scale)
            probs = scores.softmax(dim=-1)
            if self.record_weights:
                self.weights = probs.view(groups, h, g, -1).transpose(1, 2).reshape(n, h, 1, -1)
            if dropout > 0:
                probs = F.dropout(probs, dropout)
            out = torch.bmm(probs, values.flatten(0, 1))  # (G * H, g, Dh)
        return out.view(groups, h, g, dh).transpose(1, 2).reshape(n, self.d_model)

    def extra_repr(self) -> str:
        kind = "self" if self.self_attention else "cross"
        rotary = ", rotary" if self.rotary is not None else ""
        return (
            f"{kind}, d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout}"
            + rotary
        )


def _attention_probs(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
    """float32 ``softmax(Q K^T / sqrt(Dh) + M)`` with the masks given to SDPA, ``(B, H, T, L)``.

    Masked keys get probability exactly zero; ``is_causal`` is SDPA's top-left aligned triangle.
    """
    q, k = q.float(), k.float()
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if is_causal:
        t, length = scores.shape[-2:]
        mask = torch.ones(t, length, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Plain ``softmax(Q K^T / sqrt(Dh) + M) V`` (Vaswani et al. 2017, Eq. 1), for tests.

    Args:
        q: ``(..., T, Dh)`` queries.
        k: ``(..., L, Dh)`` keys.
        v: ``(..., L, Dh)`` values.
        mask: bool mask broadcastable to ``(..., T, L)``, ``True`` = may attend.

    Returns:
        ``(..., T, Dh)`` attention output.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v
