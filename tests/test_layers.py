"""The blocks built from a TransformerConfig: every field reaches them, seeded construction
is deterministic, and the state-dict keys stay those of saved checkpoints."""

from __future__ import annotations

import pytest
import torch

from seq2seq.nn import MultiHeadAttention, Transformer, TransformerConfig, padding_mask
from seq2seq.nn.layers import (
    FairseqSinusoidalPositionalEncoding,
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
)

PAD, BOS = 0, 2


# Two architectures that differ in every field of TransformerConfig, and a third with the
# choices neither has.
CONFIGS = [
    TransformerConfig(
        vocab_size=37, d_model=24, n_heads=3, n_encoder_layers=2, n_decoder_layers=3, d_ff=40,
        dropout=0.15, attention_dropout=0.05, activation_dropout=0.25, activation="gelu",
        norm_first=False, positional="rotary", max_positions=19, tie_embeddings="decoder",
        scale_embedding=False, output_bias=True,
    ),
    TransformerConfig(
        vocab_size=29, d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=64,
        dropout=0.0, attention_dropout=0.1, activation_dropout=0.0, activation="relu",
        norm_first=True, positional="learned", max_positions=32, tie_embeddings="none",
        scale_embedding=True, output_bias=False,
    ),
    TransformerConfig(
        vocab_size=21, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=24,
        activation="silu", positional="sinusoidal_fairseq", max_positions=12,
        tie_embeddings="all", scale_embedding=False, output_bias=True,
    ),
]  # fmt: skip


def _blocks(model: Transformer):
    """(layers, attention modules, feed-forward modules, stacks) of a model."""
    stacks = [model.encoder, model.decoder]
    layers = [*model.encoder.layers, *model.decoder.layers]
    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    ff = [layer.ff for layer in layers]
    return layers, attention, ff, stacks


POSITIONS = {
    SinusoidalPositionalEncoding: "sinusoidal",
    FairseqSinusoidalPositionalEncoding: "sinusoidal_fairseq",
    LearnedPositionalEmbedding: "learned",
    type(None): "rotary",  # no table: positions rotate the queries and keys
}


def _positional(model: Transformer) -> set[str]:
    """The positional kind of each layer: its stack's table and its self-attention agree."""
    kinds = set()
    for stack in (model.encoder, model.decoder):
        table = POSITIONS[type(stack.positions)]
        for layer in stack.layers:
            rotary = layer.self_attn.rotary is not None
            kinds.add(table if rotary == (table == "rotary") else "mismatch")
    if any(layer.cross_attn.rotary is not None for layer in model.decoder.layers):
        kinds.add("rotary cross-attention")
    return kinds


def _tie(model: Transformer) -> set[str]:
    enc, dec, out = model.encoder.embed.weight, model.decoder.embed.weight, model.output.weight
    if enc is dec is out:
        return {"all"}
    return {"decoder" if dec is out else "none"} if enc is not dec else {"?"}


def _activation(model: Transformer) -> set[str]:
    """The activation each feed-forward network computes, found by its output."""
    x = torch.randn(2, 3, model.d_model)
    found = set()
    for ff in _blocks(model)[2]:
        ff.eval()
        for name, act in (
            ("relu", torch.relu),
            ("gelu", torch.nn.functional.gelu),
            ("silu", lambda h: h * torch.sigmoid(h)),
        ):
            if torch.allclose(ff(x), ff.fc2(act(ff.fc1(x)))):
                found.add(name)
    return found


def _scale_embedding(model: Transformer) -> set[bool]:
    """Whether each stack multiplies its token embeddings by ``sqrt(D)``, found by its output
    (eval mode, positions taken off)."""
    tokens = torch.tensor([[4, 5, 6]])
    found = set()
    for stack in _blocks(model)[3]:
        stack.eval()
        with torch.no_grad():
            x = stack.embed_tokens(tokens)
            if stack.positions is not None:
                x = x - stack.positions(tokens.size(1))
            e = stack.embed(tokens)
        for scaled, factor in ((True, model.d_model**0.5), (False, 1.0)):
            if torch.allclose(x, e * factor, atol=1e-6):
                found.add(scaled)
    return found


def _output_bias(model: Transformer) -> set[bool]:
    """Whether the logits carry a learned ``(V,)`` bias: a parameter whose change moves the
    logits by the same amount."""
    bias = model.output_bias
    if bias is None:
        return {False}
    model.eval()
    src, tgt = torch.full((1, 2), 4), torch.full((1, 1), BOS)
    with torch.no_grad():
        before = model(src, tgt)
        shift = torch.arange(model.vocab_size, dtype=bias.dtype)
        bias.add_(shift)
        moved = model(src, tgt) - before
        bias.sub_(shift)
    is_parameter = any(p is bias for p in model.parameters())
    return {is_parameter and bias.shape == (model.vocab_size,) and torch.allclose(moved, shift)}


FIELD_CHECKS = {
    "vocab_size": lambda m: {
        m.output_weight.size(0),
        m(torch.full((1, 2), 4), torch.full((1, 1), BOS)).size(-1),
    },
    "d_model": lambda m: (
        {a.d_model for a in _blocks(m)[1]}
        | {ff.fc1.in_features for ff in _blocks(m)[2]}
        | {n.normalized_shape[0] for n in m.modules() if isinstance(n, torch.nn.LayerNorm)}
    ),
    "n_heads": lambda m: {a.n_heads for a in _blocks(m)[1]},
    "n_encoder_layers": lambda m: {len(m.encoder.layers)},
    "n_decoder_layers": lambda m: {len(m.decoder.layers)},
    "d_ff": lambda m: {ff.fc1.out_features for ff in _blocks(m)[2]},
    "dropout": lambda m: (
        {layer.dropout.p for layer in _blocks(m)[0]} | {s.dropout.p for s in _blocks(m)[3]}
    ),
    "attention_dropout": lambda m: {a.dropout for a in _blocks(m)[1]},
    "activation_dropout": lambda m: {ff.dropout.p for ff in _blocks(m)[2]},
    "activation": _activation,
    "norm_first": lambda m: (
        {layer.norm_first for layer in _blocks(m)[0]}
        | {not isinstance(s.norm, torch.nn.Identity) for s in _blocks(m)[3]}
    ),
    "positional": _positional,
    "max_positions": lambda m: (
        {m.max_positions}
        | {s.max_positions for s in _blocks(m)[3]}
        | {a.rotary.max_positions for a in _blocks(m)[1] if a.rotary is not None}
    ),
    "tie_embeddings": _tie,
    "scale_embedding": _scale_embedding,
    "output_bias": _output_bias,
}


def test_every_config_field_is_checked():
    assert sorted(FIELD_CHECKS) == sorted(TransformerConfig.field_names())


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("field", sorted(FIELD_CHECKS))
def test_every_config_field_reaches_the_layers(config, field):
    """Each field of the config is what every block built from it uses."""
    model = Transformer(config)
    assert FIELD_CHECKS[field](model) == {getattr(config, field)}


@pytest.mark.parametrize("config", CONFIGS)
def test_seeded_construction_is_deterministic(config):
    """The same seed gives the same weights and outputs, from the config or its fields."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, config.vocab_size, (3, 7), generator=g)
    src[1, 4:] = PAD
    tgt = torch.randint(4, config.vocab_size, (3, 6), generator=g)

    def build(seed, **kwargs):
        torch.manual_seed(seed)
        model = Transformer(**kwargs).eval()
        with torch.no_grad():
            return model.state_dict(), model(src, tgt, padding_mask(src, PAD))

    weights, out = build(0, config=config)
    for again_weights, again_out in (build(0, config=config), build(0, **config.to_dict())):
        assert list(again_weights) == list(weights)
        assert all(torch.equal(again_weights[k], weights[k]) for k in weights)
        assert torch.equal(again_out, out)
    other, _ = build(1, config=config)
    assert not torch.equal(
        other["encoder.layers.0.ff.fc1.weight"], weights["encoder.layers.0.ff.fc1.weight"]
    )


# The state-dict keys and shapes checkpoints hold (D = 8, d_ff = 16, 32 vocabulary rows).
STATE_DICT = """
encoder.embed.weight 32,8        decoder.embed.weight 32,8
encoder.positions.weight 5,8     decoder.positions.weight 5,8
encoder.layers.0.self_attn.qkv.weight 24,8     decoder.layers.0.self_attn.qkv.weight 24,8
encoder.layers.0.self_attn.qkv.bias 24         decoder.layers.0.self_attn.qkv.bias 24
encoder.layers.0.self_attn.out.weight 8,8      decoder.layers.0.self_attn.out.weight 8,8
encoder.layers.0.self_attn.out.bias 8          decoder.layers.0.self_attn.out.bias 8
decoder.layers.0.cross_attn.q.weight 8,8       decoder.layers.0.cross_attn.q.bias 8
decoder.layers.0.cross_attn.kv.weight 16,8     decoder.layers.0.cross_attn.kv.bias 16
decoder.layers.0.cross_attn.out.weight 8,8     decoder.layers.0.cross_attn.out.bias 8
encoder.layers.0.ff.fc1.weight 16,8   encoder.layers.0.ff.fc1.bias 16
encoder.layers.0.ff.fc2.weight 8,16   encoder.layers.0.ff.fc2.bias 8
decoder.layers.0.ff.fc1.weight 16,8   decoder.layers.0.ff.fc1.bias 16
decoder.layers.0.ff.fc2.weight 8,16   decoder.layers.0.ff.fc2.bias 8
encoder.layers.0.norm1.weight 8  encoder.layers.0.norm1.bias 8
encoder.layers.0.norm2.weight 8  encoder.layers.0.norm2.bias 8
decoder.layers.0.norm1.weight 8  decoder.layers.0.norm1.bias 8
decoder.layers.0.norm2.weight 8  decoder.layers.0.norm2.bias 8
decoder.layers.0.norm3.weight 8  decoder.layers.0.norm3.bias 8
encoder.norm.weight 8  encoder.norm.bias 8  decoder.norm.weight 8  decoder.norm.bias 8
output.weight 32,8
"""


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("positional", ["sinusoidal", "sinusoidal_fairseq", "learned", "rotary"])
@pytest.mark.parametrize("tie", ["none", "decoder", "all"])
def test_state_dict_keys_and_shapes_stay_those_of_saved_checkpoints(norm_first, positional, tie):
    words = STATE_DICT.split()
    expected = {
        k: tuple(int(n) for n in s.split(",")) for k, s in zip(words[::2], words[1::2], strict=True)
    }
    if positional != "learned":  # sinusoidal tables are not saved; rotary has none
        expected = {k: s for k, s in expected.items() if ".positions." not in k}
    if not norm_first:  # Post-LN: no final normalization
        expected = {
            k: s for k, s in expected.items() if not k.startswith(("encoder.norm", "decoder.norm"))
        }
    model = Transformer(
        vocab_size=29, d_model=8, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=16,
        max_positions=5, norm_first=norm_first, positional=positional, tie_embeddings=tie,
    )  # fmt: skip
    # Tied matrices are saved under each name that holds them.
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected


def test_output_bias_adds_one_key_over_the_real_vocabulary_and_scale_embedding_none():
    """``output_bias=True`` adds ``output_bias`` ``(V,)`` (29, not the 32 padded rows) and
    nothing else; ``scale_embedding=False`` changes no key."""
    sizes = dict(vocab_size=29, d_model=8, n_heads=2, n_encoder_layers=1, n_decoder_layers=1)
    base = {k: tuple(v.shape) for k, v in Transformer(**sizes).state_dict().items()}
    biased = Transformer(**sizes, output_bias=True, scale_embedding=False).state_dict()
    assert {k: tuple(v.shape) for k, v in biased.items()} == {**base, "output_bias": (29,)}
    assert torch.count_nonzero(biased["output_bias"]) == 0  # zero-initialised


def test_fairseq_positions_are_those_of_hugging_face_m2m100():
    """Our ``sinusoidal_fairseq`` table added to real tokens of a right-padded source is what
    ``M2M100SinusoidalPositionalEmbedding`` adds there (pad id 1, so rows from 2), to the
    bit; cached steps continue from the cache length as Hugging Face's do."""
    m2m = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
    d_model, max_positions = 16, 40
    theirs = m2m.M2M100SinusoidalPositionalEmbedding(max_positions, d_model, padding_idx=1)
    ours = FairseqSinusoidalPositionalEncoding(d_model, max_positions)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 1, 1, 1, 1]])  # right padding
    real = ids != 1
    expected = theirs(ids)
    table = ours(ids.size(1)).expand(2, -1, -1)
    assert torch.equal(table[real], expected[real])
    assert torch.equal(ours(3, offset=30), theirs(ids[:1, :3], cache_length=30)[0])
    assert torch.equal(ours(max_positions), theirs.weights[2 : max_positions + 2])
