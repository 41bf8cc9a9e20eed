"""Positional encodings, position-wise feed-forward, encoder and decoder layers.

Shapes follow the legend in :mod:`seq2seq.nn.attention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.nn.attention import KVCache, MultiHeadAttention

__all__ = [
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
    "check_length",
]


def check_length(length: int, max_positions: int) -> None:
    """Raise if a sequence does not fit into the positional table.

    Raises:
        ValueError: if ``length > max_positions``, naming both.
    """
    if length > max_positions:
        raise ValueError(
            f"sequence length {length} exceeds max_positions={max_positions}; "
            "truncate the input or build the model with a larger max_positions"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal positions (Vaswani et al. 2017, Sec. 3.5).

    ``PE[p, 2i] = sin(p / 10000^(2i/D))``, ``PE[p, 2i+1] = cos(p / 10000^(2i/D))``.

    Args:
        d_model: model width ``D``.
        max_positions: number of positions in the table.
    """

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        pos = torch.arange(max_positions, dtype=torch.float64)[:, None]
        inv_freq = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model)
        )
        table = torch.zeros(max_positions, d_model, dtype=torch.float64)
        table[:, 0::2] = torch.sin(pos * inv_freq)
        table[:, 1::2] = torch.cos(pos * inv_freq[: d_model // 2])
        self.register_buffer("table", table.float(), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings of positions ``offset .. offset + length - 1``.

        Args:
            length: number of positions ``T``.
            offset: first position (cached decoding continues from the cache length).

        Returns:
            ``(T, D)`` float32 encodings.

        Raises:
            ValueError: if ``offset + length > max_positions``.
        """
        check_length(offset + length, self.max_positions)
        return self.table[offset : offset + length]


class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute positions (Gehring et al. 2017), initialised ``N(0, D^-0.5)``.

    Args:
        d_model: model width ``D``.
        max_positions: number of positions in the table.
    """

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Embeddings of positions ``offset .. offset + length - 1``: ``(T, D)``.

        Raises:
            ValueError: if ``offset + length > max_positions``.
        """
        check_length(offset + length, self.max_positions)
        return self.weight[offset : offset + length]


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``W2 act(W1 x + b1) + b2`` (Vaswani et al. 2017,
    Eq. 2), with Xavier-uniform weights and dropout on the hidden activation.

    Args:
        d_model: model width ``D``.
        d_ff: hidden width.
        activation: ``"relu"`` or ``"gelu"``.
        activation_dropout: dropout probability after the activation.

    Raises:
        ValueError: for an unknown activation.
    """

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "relu", activation_dropout: float = 0.0
    ) -> None:
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
        self.activation = activation
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(activation_dropout)
        for lin in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, T, D)`` -> ``(B, T, D)``."""
        hidden = self.fc1(x)
        hidden = F.relu(hidden) if self.activation == "relu" else F.gelu(hidden)
        return self.fc2(self.dropout(hidden))


def feed_forward_residual(
    x: Tensor, ff: FeedForward, norm: nn.Module, dropout: nn.Module, pre_ln: bool, index=None
) -> Tensor:
    """The feed-forward sub-layer with its residual connection and LayerNorm.

    Pre-LN: ``x + Drop(FF(LN(x)))``; Post-LN: ``LN(x + Drop(FF(x)))``.

    With ``index``, the sub-layer runs on those rows of the flattened ``(B * L, D)`` input only
    (the real tokens): padding rows keep ``x`` (Pre-LN) or ``LN(x)`` (Post-LN) and their
    values are meaningless, which is harmless since padding is never attended to (key padding
    mask in the encoder, causality in the decoder) and never scored. Real rows get the same
    values as without ``index``, up to floating-point rounding of the matrix products.

    Args:
        x: ``(B, L, D)`` states.
        ff: the feed-forward network.
        norm: its LayerNorm.
        dropout: residual dropout.
        pre_ln: Pre-LN (``True``) or Post-LN.
        index: optional ``(N,)`` long positions in the flattened ``(B * L)`` layout.

    Returns:
        ``(B, L, D)``.
    """
    if index is None:
        if pre_ln:
            return x + dropout(ff(norm(x)))
        return norm(x + dropout(ff(x)))
    flat = x.reshape(-1, x.size(-1))
    rows = flat.index_select(0, index)
    update = dropout(ff(norm(rows) if pre_ln else rows)).to(flat.dtype)  # autocast: bfloat16
    out = flat.index_add(0, index, update).view(x.shape)
    return out if pre_ln else norm(out)


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward sub-layers with residual connections.

    Post-LN: ``x = LN(x + Drop(SubLayer(x)))`` (Vaswani et al. 2017, Sec. 5.4). Pre-LN:
    ``x = x + Drop(SubLayer(LN(x)))`` (Xiong et al. 2020).

    Args:
        d_model: model width ``D``.
        n_heads: number of heads ``H``.
        d_ff: feed-forward hidden width.
        dropout: residual dropout probability.
        attention_dropout: dropout on attention weights.
        activation_dropout: dropout after the feed-forward activation.
        activation: ``"relu"`` or ``"gelu"``.
        norm_first: Pre-LN when ``True``, Post-LN otherwise.
        rotary_max_positions: rotary positions in self-attention over this many positions
            (:class:`~seq2seq.nn.attention.RotaryEmbedding`); ``None`` = none.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = True,
        rotary_max_positions: int | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, attention_dropout, rotary_max_positions=rotary_max_positions
        )
        self.ff = FeedForward(d_model, d_ff, activation, activation_dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None, index: Tensor | None = None) -> Tensor:
        """Args: x ``(B, S, D)``; mask ``(B, 1, 1, S)`` bool key padding mask; index
        ``(N,)`` real-token positions in the flattened ``(B * S)`` layout, where the
        feed-forward sub-layer is computed (all positions when ``None``, see
        :func:`feed_forward_residual`). Returns ``(B, S, D)``."""
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)))
        return feed_forward_residual(x, self.ff, self.norm2, self.dropout, self.norm_first, index)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over the encoder memory and feed-forward
    sub-layers (Vaswani et al. 2017, Sec. 3.1), Pre-LN or Post-LN as in :class:`EncoderLayer`.

    Args: as :class:`EncoderLayer`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = True,
        rotary_max_positions: int | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, attention_dropout, rotary_max_positions=rotary_max_positions
        )
        self.cross_attn = MultiHeadAttention(
            d_model, n_heads, attention_dropout, self_attention=False
        )
        self.ff = FeedForward(d_model, d_ff, activation, activation_dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None = None,
        cache: tuple[KVCache, KVCache] | None = None,
        index: Tensor | None = None,
    ) -> Tensor:
        """Decode one or more target steps.

        Args:
            x: ``(B, T, D)`` target states.
            memory: ``(B, S, D)`` encoder output (may be ``None`` when ``cache`` holds the
                cross-attention keys/values).
            src_mask: ``(B, 1, 1, S)`` bool source key padding mask.
            cache: ``(self_attention_cache, cross_attention_cache)`` for incremental decoding.
            index: ``(N,)`` real-token positions in the flattened ``(B * T)`` layout, where the
                feed-forward sub-layer is computed (all when ``None``, see
                :func:`feed_forward_residual`).

        Returns:
            ``(B, T, D)``.
        """
        self_kv, cross_kv = cache if cache is not None else (None, None)
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, is_causal=True, cache=self_kv))
            h = self.norm2(x)
            x = x + self.dropout(self.cross_attn(h, memory, mask=src_mask, cache=cross_kv))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, is_causal=True, cache=self_kv)))
            x = self.norm2(
                x + self.dropout(self.cross_attn(x, memory, mask=src_mask, cache=cross_kv))
            )
        return feed_forward_residual(x, self.ff, self.norm3, self.dropout, self.norm_first, index)
