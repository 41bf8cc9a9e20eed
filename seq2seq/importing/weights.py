"""Hugging Face weights as the parameters of :class:`seq2seq.nn.Transformer`: the exact inverse
of :func:`seq2seq.export.huggingface.state_dict`.

Two fixed permutations take the source's computation into ours:

* the vocabulary: our id ``i`` is the source's ``hf_ids[i]`` (the tokenizer's
  :attr:`~seq2seq.data.vocabulary.VocabularyTokenizer.hf_ids`), so embedding and output rows
  and the logits bias are taken in that order: ``W_ours = W_hf[hf_ids]``;
* the ``d_model`` axis, for the classes whose sinusoids lay the features out sin-half |
  cos-half (Marian, Pegasus): with ``P`` the permutation the export applies
  (``x_hf = x_ours[..., P]``) and ``Q`` its inverse, a map reading the residual stream takes
  ``W[:, Q]``, one writing it ``W[Q]`` (and its bias ``b[Q]``), a LayerNorm ``w[Q]``, ``b[Q]``.
  M2M-100's fairseq table is ours as it is (``Q`` is the identity).

Attention projections are fused as ours are: ``qkv = [q; k; v]`` (self-attention), ``q`` and
``kv = [k; v]`` (cross-attention).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from seq2seq.nn import Transformer, TransformerConfig

__all__ = ["convert_weights"]

#: Where each class keeps its token embeddings and output projection, in the order looked for
#: (``save_pretrained`` writes one name of a tied matrix only; which one varies by version).
_SHARED = ("model.shared.weight",)
_SOURCE = ("model.encoder.embed_tokens.weight",)
_TARGET = ("model.decoder.embed_tokens.weight",)
_OUTPUT = ("lm_head.weight",)


def convert_weights(
    weights: Mapping[str, torch.Tensor],
    config: TransformerConfig,
    hf_ids: Sequence[int],
    permuted: bool,
    where: str,
) -> dict[str, torch.Tensor]:
    """Our ``Transformer`` state dict (without the ``model.`` prefix) from Hugging Face
    weights.

    Args:
        weights: the source's tensors by name (``model.encoder.layers.0.fc1.weight``, ...).
        config: the architecture they are imported as (:func:`.huggingface.model_settings`).
        hf_ids: the source id of each of our ids, ``len(hf_ids) == config.vocab_size``.
        permuted: apply the inverse of the sinusoid layout permutation to the ``d_model``
            axis (Marian, Pegasus).
        where: the folder, named in errors.

    Returns:
        float32 tensors, keyed and shaped as ``Transformer(config).state_dict()`` (embedding
        and output rows padded with zeros to its multiple of 8).

    Raises:
        ValueError: naming the folder and tensor, for a missing tensor, one of another shape
            than ``config`` gives, or tensors left over (the source computes something the
            import would drop).
    """
    d = config.d_model
    if permuted:
        p = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
        q = torch.argsort(p)
    else:
        q = torch.arange(d)
    ids = torch.as_tensor(list(hf_ids), dtype=torch.long)
    used: set[str] = set()

    def take(names: Sequence[str] | str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        names = (names,) if isinstance(names, str) else names
        for name in names:
            if name in weights:
                used.add(name)
                value = weights[name]
                if shape is not None and tuple(value.shape) != shape:
                    raise ValueError(
                        f"{where}: {name} has shape {tuple(value.shape)}, but config.json "
                        f"gives {shape}"
                    )
                return value
        raise ValueError(f"{where}: the weights have no {' or '.join(names)}")

    out: dict[str, torch.Tensor] = {}
    vocab = config.vocab_size

    def rows(names: Sequence[str]) -> torch.Tensor:  # a vocabulary matrix, our id order
        return take(names, (vocab, d))[ids][:, q]

    tie = config.tie_embeddings
    target = rows(_SHARED + _TARGET + _SOURCE + _OUTPUT if tie == "all" else _TARGET + _SHARED)
    out["decoder.embed.weight"] = target
    out["encoder.embed.weight"] = target if tie == "all" else rows(_SOURCE + _SHARED)
    out["output.weight"] = target if tie != "none" else rows(_OUTPUT)
    if tie == "all":  # every other name of the one matrix
        used.update(n for n in _SHARED + _SOURCE + _TARGET + _OUTPUT if n in weights)
    elif tie == "decoder":
        used.update(n for n in _OUTPUT if n in weights)
    bias = weights.get("final_logits_bias")
    if bias is not None:
        used.add("final_logits_bias")
        if config.output_bias:
            out["output_bias"] = bias.reshape(-1)[ids]

    for stack, n_layers in (
        ("encoder", config.n_encoder_layers),
        ("decoder", config.n_decoder_layers),
    ):
        for i in range(n_layers):
            hf, ours = f"model.{stack}.layers.{i}", f"{stack}.layers.{i}"
            _layer(out, take, hf, ours, stack == "decoder", q, d, config.d_ff)
        if config.norm_first:
            _norm(out, take, f"model.{stack}.layer_norm", f"{stack}.norm", q, d)
    left = sorted(k for k in weights if k not in used and "embed_positions" not in k)
    if left:
        raise ValueError(
            f"{where}: the weights hold tensors that a seq2seq Transformer of this config has "
            f"no place for: {', '.join(left[:4])}{' ...' if len(left) > 4 else ''}"
        )
    return _padded(out, config)


def _norm(out, take: Callable, hf: str, ours: str, q: torch.Tensor, d: int) -> None:
    out[f"{ours}.weight"] = take(f"{hf}.weight", (d,))[q]
    out[f"{ours}.bias"] = take(f"{hf}.bias", (d,))[q]


def _layer(out, take: Callable, hf: str, ours: str, decoder: bool, q, d: int, d_ff: int) -> None:
    """One encoder or decoder layer (the export's per-layer mapping, inverted)."""

    def fused(prefix: str, parts: str) -> tuple[torch.Tensor, torch.Tensor]:
        weight = torch.cat([take(f"{prefix}.{p}_proj.weight", (d, d)) for p in parts])
        bias = torch.cat([take(f"{prefix}.{p}_proj.bias", (d,)) for p in parts])
        return weight[:, q], bias  # reads the residual stream

    def writes(name: str, prefix: str, rows: int) -> None:
        out[f"{name}.weight"] = take(f"{prefix}.weight", (d, rows))[q]
        out[f"{name}.bias"] = take(f"{prefix}.bias", (d,))[q]

    out[f"{ours}.self_attn.qkv.weight"], out[f"{ours}.self_attn.qkv.bias"] = fused(
        f"{hf}.self_attn", "qkv"
    )
    writes(f"{ours}.self_attn.out", f"{hf}.self_attn.out_proj", d)
    _norm(out, take, f"{hf}.self_attn_layer_norm", f"{ours}.norm1", q, d)
    if decoder:
        out[f"{ours}.cross_attn.q.weight"], out[f"{ours}.cross_attn.q.bias"] = fused(
            f"{hf}.encoder_attn", "q"
        )
        out[f"{ours}.cross_attn.kv.weight"], out[f"{ours}.cross_attn.kv.bias"] = fused(
            f"{hf}.encoder_attn", "kv"
        )
        writes(f"{ours}.cross_attn.out", f"{hf}.encoder_attn.out_proj", d)
        _norm(out, take, f"{hf}.encoder_attn_layer_norm", f"{ours}.norm2", q, d)
    out[f"{ours}.ff.fc1.weight"] = take(f"{hf}.fc1.weight", (d_ff, d))[:, q]
    out[f"{ours}.ff.fc1.bias"] = take(f"{hf}.fc1.bias", (d_ff,))
    writes(f"{ours}.ff.fc2", f"{hf}.fc2", d_ff)
    _norm(out, take, f"{hf}.final_layer_norm", f"{ours}.norm{3 if decoder else 2}", q, d)


def _padded(weights: dict[str, torch.Tensor], config: TransformerConfig) -> dict[str, torch.Tensor]:
    """``weights`` as ``Transformer(config).state_dict()`` holds them: every key of it, the
    vocabulary matrices padded with zero rows to its padded vocabulary size.

    Raises:
        ValueError: for a key the model has and ``weights`` lacks, or one too many (a fault of
            this mapping, not of the source).
    """
    reference = Transformer(config).state_dict()
    missing = sorted(set(reference) - set(weights))
    extra = sorted(set(weights) - set(reference))
    if missing or extra:
        raise ValueError(f"the weight mapping is incomplete: missing {missing}, extra {extra}")
    result = {}
    for key, template in reference.items():
        value = weights[key].detach().float().contiguous()
        if value.shape != template.shape:  # rows padded to a multiple of 8 (never used)
            padded = torch.zeros(template.shape, dtype=torch.float32)
            padded[: value.size(0)] = value
            value = padded
        result[key] = value.clone()
    return result
