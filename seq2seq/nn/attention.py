"""Multi-head attention on ``F.scaled_dot_product_attention``, and the mask helpers.

Shape legend used in every docstring of :mod:`seq2seq.nn`:

* ``B``  batch size
* ``S``  source length
* ``T``  target length (the new queries); ``L`` keys, ``T`` plus the cached steps
* ``D``  model width (``d_model``)
* ``H``  number of attention heads (``n_heads``)
* ``Dh`` head width, ``D / H``
* ``V``  vocabulary size
* ``N``  positions picked by an ``index`` from a flattened ``(B * S)`` or ``(B * T)`` layout

Mask convention, for every mask of :mod:`seq2seq.nn`: ``torch.bool``, ``True`` = "may attend"
(that of :func:`torch.nn.functional.scaled_dot_product_attention`; ``nn.MultiheadAttention``'s
boolean masks mean the opposite). A key padding mask is ``(B, 1, 1, S)``, ``True`` at real tokens
(:func:`padding_mask`); ``None`` means no padding. Causality is ``is_causal=True``; targets are
right-padded and need no mask, since real positions never attend to later ones. A query whose
keys are all masked (a source made only of padding) attends to the first key instead
(:func:`attend_first_if_empty`): finite outputs and gradients in every dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from seq2seq.nn import fast
from seq2seq.nn.kv_cache import DecoderCache, KVCache
from seq2seq.nn.rotary import RotaryEmbedding

__all__ = [
    "DecoderCache",
    "KVCache",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "attend_first_if_empty",
    "attention",
    "padding_mask",
]


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """``(B, S)`` long ids -> ``(B, 1, 1, S)`` bool key padding mask, True at real tokens."""
    return (tokens != pad_id)[:, None, None, :]


def attend_first_if_empty(mask: Tensor) -> Tensor:
    """A key mask ``(..., L)`` whose rows that allow no key allow the first one instead.

    SDPA gives NaN outputs and gradients for a query whose keys are all masked; such a row's
    output becomes a finite, meaningless vector instead.
    """
    first = torch.arange(mask.size(-1), device=mask.device) == 0
    return mask | (~mask.any(dim=-1, keepdim=True) & first)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout: float = 0.0,
) -> Tensor:
    """``softmax(Q K^T / sqrt(Dh) + M) V`` per head (Vaswani et al. 2017, Sec. 3.2.1, Eq. 1).

    Args:
        q: ``(B, H, T, Dh)`` queries.
        k: ``(B, H, L, Dh)`` keys; with ``L > T`` the first ``L - T`` are cached steps.
        v: ``(B, H, L, Dh)`` values.
        mask: broadcastable to ``(B, H, T, L)`` (e.g. a ``(B, 1, 1, S)`` key padding mask);
            ``None`` = every key.
        is_causal: query ``i`` attends to keys ``<= L - T + i`` (every cached step and the
            new steps up to itself).
        dropout: dropout probability on the attention weights.

    Returns:
        ``(B, H, T, Dh)``, ``q``'s dtype.
    """
    t, length = q.size(-2), k.size(-2)
    if is_causal and (length != t or mask is not None):
        # SDPA's is_causal is top-left aligned and excludes a mask: the (T, L) lower triangle
        # shifted by the cached steps, where it restricts something (not for one new query).
        causal = torch.ones(t, length, dtype=torch.bool, device=q.device).tril(length - t)
        mask = causal if mask is None else mask & causal
        is_causal = False
    if mask is not None:
        mask = attend_first_if_empty(mask)
    k, v = k.to(q.dtype), v.to(q.dtype)
    if _cpu_bfloat16_training(q):
        # PyTorch's CPU flash-attention backward is slow in bfloat16 (40% of a README-size
        # training step); the math path's bfloat16 batched products are fast (benchmarks/README).
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal
            )
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal
    )


def _cpu_bfloat16_training(q: Tensor) -> bool:
    """Whether ``q`` is a bfloat16 CPU tensor that autograd tracks (training under autocast)."""
    return q.device.type == "cpu" and q.dtype == torch.bfloat16 and q.requires_grad


def attention_probs(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
    """The float32 weights ``softmax(Q K^T / sqrt(Dh) + M)`` that :func:`attention` applies,
    ``(B, H, T, L)``, for visualisation; masked keys get exactly zero."""
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.size(-1))
    t, length = scores.shape[-2:]
    if is_causal:
        causal = torch.ones(t, length, dtype=torch.bool, device=q.device).tril(length - t)
        mask = causal if mask is None else mask & causal
    if mask is not None:
        scores = scores.masked_fill(~attend_first_if_empty(mask), float("-inf"))
    return scores.softmax(dim=-1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, Sec. 3.2.2): heads of :func:`attention`,
    concatenated and projected. Self-attention projects ``D -> 3D`` (queries, keys, values) in
    one product; cross-attention projects the queries ``D -> D`` and the memory ``D -> 2D``.

    Args:
        d_model: model width ``D``.
        n_heads: number of heads ``H``; must divide ``d_model``.
        dropout: dropout probability on the attention weights (training only).
        bias: whether the projections have biases.
        self_attention: ``True`` for self-attention, ``False`` for cross-attention.
        rotary_max_positions: self-attention only: rotate queries and keys with
            :class:`~seq2seq.nn.rotary.RotaryEmbedding` over this many positions.

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
        if rotary_max_positions is not None and not self_attention:
            raise ValueError("rotary positions apply to self-attention only")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.self_attention = self_attention
        if self_attention:
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        else:
            self.q = nn.Linear(d_model, d_model, bias=bias)
            self.kv = nn.Linear(d_model, 2 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = None
        if rotary_max_positions is not None:
            self.rotary = RotaryEmbedding(self.head_dim, rotary_max_positions)
        # With record_weights set, each call keeps its attention weights in `weights`
        # (Transformer.attention_maps).
        self.record_weights = False
        self.weights: Tensor | None = None
        # Xavier-uniform per D x D block, as if Q, K and V were separate; zero biases.
        for lin in [self.qkv] if self_attention else [self.q, self.kv]:
            for block in lin.weight.split(d_model, dim=0):
                nn.init.xavier_uniform_(block)
        nn.init.xavier_uniform_(self.out.weight)
        for lin in self.modules():
            if isinstance(lin, nn.Linear) and lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def _heads(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """``(B, L, n * D)`` -> ``n`` tensors ``(B, H, L, Dh)``, views of ``x``. Unbound along
        ``n`` before the transpose, so that backward stacks the ``n`` gradients straight into
        ``x``'s layout (a permute first would cost one more copy of them)."""
        b, length, _ = x.shape
        parts = x.view(b, length, n, self.n_heads, self.head_dim).unbind(2)
        return tuple(part.transpose(1, 2) for part in parts)

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
            query: ``(B, T, D)`` queries (and keys/values for self-attention).
            key_value: ``(B, S, D)`` memory for cross-attention; may be ``None`` once ``cache``
                holds its keys/values.
            mask: broadcastable to ``(B, H, T, L)``, as for :func:`attention`.
            is_causal: self-attention: query ``i`` attends to keys ``<= i`` and every cached
                step.
            cache: keys/values of the earlier calls (:class:`~seq2seq.nn.kv_cache.KVCache`):
                self-attention appends the new ones; cross-attention computes them from
                ``key_value`` once. With ``cache.group = g``, the ``B = G * g`` single-step
                queries are ``g`` beams of each of the ``G`` stored rows.

        Returns:
            ``(B, T, D)``, ``query``'s dtype.

        Raises:
            ValueError: for cross-attention without ``key_value`` and an empty cache, or a
                shared cache with ``T > 1``.
        """
        b, t, _ = query.shape
        if self.self_attention:
            q, k, v = self._heads(self.qkv(query), 3)  # (B, H, T, Dh) each
            if self.rotary is not None:  # positions continue after the cached steps
                past = 0 if cache is None else cache.length
                q, k = self.rotary(q, past), self.rotary(k, past)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, L, Dh)
        else:
            (q,) = self._heads(self.q(query), 1)
            if cache is not None and not cache.is_empty:
                k, v = cache.keys, cache.values  # (B, H, S, Dh)
            elif key_value is None:
                raise ValueError("cross-attention needs key_value (or a filled cache)")
            else:
                k, v = self._heads(self.kv(key_value), 2)
                if cache is not None:
                    cache.set_static(k, v)
        g = 1 if cache is None else cache.group
        if g > 1:  # (G * g, H, 1, Dh) -> (G, H, g, Dh): a sentence's beams are its queries
            if t != 1:
                raise ValueError("a cross-attention cache shared by beams serves single steps")
            q = q.view(b // g, g, self.n_heads, self.head_dim).transpose(1, 2)
        if self.record_weights:
            self.weights = attention_probs(q, k, mask, is_causal)
        dropout = self.dropout if self.training else 0.0
        if cache is not None and t == 1 and fast.use_one_query(q, dropout):
            # a measured speed trick; the mask's empty rows are handled here, as in attention()
            mask = None if mask is None else attend_first_if_empty(mask)
            out = fast.one_query_attention(q, k, v, mask, is_causal)
        else:
            out = attention(q, k, v, mask, is_causal, dropout)  # (B, H, T, Dh)
        if g > 1:  # back to one query per row: (B, H, 1, Dh)
            out = out.transpose(1, 2).reshape(b, self.n_heads, 1, self.head_dim)
            self.weights = _ungroup(self.weights, b)
        return self.out(out.transpose(1, 2).reshape(b, t, self.d_model))

    def extra_repr(self) -> str:
        kind = "self" if self.self_attention else "cross"
        rotary = ", rotary" if self.rotary is not None else ""
        return (
            f"{kind}, d_model={self.d_model}, n_heads={self.n_heads}, dropout={self.dropout}"
            + rotary
        )


def _ungroup(weights: Tensor | None, rows: int) -> Tensor | None:
    """Recorded ``(G, H, g, S)`` weights of grouped beam queries as ``(G * g, H, 1, S)``."""
    if weights is None:
        return None
    return weights.transpose(1, 2).reshape(rows, weights.size(1), 1, -1)
