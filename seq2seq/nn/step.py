"""A cached decoding step written out for one position per row: the ``step`` trick of
:mod:`seq2seq.nn.fast` (``fast.enabled(False, "step")`` switches it off).

:meth:`~seq2seq.nn.transformer.Transformer.decode` takes it for float32 CPU inference
(:func:`use_decoder_step`); its plain counterpart is the decoder's modules, layer by layer
(:class:`~seq2seq.nn.layers.DecoderLayer`). A cached step through the modules makes about 220
operator calls and 60 module calls from Python, a fixed cost per step larger than the products'
at small row counts; written out, with the modules' weights looked up once per search, it makes
far fewer (the ablation row "ours float32 -step" of ``benchmarks/cpu_bf16.py`` measures it).
Shapes follow the legend of :mod:`seq2seq.nn.attention`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from seq2seq.nn import fast
from seq2seq.nn.attention import attend_first_if_empty
from seq2seq.nn.kv_cache import DecoderCache, KVCache

__all__ = ["decoder_step", "use_decoder_step"]


def use_decoder_step(decoder: nn.Module, tgt: Tensor) -> bool:
    """Whether a cached decoding step of ``tgt`` ``(B, T)`` takes :func:`decoder_step`: the
    ``step`` trick on, one new position per row, float32 CPU inference (eval mode, autograd and
    autocast off), no attention weights being recorded."""
    return (
        fast.is_enabled("step")
        and tgt.size(1) == 1
        and tgt.device.type == "cpu"
        and not decoder.training
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
        and decoder.embed.weight.dtype == torch.float32
        and not torch.compiler.is_compiling()
        and not any(
            layer.self_attn.record_weights or layer.cross_attn.record_weights
            for layer in decoder.layers
        )
    )


def decoder_step(
    decoder: nn.Module,
    tgt: Tensor,
    memory: Tensor | None,
    src_mask: Tensor | None,
    cache: DecoderCache,
) -> Tensor:
    """``decoder(tgt, memory, src_mask, cache)[:, 0]`` for one new position per row: the
    arithmetic of :class:`~seq2seq.nn.layers.DecoderLayer` (Pre-LN or Post-LN, any activation
    and positions) written out for a single query. The layers' weights are looked up at the
    cache's first step (one search), so changing them in place between the steps of one cache
    is not seen.

    Args:
        decoder: a :class:`~seq2seq.nn.transformer.Decoder` in eval mode.
        tgt: ``(B, 1)`` long ids of the new position.
        memory: ``(G, S, D)`` encoder output, or ``None`` once the cache holds the
            cross-attention keys/values.
        src_mask: ``(G, 1, 1, S)`` bool source mask or ``None``; ``G = B / group`` rows (the
            sentences whose beams share a cross-attention row, ``KVCache.group``).
        cache: the :class:`~seq2seq.nn.kv_cache.DecoderCache`, updated in place.

    Returns:
        ``(B, D)`` final decoder states (of the one position).

    Raises:
        ValueError: with ``memory=None`` and empty cross-attention caches.
    """
    if cache.step_plan is None or cache.step_plan.decoder is not decoder:
        cache.step_plan = _StepPlan(decoder, [_StepLayer.of(layer) for layer in decoder.layers])
    # (B, D) states: oneDNN's product of a 2-D input costs about 20 µs less per call than of
    # the (B, 1, D) one
    x = decoder.embed_tokens(tgt, cache.length).squeeze(1)
    bias = _source_bias(cache, src_mask, x.dtype)
    for p, (self_kv, cross_kv) in zip(cache.step_plan.layers, cache.layers, strict=True):
        # Pre-LN: x + f(LN(x)); Post-LN: LN(x + f(x))
        h = _self_attention(p, p.norm1(x) if p.pre else x, self_kv)
        x = x + h if p.pre else p.norm1(x + h)
        h = _cross_attention(p, p.norm2(x) if p.pre else x, memory, bias, cross_kv)
        x = x + h if p.pre else p.norm2(x + h)
        hidden = p.ff_activation(_product(p.norm3(x) if p.pre else x, *p.fc1))
        h = _product(hidden, *p.fc2)
        x = x + h if p.pre else p.norm3(x + h)
    return decoder.norm(x)


_product = fast.inference_product


def _source_bias(cache: DecoderCache, src_mask: Tensor | None, dtype: torch.dtype):
    """``(G, 1, 1, S)`` additive cross-attention bias of ``src_mask``: 0 where a key may be
    attended to, -inf where not; kept in ``cache.step_plan`` while the search passes the same
    mask (a new one after sentences leave), which saves 9 operator calls a step."""
    plan = cache.step_plan
    if src_mask is None:
        return None
    if plan.mask is not src_mask or plan.bias is None or plan.bias.dtype != dtype:
        bias = torch.zeros(src_mask.shape, dtype=dtype, device=src_mask.device)
        bias.masked_fill_(~attend_first_if_empty(src_mask), float("-inf"))
        cache.step_plan = plan = plan._replace(mask=src_mask, bias=bias)
    return plan.bias


def _norm(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """``module`` as a function; a ``LayerNorm`` as ``torch.layer_norm`` of its parameters
    (``F.layer_norm`` without its Python checks, 10 calls a step of the README model)."""
    if type(module) is not nn.LayerNorm:
        return module
    shape, weight, bias, eps = module.normalized_shape, module.weight, module.bias, module.eps
    return lambda x: torch.layer_norm(x, shape, weight, bias, eps)


def _identity(x: Tensor) -> Tensor:
    return x


class _StepPlan(NamedTuple):
    """What :func:`decoder_step` keeps in ``DecoderCache.step_plan`` for one search."""

    decoder: nn.Module  # the decoder the layers were read from
    layers: list[_StepLayer]
    mask: Tensor | None = None  # the last source mask seen, and its additive bias
    bias: Tensor | None = None


class _StepLayer(NamedTuple):
    """A :class:`~seq2seq.nn.layers.DecoderLayer` as :func:`decoder_step` reads it."""

    pre: bool
    norm1: Callable[[Tensor], Tensor]
    norm2: Callable[[Tensor], Tensor]
    norm3: Callable[[Tensor], Tensor]
    self_attn: nn.Module
    cross_attn: nn.Module
    qkv: fast.Operands
    self_out: fast.Operands
    q: fast.Operands
    kv: fast.Operands
    cross_out: fast.Operands
    fc1: fast.Operands  # post="relu" when the activation is ReLU
    fc2: fast.Operands
    ff_activation: Callable[[Tensor], Tensor]

    @classmethod
    def of(cls, layer: nn.Module) -> _StepLayer:
        sa, ca, ff = layer.self_attn, layer.cross_attn, layer.ff
        operands = fast.inference_operands
        fc1, activation = operands(ff.fc1), ff._act
        if ff.activation == "relu":
            fc1, activation = fc1._replace(post="relu"), _identity
        return cls(
            layer.norm_first, _norm(layer.norm1), _norm(layer.norm2), _norm(layer.norm3), sa, ca,
            operands(sa.qkv), operands(sa.out), operands(ca.q), operands(ca.kv), operands(ca.out),
            fc1, operands(ff.fc2), activation,
        )  # fmt: skip


def _self_attention(p: _StepLayer, h: Tensor, cache: KVCache) -> Tensor:
    """Self-attention of ``(B, D)`` new positions over the cached ones and themselves."""
    b, heads, dh = h.size(0), p.self_attn.n_heads, p.self_attn.head_dim
    qkv = _product(h, *p.qkv).view(b, 3, heads, 1, dh)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # (B, H, 1, Dh)
    rotary = p.self_attn.rotary
    if rotary is not None:
        q, k = rotary(q, cache.length), rotary(k, cache.length)
    k, v = cache.append(k, v)  # (B, H, L, Dh)
    return _product(fast.one_query_attention(q, k, v).view(b, heads * dh), *p.self_out)


def _cross_attention(
    p: _StepLayer, h: Tensor, memory: Tensor | None, bias: Tensor | None, cache: KVCache
) -> Tensor:
    """Cross-attention of ``(B, D)`` queries, ``cache.group`` of them per stored row."""
    if cache.is_empty:
        if memory is None:
            raise ValueError("cross-attention needs key_value (or a filled cache)")
        cache.set_static(*p.cross_attn._heads(_product(memory, *p.kv), 2))
    b, g = h.size(0), cache.group
    heads, dh = p.cross_attn.n_heads, p.cross_attn.head_dim
    q = _product(h, *p.q).view(b // g, g, heads, dh).transpose(1, 2)  # (G, H, g, Dh)
    scores = fast.batched_product(q, cache.keys.transpose(-2, -1))  # (G, H, g, S)
    scores = scores.mul_(dh**-0.5) if bias is None else torch.add(bias, scores, alpha=dh**-0.5)
    out = fast.batched_product(scores.softmax(dim=-1), cache.values)  # (G, H, g, Dh)
    return _product(out.transpose(1, 2).reshape(b, heads * dh), *p.cross_out)
