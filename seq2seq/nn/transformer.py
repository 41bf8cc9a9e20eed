"""Encoder-decoder Transformer (Vaswani et al. 2017) with ``encode()`` / ``decode()``.

Shapes and masks follow :mod:`seq2seq.nn.attention`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from seq2seq.nn import fast, step
from seq2seq.nn.attention import MultiHeadAttention
from seq2seq.nn.config import TransformerConfig
from seq2seq.nn.kv_cache import DecoderCache
from seq2seq.nn.layers import (
    DecoderLayer,
    EncoderLayer,
    check_length,
    normalization,
    positional_encoding,
)

__all__ = ["SDPA_BACKENDS", "Decoder", "Encoder", "Transformer"]

# Attention kernels that encode() and decode() let F.scaled_dot_product_attention choose from.
# cuDNN attention is left out: it builds an execution plan for every new input shape (seconds
# over a decoding run, where each step has a new key length, and again for every new batch shape
# in length-bucketed training), which outweighs its speed at a fixed shape.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class _Stack(nn.Module):
    """Shared part of encoder and decoder: token embedding (times ``sqrt(D)`` with
    ``config.scale_embedding``) + positions + dropout, then
    ``n_layers`` layers of class ``layer`` and a final normalization when Pre-LN."""

    def __init__(
        self, config: TransformerConfig, embed: nn.Embedding, layer: type, n_layers: int
    ) -> None:
        super().__init__()
        self.embed = embed
        self.d_model = config.d_model
        self.scale = math.sqrt(self.d_model) if config.scale_embedding else 1.0
        self.max_positions = config.max_positions
        self.positions = positional_encoding(config)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(layer(config) for _ in range(n_layers))
        self.norm = normalization(config) if config.norm_first else nn.Identity()

    def embed_tokens(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """``(B, L)`` ids -> ``(B, L, D)``: ``sqrt(D) * E[x] + P[offset:offset+L]``, dropout
        (Vaswani et al. 2017, Sec. 3.4-3.5); ``E[x]`` unscaled without
        ``config.scale_embedding``, no ``P`` with rotary positions."""
        x = self.embed(tokens)
        if self.scale != 1.0:
            x = x * self.scale
        if self.positions is None:  # rotary: positions enter in self-attention
            check_length(offset + tokens.size(1), self.max_positions)
            return self.dropout(x)
        return self.dropout(x + self.positions(tokens.size(1), offset).to(x.dtype))


class Encoder(_Stack):
    """Stack of ``config.n_encoder_layers`` :class:`EncoderLayer`, with a final normalization
    when Pre-LN.

    Args:
        config: the architecture.
        embed: source token embedding (possibly shared).
    """

    def __init__(self, config: TransformerConfig, embed: nn.Embedding) -> None:
        super().__init__(config, embed, EncoderLayer, config.n_encoder_layers)

    def forward(
        self, src: Tensor, src_mask: Tensor | None = None, index: Tensor | None = None
    ) -> Tensor:
        """``(B, S)`` ids, ``(B, 1, 1, S)`` mask, optional ``(N,)`` real-token positions
        (see :meth:`EncoderLayer.forward`) -> ``(B, S, D)`` memory."""
        x = self.embed_tokens(src)
        for layer in self.layers:
            x = layer(x, src_mask, index)
        return self.norm(x)


class Decoder(_Stack):
    """Stack of ``config.n_decoder_layers`` :class:`DecoderLayer`, with a final normalization
    when Pre-LN.

    Args:
        config: the architecture.
        embed: target token embedding (possibly shared).
    """

    def __init__(self, config: TransformerConfig, embed: nn.Embedding) -> None:
        super().__init__(config, embed, DecoderLayer, config.n_decoder_layers)

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        index: Tensor | None = None,
    ) -> Tensor:
        """``(B, T)`` ids -> ``(B, T, D)`` final decoder states (see ``Transformer.decode``;
        ``index`` as in :meth:`DecoderLayer.forward`)."""
        offset = cache.length if cache is not None else 0
        x = self.embed_tokens(tgt, offset)
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, src_mask, cache.layers[i] if cache is not None else None, index)
        return self.norm(x)


class Transformer(nn.Module):
    """Encoder-decoder Transformer for translation (Vaswani et al. 2017).

    Linear weights are Xavier-uniform with zero biases (Vaswani et al. 2017 / tensor2tensor);
    embeddings are ``N(0, d_model^-0.5)`` with a zero padding row (as in fairseq); the output
    projection has no bias, or with ``config.output_bias`` the zero-initialised ``(V,)``
    parameter :attr:`output_bias` added to the logits. Logits cover the real ``vocab_size``
    only. Attention runs through ``F.scaled_dot_product_attention`` restricted to
    :data:`SDPA_BACKENDS`.

    Args:
        config: the architecture (:class:`~seq2seq.nn.config.TransformerConfig`).
        pad_id: padding token id (zero embedding row, no gradient); SentencePiece's is 0.
        pad_vocab_to_multiple_of: the embedding and output matrices get a multiple of this
            many rows (faster matrix products); the extra rows are never used. 1 disables it.
        **fields: instead of ``config``, its fields as keywords
            (``Transformer(vocab_size=8000, d_model=256)``; the others keep their defaults).

    Raises:
        ValueError: for both ``config`` and ``fields``, a ``pad_id`` outside the vocabulary, or
            the fields :class:`~seq2seq.nn.config.TransformerConfig` refuses.
    """

    def __init__(
        self,
        config: TransformerConfig | None = None,
        *,
        pad_id: int = 0,
        pad_vocab_to_multiple_of: int = 8,
        **fields: Any,
    ) -> None:
        super().__init__()
        if config is not None and fields:
            raise ValueError("give Transformer a TransformerConfig or its fields, not both")
        config = TransformerConfig(**fields) if config is None else config
        if not 0 <= pad_id < config.vocab_size:
            raise ValueError(f"pad_id ({pad_id}) must lie in [0, vocab_size={config.vocab_size})")
        self.config = config
        self.vocab_size = config.vocab_size
        self.d_model = config.d_model
        self.pad_id = pad_id
        self.max_positions = config.max_positions
        multiple = max(1, pad_vocab_to_multiple_of)
        self.padded_vocab_size = -(-config.vocab_size // multiple) * multiple

        tgt_embed = self._embedding(config.d_model, pad_id)
        src_embed = (
            tgt_embed if config.tie_embeddings == "all" else self._embedding(config.d_model, pad_id)
        )
        self.encoder = Encoder(config, src_embed)
        self.decoder = Decoder(config, tgt_embed)
        self.output = nn.Linear(config.d_model, self.padded_vocab_size, bias=False)
        if config.tie_embeddings == "none":
            nn.init.normal_(self.output.weight, mean=0.0, std=config.d_model**-0.5)
        else:
            self.output.weight = tgt_embed.weight
        # Over the real vocabulary (the padded logits are cut first); None when off.
        self.output_bias = (
            nn.Parameter(torch.zeros(config.vocab_size)) if config.output_bias else None
        )
        fast.install(self)  # the measured speed tricks (seq2seq.nn.fast); same weights

    def _embedding(self, d_model: int, pad_id: int) -> nn.Embedding:
        embed = nn.Embedding(self.padded_vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(embed.weight, mean=0.0, std=d_model**-0.5)
        nn.init.zeros_(embed.weight[pad_id])
        return embed

    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, src_index: Tensor | None = None
    ) -> Tensor:
        """Encode a batch of source sentences.

        Args:
            src: ``(B, S)`` long token ids (right-padded).
            src_mask: ``(B, 1, 1, S)`` key padding mask (:func:`~seq2seq.nn.padding_mask`).
            src_index: optional ``(N,)`` long positions of the real tokens
                (``src_mask.flatten().nonzero()``, best computed on the host with the batch):
                the feed-forward sub-layers then skip the padding rows
                (:func:`seq2seq.nn.layers.feed_forward_residual`).

        Returns:
            ``(B, S, D)`` memory (values at padding positions are meaningless).

        Raises:
            ValueError: if ``S > max_positions``.
        """
        check_length(src.size(1), self.max_positions)
        with sdpa_kernel(SDPA_BACKENDS):
            return self.encoder(src, src_mask, src_index)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        output_index: Tensor | None = None,
    ) -> Tensor:
        """Next-token logits for a batch of (shifted) target prefixes.

        Args:
            tgt: ``(B, T)`` long decoder input, starting with BOS (right-padded). With a cache:
                only the new step(s); their positions continue from ``cache.length``.
            memory: ``(B, S, D)`` output of :meth:`encode`. May be ``None`` once ``cache`` holds
                the cross-attention keys/values (after the first cached call).
            src_mask: the source mask given to :meth:`encode`.
            cache: incremental decoding state from :meth:`new_cache`, updated in place.
            output_index: ``(N,)`` long positions of ``(B * T)`` (e.g. the real targets,
                ``(tgt_out.flatten() != pad).nonzero()``, computed on the host so that the step
                does not synchronise): the output projection, a training step's largest
                product, runs for these only.

        Returns:
            ``(B, T, V)`` logits over the real vocabulary (dtype of the computation), or
            ``(N, V)`` logits at ``output_index`` when it is given.

        Raises:
            ValueError: if the decoded positions would exceed ``max_positions``.
        """
        if cache is not None and output_index is None and step.use_decoder_step(self.decoder, tgt):
            logits = self.output(step.decoder_step(self.decoder, tgt, memory, src_mask, cache))
            logits = logits.unsqueeze(1)
        else:
            logits = self.output(self._states(tgt, memory, src_mask, cache, output_index))
        if self.padded_vocab_size != self.vocab_size:
            logits = logits[..., : self.vocab_size]
        if self.output_bias is not None:  # in the logits' dtype, as the product's own bias
            logits = logits + self.output_bias.to(logits.dtype)
        return logits

    @property
    def output_weight(self) -> Tensor:
        """``(V, D)`` output projection over the real vocabulary (a view of the padded one).
        The logits are ``h @ output_weight.T + output_bias`` (:attr:`output_bias` ``(V,)``
        float, or ``None`` without ``config.output_bias``)."""
        return self.output.weight[: self.vocab_size]

    def features(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        output_index: Tensor | None = None,
        src_index: Tensor | None = None,
        tgt_index: Tensor | None = None,
    ) -> Tensor:
        """Teacher-forced final decoder states, before the output projection.

        Pair with :func:`seq2seq.nn.linear_label_smoothed_cross_entropy`, :attr:`output_weight`
        and :attr:`output_bias` to train without materialising the logits.

        Args:
            src: ``(B, S)`` long source ids.
            tgt: ``(B, T)`` long decoder input (BOS + target without its last token).
            src_mask, src_index: as for :meth:`encode`.
            output_index: ``(N,)`` long positions of ``(B * T)`` to keep; ``None`` = all.
            tgt_index: ``(M,)`` long positions of the real decoder inputs in ``(B * T)``, where
                the decoder's feed-forward sub-layers run (for right-padded teacher forcing,
                the usual ``output_index``).

        Returns:
            ``(B, T, D)`` states, or ``(N, D)`` with ``output_index``.

        Raises:
            ValueError: if ``S`` or ``T`` exceeds ``max_positions``.
        """
        check_length(tgt.size(1), self.max_positions)
        memory = self.encode(src, src_mask, src_index)
        return self._states(tgt, memory, src_mask, None, output_index, tgt_index)

    def _states(self, tgt, memory, src_mask, cache, output_index, tgt_index=None) -> Tensor:
        """Final decoder states ``(B, T, D)``, or ``(N, D)`` at ``output_index``."""
        with sdpa_kernel(SDPA_BACKENDS):
            h = self.decoder(tgt, memory, src_mask, cache, tgt_index)
        if output_index is not None:
            h = h.flatten(0, 1).index_select(0, output_index)
        return h

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        output_index: Tensor | None = None,
    ) -> Tensor:
        """Teacher-forced logits: ``decode(tgt, encode(src, src_mask), src_mask)``.

        Args:
            src: ``(B, S)`` long source ids.
            tgt: ``(B, T)`` long decoder input (BOS + target without its last token).
            src_mask: as for :meth:`encode`.
            output_index: positions to compute logits for, as for :meth:`decode`.

        Returns:
            ``(B, T, V)`` logits, or ``(N, V)`` with ``output_index``.

        Raises:
            ValueError: if ``S`` or ``T`` exceeds ``max_positions``.
        """
        check_length(tgt.size(1), self.max_positions)
        return self.decode(tgt, self.encode(src, src_mask), src_mask, output_index=output_index)

    @torch.no_grad()
    def attention_maps(
        self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None
    ) -> dict[str, Tensor]:
        """Attention probabilities of every layer for one teacher-forced pass, for visualisation.

        Runs :meth:`encode` and :meth:`decode` once without gradients (the caller chooses
        train/eval mode; use eval mode for dropout-free maps) and returns
        ``softmax(Q K^T / sqrt(Dh) + M)`` of each attention module, computed with the same masks
        as the fused attention (padded source keys and future target keys get exactly zero).

        Args:
            src: ``(B, S)`` long source ids.
            tgt: ``(B, T)`` long decoder input (BOS + target prefix).
            src_mask: as for :meth:`encode`.

        Returns:
            float32 tensors keyed ``"encoder.{i}.self"`` ``(B, H, S, S)``,
            ``"decoder.{i}.self"`` ``(B, H, T, T)`` and ``"decoder.{i}.cross"`` ``(B, H, T, S)``
            for each layer ``i`` (0-based).

        Raises:
            ValueError: if ``S`` or ``T`` exceeds ``max_positions``.
        """
        modules: dict[str, MultiHeadAttention] = {}
        for i, layer in enumerate(self.encoder.layers):
            modules[f"encoder.{i}.self"] = layer.self_attn
        for i, layer in enumerate(self.decoder.layers):
            modules[f"decoder.{i}.self"] = layer.self_attn
            modules[f"decoder.{i}.cross"] = layer.cross_attn
        for mha in modules.values():
            mha.record_weights = True
        try:
            self(src, tgt, src_mask)
            return {name: mha.weights for name, mha in modules.items()}
        finally:
            for mha in modules.values():
                mha.record_weights, mha.weights = False, None

    def new_cache(self, capacity: int = 64) -> DecoderCache:
        """Empty incremental-decoding state for :meth:`decode`.

        Args:
            capacity: target positions to preallocate (the cache grows past it if needed).

        Returns:
            A :class:`~seq2seq.nn.kv_cache.DecoderCache` with one self- and one
            cross-attention cache per decoder layer.
        """
        return DecoderCache(len(self.decoder.layers), capacity, fast.self_attention_cache())
