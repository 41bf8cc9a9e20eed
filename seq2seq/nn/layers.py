"""Positional encodings, position-wise feed-forward, encoder and decoder layers.

The blocks take the :class:`~seq2seq.nn.config.TransformerConfig` (as nanoGPT's take its
``GPTConfig``): an option is read here, its default lives there. Shapes and masks follow
:mod:`seq2seq.nn.attention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.nn.attention import KVCache, MultiHeadAttention
from seq2seq.nn.config import TransformerConfig

__all__ = [
    "DecoderLayer",
    "EncoderLayer",
    "FairseqSinusoidalPositionalEncoding",
    "FeedForward",
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
    "check_length",
    "feed_forward_residual",
    "normalization",
    "positional_encoding",
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


class FairseqSinusoidalPositionalEncoding(nn.Module):
    """fairseq's fixed sinusoids (``SinusoidalPositionalEmbedding.get_embedding`` in
    ``fairseq/modules/sinusoidal_positional_embedding.py``; Hugging Face's
    ``M2M100SinusoidalPositionalEmbedding``), as M2M-100 and NLLB use them.

    With ``h = D / 2`` and frequencies ``w_i = exp(-i * ln(10000) / (h - 1))``, row ``r`` is
    ``[sin(r * w_0), ..., sin(r * w_{h-1}), cos(r * w_0), ..., cos(r * w_{h-1})]``, computed
    in float32 as fairseq does (so the values are fairseq's to the bit). fairseq numbers the
    positions from ``padding_idx + 1 = 2``: the token at 0-based position ``p`` gets row
    ``p + 2``.

    Args:
        d_model: model width ``D`` (even, at least 4: ``TransformerConfig`` checks).
        max_positions: number of positions served (``p`` in ``0 .. max_positions - 1``).
    """

    OFFSET = 2  # fairseq's first position number: padding_idx (1) + 1

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        half = d_model // 2
        step = math.log(10000.0) / (half - 1)
        inv_freq = torch.exp(torch.arange(half, dtype=torch.float32) * -step)
        rows = torch.arange(self.OFFSET, self.OFFSET + max_positions, dtype=torch.float32)
        angles = rows[:, None] * inv_freq[None, :]
        table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings of positions ``offset .. offset + length - 1`` (fairseq's rows
        ``offset + 2 .. offset + length + 1``): ``(T, D)`` float32.

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


def positional_encoding(config: TransformerConfig) -> nn.Module | None:
    """The ``config.positional`` table added to the embeddings (``(T, D)`` per call); ``None``
    for rotary positions, which enter in self-attention."""
    if config.positional == "sinusoidal":
        return SinusoidalPositionalEncoding(config.d_model, config.max_positions)
    if config.positional == "sinusoidal_fairseq":
        return FairseqSinusoidalPositionalEncoding(config.d_model, config.max_positions)
    if config.positional == "learned":
        return LearnedPositionalEmbedding(config.d_model, config.max_positions)
    return None


def normalization(config: TransformerConfig) -> nn.Module:
    """The normalization of the residual stream: ``LayerNorm(D)`` (Ba et al. 2016)."""
    return nn.LayerNorm(config.d_model)


def _attention(config: TransformerConfig, self_attention: bool) -> MultiHeadAttention:
    """Self- or cross-attention of ``config``; rotary positions rotate self-attention only."""
    rotary = self_attention and config.positional == "rotary"
    return MultiHeadAttention(
        config.d_model,
        config.n_heads,
        config.attention_dropout,
        self_attention=self_attention,
        rotary_max_positions=config.max_positions if rotary else None,
    )


_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``W2 act(W1 x + b1) + b2`` (Vaswani et al. 2017,
    Eq. 2) of width ``config.d_ff``, with Xavier-uniform weights, zero biases and
    ``config.activation_dropout`` on the hidden activation. ``act`` is ReLU, GELU (the exact
    erf form, Hendrycks & Gimpel 2016) or SiLU ``x * sigmoid(x)`` (Elfwing et al. 2018).

    Args:
        config: the architecture.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.activation = config.activation
        self._act = _ACTIVATIONS[config.activation]
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.dropout = nn.Dropout(config.activation_dropout)
        for lin in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, T, D)`` -> ``(B, T, D)``."""
        hidden = self.fc1(x)
        hidden = self._act(hidden)
        return self.fc2(self.dropout(hidden))


def feed_forward_residual(
    x: Tensor, ff: FeedForward, norm: nn.Module, dropout: nn.Module, pre_ln: bool, index=None
) -> Tensor:
    """The feed-forward sub-layer with its residual connection and normalization.

    Pre-LN: ``x + Drop(FF(LN(x)))``; Post-LN: ``LN(x + Drop(FF(x)))``. With ``index`` the
    sub-layer runs on those rows of the flattened ``(B * L, D)`` input only (the real tokens):
    padding rows keep ``x`` (Pre-LN) or ``LN(x)`` (Post-LN), meaningless values that are never
    attended to nor scored; real rows get the values computed without ``index``, up to the
    rounding of the matrix products.

    Args:
        x: ``(B, L, D)`` states.
        ff: the feed-forward network.
        norm: its normalization.
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
    ``x = x + Drop(SubLayer(LN(x)))`` (Xiong et al. 2020). ``config.norm_first`` chooses.

    Args:
        config: the architecture.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = _attention(config, self_attention=True)
        self.ff = FeedForward(config)
        self.norm1 = normalization(config)
        self.norm2 = normalization(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None, index: Tensor | None = None) -> Tensor:
        """Args: x ``(B, S, D)``; mask ``(B, 1, 1, S)`` key padding mask; index ``(N,)``
        real-token positions in the flattened ``(B * S)`` layout, where the feed-forward
        sub-layer is computed (all when ``None``, see :func:`feed_forward_residual`).
        Returns ``(B, S, D)``."""
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)))
        return feed_forward_residual(x, self.ff, self.norm2, self.dropout, self.norm_first, index)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over the encoder memory and feed-forward
    sub-layers (Vaswani et al. 2017, Sec. 3.1), Pre-LN or Post-LN as in :class:`EncoderLayer`.

    Args:
        config: the architecture.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = _attention(config, self_attention=True)
        self.cross_attn = _attention(config, self_attention=False)
        self.ff = FeedForward(config)
        self.norm1 = normalization(config)
        self.norm2 = normalization(config)
        self.norm3 = normalization(config)
        self.dropout = nn.Dropout(config.dropout)

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
            src_mask: ``(B, 1, 1, S)`` source key padding mask.
            cache: ``(self_attention_cache, cross_attention_cache)`` for incremental decoding.
            index: ``(N,)`` real-token positions in the flattened ``(B * T)`` layout, as in
                :meth:`EncoderLayer.forward`.

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
