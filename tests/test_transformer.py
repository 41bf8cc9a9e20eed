"""Transformer properties: causality, padding invariance, cached decoding, dtypes, errors, and a
toy copy task."""

from __future__ import annotations

import math

import pytest
import torch

from seq2seq.nn import (
    DecodingConfig,
    Transformer,
    greedy_search,
    label_smoothed_cross_entropy,
    padding_mask,
)

PAD, BOS, EOS = 0, 2, 3
V = 29  # not a multiple of 8: exercises the internal vocabulary padding


@pytest.fixture(autouse=True)
def one_thread():
    """Run single-threaded: tiny matrices gain nothing from threads, and on a busy machine
    spinning thread pools slow down a lot."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(**kwargs) -> Transformer:
    torch.manual_seed(0)
    options = dict(
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        max_positions=32,
    )
    options.update(kwargs)
    model = Transformer(vocab_size=V, **options).double().eval()
    if model.output_bias is not None:  # away from its zero initialisation, to be seen
        with torch.no_grad():
            model.output_bias.normal_()
    return model


def _logits(model: Transformer, states: torch.Tensor) -> torch.Tensor:
    """The logits of final decoder states: ``states @ output_weight.T (+ output_bias)``."""
    logits = states @ model.output_weight.t()
    return logits if model.output_bias is None else logits + model.output_bias


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[1, 5:] = PAD
    src[2, 3:] = PAD
    tgt = torch.randint(4, V, (3, 6), generator=g)
    tgt[:, 0] = BOS
    return src, tgt


VARIANTS = [
    dict(),
    dict(norm_first=False, activation="gelu"),
    dict(positional="learned", tie_embeddings="none"),
    dict(positional="rotary", tie_embeddings="decoder"),
    dict(
        activation="silu", positional="sinusoidal_fairseq", scale_embedding=False, output_bias=True
    ),
]


@pytest.mark.parametrize("options", VARIANTS)
def test_logits_shape_and_real_vocab(options):
    model = _model(**options)
    src, tgt = _batch()
    logits = model(src, tgt, padding_mask(src, PAD))
    assert logits.shape == (3, 6, V)
    assert model.padded_vocab_size == 32


@pytest.mark.parametrize("options", VARIANTS)
def test_future_target_tokens_do_not_change_earlier_logits(options):
    model = _model(**options)
    src, tgt = _batch()
    mask = padding_mask(src, PAD)
    base = model(src, tgt, mask)
    for t in range(1, tgt.size(1)):
        changed = tgt.clone()
        changed[:, t] = (changed[:, t] + 1 - 4) % (V - 4) + 4
        out = model(src, changed, mask)
        torch.testing.assert_close(out[:, :t], base[:, :t])
        assert not torch.allclose(out[:, t:], base[:, t:])


@pytest.mark.parametrize("options", VARIANTS)
def test_extra_padding_changes_nothing(options):
    model = _model(**options)
    src, tgt = _batch()
    base = model(src, tgt, padding_mask(src, PAD))
    src_more = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    tgt_more = torch.cat([tgt, torch.full((3, 3), PAD)], dim=1)
    out = model(src_more, tgt_more, padding_mask(src_more, PAD))
    torch.testing.assert_close(out[:, : tgt.size(1)], base)
    # Encoder memory at real positions is unchanged as well.
    mem = model.encode(src, padding_mask(src, PAD))
    mem_more = model.encode(src_more, padding_mask(src_more, PAD))
    real = padding_mask(src, PAD)[:, 0, 0]
    torch.testing.assert_close(mem_more[:, : src.size(1)][real], mem[real])


@pytest.mark.parametrize("options", VARIANTS)
@pytest.mark.parametrize("chunks", [[1] * 6, [3, 1, 2]])
def test_cached_decoding_equals_full_forward(options, chunks):
    model = _model(**options)
    src, tgt = _batch()
    mask = padding_mask(src, PAD)
    full = model(src, tgt, mask)
    memory = model.encode(src, mask)
    cache = model.new_cache(capacity=2)
    outs, start = [], 0
    for size in chunks:
        outs.append(model.decode(tgt[:, start : start + size], memory, mask, cache))
        start += size
    torch.testing.assert_close(torch.cat(outs, dim=1), full)
    assert cache.length == tgt.size(1)


@pytest.mark.parametrize("options", VARIANTS)
def test_single_steps_in_eval_mode_equal_train_mode_also_with_beams_sharing_the_cache(options):
    """One position per row in eval mode (as search decodes) gives the logits of the same model
    in train mode (dropout 0), before and after the cache is shared by beams (cross-attention
    rows serving several query rows)."""
    model = _model(**options)
    src, tgt = _batch()
    src[2] = PAD  # an empty source too
    mask = padding_mask(src, PAD)
    memory = model.encode(src, mask)
    caches = {"step": model.new_cache(2), "forward": model.new_cache(2)}
    for t in range(tgt.size(1)):
        if t == 2:
            for cache in caches.values():
                cache.expand_beams(2)
        tokens = tgt[:, t : t + 1] if t < 2 else tgt[:, t : t + 1].repeat_interleave(2, 0)
        logits = {}
        for path, cache in caches.items():
            model.train(path == "forward")
            logits[path] = model.decode(tokens, memory if t == 0 else None, mask, cache)
        torch.testing.assert_close(logits["step"], logits["forward"])


def test_cached_steps_record_the_attention_maps_of_the_full_pass():
    model = _model()
    src, tgt = _batch()
    mask = padding_mask(src, PAD)
    maps = model.attention_maps(src, tgt, mask)
    modules = {}
    for i, layer in enumerate(model.decoder.layers):
        modules[f"decoder.{i}.self"], modules[f"decoder.{i}.cross"] = (
            layer.self_attn,
            layer.cross_attn,
        )
    memory = model.encode(src, mask)
    cache = model.new_cache()
    for mha in modules.values():
        mha.record_weights = True
    try:
        for t in range(tgt.size(1)):
            model.decode(tgt[:, t : t + 1], memory, mask, cache)
            for name, mha in modules.items():
                width = t + 1 if name.endswith("self") else src.size(1)
                expected = maps[name][:, :, t : t + 1, :width]
                torch.testing.assert_close(mha.weights.float(), expected)
    finally:
        for mha in modules.values():
            mha.record_weights, mha.weights = False, None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("norm_first", [True, False])
def test_empty_source_gives_finite_outputs_and_grads(dtype, norm_first):
    torch.manual_seed(0)
    model = Transformer(
        vocab_size=V,
        d_model=32,
        n_heads=4,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=64,
        norm_first=norm_first,
        max_positions=32,
    ).to(dtype)
    src, tgt = _batch()
    src[0] = PAD  # a source made only of padding
    logits = model(src, tgt, padding_mask(src, PAD))
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all()
    loss, _ = label_smoothed_cross_entropy(logits, tgt, 0.1, PAD)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


def test_too_long_input_raises():
    model = _model(max_positions=8)
    src = torch.randint(4, V, (2, 9))
    tgt = torch.randint(4, V, (2, 9))
    with pytest.raises(ValueError, match=r"length 9 exceeds max_positions=8"):
        model.encode(src)
    with pytest.raises(ValueError, match=r"length 9 exceeds max_positions=8"):
        model(src[:, :5], tgt)
    memory = model.encode(src[:, :5])
    cache = model.new_cache()
    model.decode(tgt[:, :8], memory, None, cache)
    with pytest.raises(ValueError, match=r"length 9 exceeds max_positions=8"):
        model.decode(tgt[:, 8:], memory, None, cache)


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match=r"d_model \(30\).*n_heads \(4\)"):
        Transformer(vocab_size=V, d_model=30, n_heads=4)


@pytest.mark.parametrize(("tie", "n_matrices"), [("none", 3), ("decoder", 2), ("all", 1)])
def test_tied_embeddings(tie, n_matrices):
    model = _model(tie_embeddings=tie)
    weights = {
        id(model.encoder.embed.weight),
        id(model.decoder.embed.weight),
        id(model.output.weight),
    }
    assert len(weights) == n_matrices


def test_initialisation():
    torch.manual_seed(0)
    model = Transformer(
        vocab_size=1000, d_model=64, n_heads=4, n_encoder_layers=1, n_decoder_layers=1
    )
    emb = model.encoder.embed.weight
    assert torch.count_nonzero(emb[PAD]) == 0
    assert abs(emb[1:].std().item() - 64**-0.5) < 0.01
    qkv = model.encoder.layers[0].self_attn.qkv.weight
    bound = (6 / (64 + 64)) ** 0.5  # Xavier uniform of each D x D projection
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.9 * bound
    assert torch.count_nonzero(model.encoder.layers[0].self_attn.qkv.bias) == 0


def _copy_batch(n: int, vocab: int, g: torch.Generator | None = None):
    lens = torch.randint(4, 11, (n,), generator=g)
    length = int(lens.max())
    src = torch.randint(4, vocab, (n, length), generator=g)
    src = src.masked_fill(torch.arange(length) >= lens[:, None], PAD)
    tgt = torch.cat([src, torch.full((n, 1), PAD)], dim=1)
    tgt[torch.arange(n), lens] = EOS
    dec_in = torch.cat([torch.full((n, 1), BOS), tgt[:, :-1]], dim=1).masked_fill(tgt == PAD, PAD)
    return src, dec_in, tgt, lens


@pytest.mark.slow  # hundreds of training steps: ~15 s; CI runs the slow tier too
def test_learns_to_copy():
    """A tiny model learns to copy random sequences (greedy token accuracy >= 95%)."""
    torch.manual_seed(0)
    vocab = 16
    model = Transformer(
        vocab_size=vocab,
        d_model=64,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=128,
        dropout=0.0,
        max_positions=32,
    )
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    for _ in range(400):
        src, dec_in, tgt, _ = _copy_batch(64, vocab)
        loss, _ = label_smoothed_cross_entropy(
            model(src, dec_in, padding_mask(src, PAD)), tgt, 0.0, PAD
        )
        opt.zero_grad()
        (loss / (tgt != PAD).sum()).backward()
        opt.step()
        sched.step()
    model.eval()
    src, _, _, lens = _copy_batch(200, vocab, torch.Generator().manual_seed(1))
    limits = DecodingConfig(max_len_a=1.0, max_len_b=2)
    hyps = greedy_search(model, src, padding_mask(src, PAD), BOS, EOS, limits)
    correct = total = 0
    for (hyp,), row, n in zip(hyps, src.tolist(), lens.tolist(), strict=True):
        ref = row[:n]
        correct += sum(a == b for a, b in zip(hyp.tokens, ref, strict=False))
        total += max(len(ref), len(hyp.tokens))
    assert correct / total >= 0.95


@pytest.mark.parametrize("options", VARIANTS)
def test_attention_maps(options):
    model = _model(**options)
    src, tgt = _batch()
    src[2] = PAD  # an empty source: its rows attend to the first position only
    mask = padding_mask(src, PAD)
    b, s, t = src.size(0), src.size(1), tgt.size(1)
    before = model(src, tgt, mask)
    maps = model.attention_maps(src, tgt, mask)
    # Maps are off again afterwards, and recording them did not change the output.
    torch.testing.assert_close(model(src, tgt, mask), before, rtol=0, atol=0)
    assert sorted(maps) == sorted(
        [f"encoder.{i}.self" for i in range(2)]
        + [f"decoder.{i}.{kind}" for i in range(2) for kind in ("self", "cross")]
    )
    allowed = mask.clone()
    allowed[2, ..., 0] = True
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    expected = {"encoder": ((b, 4, s, s), allowed), "self": ((b, 4, t, t), causal)}
    expected["cross"] = ((b, 4, t, s), allowed)
    for name, probs in maps.items():
        kind = "encoder" if name.startswith("encoder") else name.split(".")[-1]
        shape, keys = expected[kind]
        assert probs.dtype == torch.float32 and probs.shape == shape
        keys = keys.expand(shape)
        assert torch.all(probs[~keys] == 0)
        assert torch.all(probs[keys] > 0)
        torch.testing.assert_close(probs.sum(-1), torch.ones(shape[:-1]))


def test_attention_maps_do_not_change_output_with_maps_on():
    model = _model()
    src, tgt = _batch()
    mask = padding_mask(src, PAD)
    layers = [*model.encoder.layers, *model.decoder.layers]
    modules = [m for layer in layers for m in (layer.self_attn, getattr(layer, "cross_attn", None))]
    off = model(src, tgt, mask)
    for m in filter(None, modules):
        m.record_weights = True
    try:
        on = model(src, tgt, mask)
    finally:
        for m in filter(None, modules):
            m.record_weights = False
    torch.testing.assert_close(on, off, rtol=0, atol=0)


@pytest.mark.parametrize("options", VARIANTS)
def test_output_index_and_features_select_rows_of_the_full_logits(options):
    model = _model(**options)
    src, tgt = _batch()
    mask = padding_mask(src, PAD)
    full = model(src, tgt, mask)
    index = torch.tensor([0, 4, 5, 7, 17])
    torch.testing.assert_close(model(src, tgt, mask, index), full.flatten(0, 1)[index])
    states = model.features(src, tgt, mask, index)
    assert states.shape == (index.numel(), model.d_model)
    torch.testing.assert_close(_logits(model, states), full.flatten(0, 1)[index])


@pytest.mark.parametrize("options", VARIANTS)
def test_feed_forward_on_real_rows_only_changes_no_real_output(options):
    """``src_index`` / ``tgt_index`` (feed-forward sub-layers on real tokens only) leave the
    states at real target positions and every parameter gradient of a loss over them as they
    are without them."""
    model = _model(**options).train()  # dropout 0: deterministic
    src, tgt = _batch()
    tgt[0, 4:] = PAD  # target padding too
    tgt[2, 2:] = PAD
    mask = padding_mask(src, PAD)
    src_index = (src.flatten() != PAD).nonzero().squeeze(1)
    tgt_index = (tgt.flatten() != PAD).nonzero().squeeze(1)
    assert src_index.numel() < src.numel() and tgt_index.numel() < tgt.numel()

    def run(**indices):
        model.zero_grad()
        states = model.features(src, tgt, mask, tgt_index, **indices)
        _logits(model, states).logsumexp(-1).sum().backward()
        return states.detach(), [p.grad.clone() for p in model.parameters()]

    full, full_grads = run()
    packed, packed_grads = run(src_index=src_index, tgt_index=tgt_index)
    torch.testing.assert_close(packed, full)
    for a, b in zip(packed_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b)
    memory = model.encode(src, mask, src_index)  # real source rows equal as well
    keep = mask.flatten()
    torch.testing.assert_close(
        memory.flatten(0, 1)[keep], model.encode(src, mask).flatten(0, 1)[keep]
    )


def test_feed_forward_on_real_rows_under_bfloat16_autocast():
    model = _model().float().train()
    src, tgt = _batch()
    mask = padding_mask(src, PAD)
    src_index = (src.flatten() != PAD).nonzero().squeeze(1)
    tgt_index = (tgt.flatten() != PAD).nonzero().squeeze(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full = model.features(src, tgt, mask, tgt_index)
        packed = model.features(src, tgt, mask, tgt_index, src_index, tgt_index)
    packed.float().sum().backward()
    assert packed.dtype == full.dtype
    torch.testing.assert_close(packed.float(), full.float(), rtol=0.05, atol=0.05)


def test_rotary_scores_depend_on_relative_position_only():
    from seq2seq.nn.attention import RotaryEmbedding

    rope = RotaryEmbedding(8, max_positions=64)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=g)
    k = torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=g)
    scores = rope(q) @ rope(k).transpose(-2, -1)
    shifted = rope(q, offset=17) @ rope(k, offset=17).transpose(-2, -1)
    torch.testing.assert_close(shifted, scores)  # same relative positions, same scores
    torch.testing.assert_close(rope(q).norm(dim=-1), q.norm(dim=-1))  # a rotation
    assert not torch.allclose(rope(q, offset=1), rope(q))  # but positions do matter
    # Position 0 is not rotated; position p rotates pair i by p * 10000^(-2i/Dh).
    torch.testing.assert_close(rope(q[:, :, :1]), q[:, :, :1])
    angle = 3 * 10000 ** (-2 * 1 / 8)
    x = torch.zeros(1, 1, 1, 8, dtype=torch.float64)
    x[..., 1] = 1.0  # first coordinate of pair 1
    y = rope(x, offset=3)
    torch.testing.assert_close(
        y[0, 0, 0, [1, 5]], torch.tensor([math.cos(angle), math.sin(angle)], dtype=torch.float64)
    )


def test_rotary_model_has_no_position_table_and_full_precision_rotations():
    """A rotary model has no position table, adds nothing to the state dict, and a bfloat16
    copy still rotates with float32 tables."""
    model = _model(positional="rotary")
    assert model.encoder.positions is None
    assert not any("rotary" in k or "table" in k for k in model.state_dict())
    low = _model(positional="rotary").to(torch.bfloat16)
    src, tgt = _batch()
    with torch.no_grad():
        out = low(src, tgt, padding_mask(src, PAD))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    cos, _ = low.encoder.layers[0].self_attn.rotary.tables(torch.device("cpu"), torch.float32)
    assert cos.dtype == torch.float32
    with pytest.raises(ValueError, match="even head width"):
        Transformer(vocab_size=V, d_model=12, n_heads=4, positional="rotary")


@pytest.mark.parametrize("positional", ["sinusoidal", "rotary"])
def test_training_forward_compiles_without_graph_breaks(positional):
    """``--model.compile``: the whole training forward, dropout included, is one graph."""
    import torch._dynamo

    model = _model(positional=positional, dropout=0.1).float().train()
    src, tgt = _batch()
    explained = torch._dynamo.explain(model)(src, tgt, padding_mask(src, PAD))
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]


def test_cached_steps_accept_a_new_mask_tensor():
    """Search passes the same mask at every step until it drops sentences; a new mask tensor
    with the same values gives the same logits."""
    model = _model()
    src, tgt = _batch()
    mask = padding_mask(src, PAD)
    memory = model.encode(src, mask)
    cache = model.new_cache()
    full = model(src, tgt[:, :4], mask)
    steps = [model.decode(tgt[:, t : t + 1], memory, mask, cache) for t in range(3)]
    steps.append(model.decode(tgt[:, 3:4], None, mask.clone(), cache))  # a new mask tensor
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_output_bias_is_a_zero_initialised_parameter_added_to_every_decoded_logit():
    """``output_bias=True``: a ``(V,)`` parameter, zero at first (the logits of the same
    weights without it), then added to the logits of teacher forcing and of cached steps;
    without it the state dict has no such key."""
    plain, biased = _model(), _model(output_bias=True)
    assert "output_bias" not in plain.state_dict() and plain.output_bias is None
    assert biased.state_dict()["output_bias"].shape == (V,)
    assert any(p is biased.output_bias for p in biased.parameters())
    weights = {k: v for k, v in biased.state_dict().items() if k != "output_bias"}
    plain.load_state_dict(weights)
    src, tgt = _batch()
    mask = padding_mask(src, PAD)
    with torch.no_grad():
        biased.output_bias.zero_()
        torch.testing.assert_close(biased(src, tgt, mask), plain(src, tgt, mask), rtol=0, atol=0)
        biased.output_bias.copy_(torch.linspace(-3, 3, V, dtype=torch.float64))
        expected = plain(src, tgt, mask) + biased.output_bias
        torch.testing.assert_close(biased(src, tgt, mask), expected)
        memory, cache = biased.encode(src, mask), biased.new_cache()
        steps = [biased.decode(tgt[:, t : t + 1], memory, mask, cache) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected)


@pytest.mark.parametrize("beam", [1, 3])
def test_output_bias_steers_greedy_and_beam_search(beam):
    """A large bias on one token makes the searches (cached steps) emit it at every step, and
    a large bias on EOS ends every hypothesis at once."""
    from seq2seq.nn import beam_search

    model = _model(output_bias=True)
    src, _ = _batch()
    mask = padding_mask(src, PAD)
    config = DecodingConfig(beam_size=beam, max_len_a=0.0, max_len_b=5)
    search = greedy_search if beam == 1 else beam_search
    for token, expected in ((7, [7] * 5), (EOS, [])):
        with torch.no_grad():
            model.output_bias.zero_()
            model.output_bias[token] = 100.0
            hyps = search(model, src, mask, BOS, EOS, config)
        assert [h[0].tokens for h in hyps] == [expected] * src.size(0)


def test_fairseq_positions_continue_from_the_cache_and_need_an_even_width():
    """``positional="sinusoidal_fairseq"``: position ``p`` adds fairseq's row ``p + 2``
    (``[sin | cos]`` of ``(p + 2) * exp(-i ln(10000) / (D/2 - 1))``), also in cached steps;
    an odd or too small ``d_model`` is refused naming it."""
    model = _model(positional="sinusoidal_fairseq", scale_embedding=False)
    table = model.decoder.positions(5, offset=3)
    half = model.d_model // 2
    rows = torch.arange(5, 10, dtype=torch.float64)[:, None]
    angles = rows * torch.exp(-torch.arange(half) * math.log(10000) / (half - 1))
    formula = torch.cat([angles.sin(), angles.cos()], 1)
    torch.testing.assert_close(table.double(), formula, rtol=0, atol=1e-6)  # float32 table
    tokens = torch.tensor([[5, 6]])
    with torch.no_grad():
        x = model.decoder.embed_tokens(tokens, offset=3)
        torch.testing.assert_close(x, model.decoder.embed(tokens) + table[:2].double())
    for d_model in (15, 2):
        with pytest.raises(ValueError, match=rf"sinusoidal_fairseq.*d_model = {d_model}$"):
            Transformer(vocab_size=V, d_model=d_model, n_heads=1, positional="sinusoidal_fairseq")


@pytest.mark.parametrize("scale", [True, False])
def test_scale_embedding_multiplies_token_embeddings_by_sqrt_d_model_or_not(scale):
    model = _model(scale_embedding=scale, positional="rotary")  # no table added
    tokens = torch.tensor([[5, 6, 7]])
    factor = math.sqrt(model.d_model) if scale else 1.0
    with torch.no_grad():
        for stack in (model.encoder, model.decoder):
            expected = stack.embed(tokens) * factor
            torch.testing.assert_close(stack.embed_tokens(tokens), expected, rtol=0, atol=0)


def test_silu_feed_forward_is_x_times_sigmoid_x():
    model = _model(activation="silu")
    ff = model.encoder.layers[0].ff
    x = torch.randn(2, 3, model.d_model, dtype=torch.float64)
    hidden = ff.fc1(x)
    torch.testing.assert_close(ff(x), ff.fc2(hidden * torch.sigmoid(hidden)))
