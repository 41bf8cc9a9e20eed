"""The speed tricks of seq2seq.nn.fast give the numbers of their plain counterparts."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from seq2seq.nn import (
    DecodingConfig,
    Transformer,
    beam_search,
    fast,
    greedy_search,
    padding_mask,
    step,
)
from seq2seq.nn.fast import PackedWeight, linear


def Linear(*args, **kwargs) -> fast.Linear:
    """An ``nn.Linear`` turned into :class:`fast.Linear`, as ``Transformer`` builds them."""
    return fast.install(torch.nn.Linear(*args, **kwargs))


needs_onednn = pytest.mark.skipif(not fast._ONEDNN, reason="PyTorch without oneDNN")


@needs_onednn
@pytest.mark.parametrize("small_rows", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 64, 65, 130])
def test_inference_path_matches_f_linear(rows, small_rows):
    """Float32 CPU inference: up to ``SMALL_ROWS`` rows through MKL's product with the
    transposed weight (the ``small_rows`` trick), more rows (or with it off) through oneDNN."""
    torch.manual_seed(0)
    layer = Linear(48, 80)
    x = torch.randn(rows, 1, 48)
    with torch.no_grad(), fast.enabled(small_rows, "small_rows"):
        out = layer(x)
    small = small_rows and rows <= fast.SMALL_ROWS
    assert (layer._packed.transposed is not None) == small
    assert (layer._packed.packed is not None) == (not small)  # the oneDNN path was taken
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("post", ["none", "relu"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_small_product_is_f_linear(post, with_bias):
    torch.manual_seed(0)
    weight, bias = torch.randn(80, 48), torch.randn(80) if with_bias else None
    x = torch.randn(5, 3, 48)
    expected = F.linear(x, weight, bias)
    expected = expected.relu() if post == "relu" else expected
    out = fast.small_product(x, weight.t().contiguous(), bias, post)
    assert out.shape == (5, 3, 80)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("rows", [3, 80])  # the transposed copy, the oneDNN one
def test_packed_copy_follows_in_place_updates(rows):
    torch.manual_seed(0)
    layer = Linear(16, 8)
    x = torch.randn(rows, 16)
    with torch.no_grad():
        layer(x)
        layer.weight.mul_(2.0)  # as an optimizer step or load_state_dict would
        after = layer(x)
    torch.testing.assert_close(after, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("rows", [3, 80])  # the transposed copy, the oneDNN one
@pytest.mark.parametrize("fused", [False, True])
def test_packed_copy_follows_optimizer_steps(fused, rows):
    """A fused AdamW step leaves the weight's version counter as it is: the packed and the
    transposed copies are rebuilt after every optimizer step all the same (validation between
    training steps)."""
    torch.manual_seed(0)
    layer = Linear(16, 8)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, fused=fused)
    x = torch.randn(rows, 16)
    for _ in range(2):
        layer(x).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            out = layer(x)
        copy = layer._packed.transposed if rows <= fast.SMALL_ROWS else layer._packed.packed
        assert copy is not None  # the path of its row count was taken
        expected = F.linear(x, layer.weight, layer.bias)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_training_and_other_dtypes_use_f_linear(monkeypatch):
    calls = []
    monkeypatch.setattr(PackedWeight, "get", lambda self, *a: calls.append(a) or a[:2])
    layer = Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    layer(x).sum().backward()  # autograd on
    assert x.grad is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x).float().sum().backward()  # autocast training
    with torch.no_grad():
        layer.double()(x.double().detach())  # float64
        with torch.autocast("cpu", dtype=torch.float16):
            layer.float()(x.detach())  # float16 autocast
        linear(x.detach(), layer.weight, layer.bias)  # no cache given
        with fast.enabled(False, "linear"):
            layer(x.detach())  # switched off
    assert calls == []


needs_bf16 = pytest.mark.skipif(not fast._BF16, reason="no oneDNN bfloat16 on this CPU")


@needs_bf16
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
def test_bfloat16_autocast_inference_matches_f_linear_and_packs_once(monkeypatch, input_dtype):
    torch.manual_seed(0)
    layer = Linear(48, 80)
    x = torch.randn(64, 1, 48).to(input_dtype)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.linear(x, layer.weight, layer.bias)
        out = layer(x)
        packed = layer._packed.packed
        layer(x)
        assert layer._packed.packed is packed  # packed once, not converted at every call
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), rtol=1e-2, atol=1e-2)
    with torch.no_grad():  # back to float32: repacked in float32
        torch.testing.assert_close(
            layer(x.float()), F.linear(x.float(), layer.weight, layer.bias), rtol=1e-5, atol=1e-5
        )


def _randomise_output_bias(model: Transformer) -> Transformer:
    """The model with its output bias (if it has one) away from zero, so that it shows."""
    if model.output_bias is not None:
        with torch.no_grad():
            model.output_bias.normal_()
    return model


@needs_onednn
@pytest.mark.parametrize("output_bias", [False, True])
def test_decoding_logits_match_with_and_without_onednn(monkeypatch, output_bias):
    torch.manual_seed(0)
    model = Transformer(
        vocab_size=60, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
        output_bias=output_bias,
    ).eval()  # fmt: skip
    _randomise_output_bias(model)
    src = torch.randint(4, 60, (3, 9))
    src[1, 6:] = 0
    tgt = torch.randint(4, 60, (3, 5))
    mask = padding_mask(src, 0)
    with torch.inference_mode():
        on = model(src, tgt, mask)
        with fast.enabled(False):
            off = model(src, tgt, mask)
    torch.testing.assert_close(on, off, rtol=1e-4, atol=1e-4)
    if output_bias:  # the bias is in the logits of both paths
        without = model.output_bias
        model.output_bias = None
        with torch.inference_mode():
            torch.testing.assert_close(on, model(src, tgt, mask) + without, rtol=1e-4, atol=1e-4)


def test_install_keeps_the_state_dict_and_switching_off_gives_the_plain_modules():
    torch.manual_seed(0)
    model = Transformer(vocab_size=60, d_model=32, n_heads=4, n_encoder_layers=1)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.1))
    keys = list(plain.state_dict())
    fast.install(plain)
    assert isinstance(plain[0], fast.Linear) and isinstance(plain[1], fast.Dropout)
    assert list(plain.state_dict()) == keys
    kinds = {type(m) for m in model.modules()}
    assert torch.nn.Linear not in kinds and torch.nn.Dropout not in kinds  # all installed
    assert fast.Linear in kinds and fast.Dropout in kinds
    with pytest.raises(ValueError, match="unknown speed tricks"):
        with fast.enabled(False, "warp"):
            pass


def _count_calls(monkeypatch, module, name: str) -> list:
    calls, original = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("off", [(), ("step",)], ids=["all", "step"])
@pytest.mark.parametrize("beam", [1, 4])
def test_search_gives_the_same_hypotheses_with_and_without_the_tricks(monkeypatch, beam, off):
    """Every trick switched off (the plain path), or the decoding step alone, decodes the same
    tokens with the same scores (float32 rounding), on a vocabulary wide enough for the
    block-wise top-k; beam search's beams share a cross-attention row (``KVCache.group``);
    sentences of several lengths leave the batch at several steps."""
    torch.manual_seed(0)
    model = Transformer(
        vocab_size=1024, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64
    ).eval()
    src = torch.randint(4, 1024, (6, 9))
    src[1, 5:], src[2, 3:], src[4, 7:] = 0, 0, 0
    mask = padding_mask(src, 0)
    config = DecodingConfig(beam_size=beam, max_len_a=1.0, max_len_b=1)
    search = greedy_search if beam == 1 else functools.partial(beam_search, n_best=beam)
    calls = _count_calls(monkeypatch, step, "decoder_step")
    with torch.inference_mode():
        on = search(model, src, mask, 2, 3, config)
        taken = len(calls)
        with fast.enabled(False, *off):
            off_hyps = search(model, src, mask, 2, 3, config)
    assert taken and len(calls) == taken  # the step, then the decoder's modules
    tokens = [[h.tokens for h in hyps] for hyps in on]
    assert tokens == [[h.tokens for h in hyps] for hyps in off_hyps]
    on_scores = [h.score for hyps in on for h in hyps]
    assert on_scores == pytest.approx([h.score for hyps in off_hyps for h in hyps], abs=1e-5)


@pytest.mark.parametrize(
    ("output_bias", "dtype"),
    [(False, torch.float64), (True, torch.float64), (True, torch.float32)],
)
def test_training_step_gives_the_same_loss_and_gradients_with_and_without_the_tricks(
    output_bias, dtype
):
    """Fused projection + loss and feed-forward on real rows (TranslationModule's choice when
    the tricks are on) against full logits and F.cross_entropy, dropout off; with an output
    bias too (float32: the fused loss's oneDNN product with the bias)."""
    import torch.nn.functional as F

    from seq2seq.nn import linear_label_smoothed_cross_entropy

    torch.manual_seed(0)
    model = Transformer(
        vocab_size=100, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
        dropout=0.0, output_bias=output_bias,
    ).to(dtype)  # fmt: skip
    _randomise_output_bias(model)
    src = torch.randint(4, 100, (4, 9))
    src[1, 6:] = 0
    tgt_in, tgt_out = torch.randint(4, 100, (4, 7)), torch.randint(4, 100, (4, 7))
    tgt_in[2, 5:] = tgt_out[2, 5:] = 0
    mask = padding_mask(src, 0)
    index = (tgt_out.flatten() != 0).nonzero().squeeze(1)
    src_index = mask.flatten().nonzero().squeeze(1)
    hidden = model.features(src, tgt_in, mask, index, src_index=src_index, tgt_index=index)
    target = tgt_out.flatten()[index]
    fused, _ = linear_label_smoothed_cross_entropy(
        hidden, model.output_weight, target, 0.1, bias=model.output_bias
    )
    fused_grads = torch.autograd.grad(fused, list(model.parameters()))
    logits = model(src, tgt_in, mask)
    plain = F.cross_entropy(
        logits.flatten(0, 1), tgt_out.flatten(), ignore_index=0, label_smoothing=0.1,
        reduction="sum",
    )  # fmt: skip
    plain_grads = torch.autograd.grad(plain, list(model.parameters()))
    torch.testing.assert_close(fused.to(dtype), plain, rtol=1e-6, atol=1e-6)  # float32 sums
    # The fused loss's softmax is float32, so float64 gradients agree to float32's precision
    # only (1.1e-7 apart on an AMD EPYC, below 1e-7 on an Intel Xeon).
    tolerance = dict(rtol=1e-5, atol=1e-6) if not output_bias else dict(rtol=1e-4, atol=1e-5)
    for a, b in zip(fused_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, **tolerance)


def test_block_topk_equals_torch_topk():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64 * 100, generator=g)
    x[1, :3000] = float("-inf")  # banned entries
    x[2, 10:20] = 9.0  # ten equal maxima in one block
    x[3, ::700] = 9.0  # equal maxima spread over blocks
    x[4, 64 * 50 : 64 * 51] = torch.linspace(5, 6, 64)  # the whole top in one block
    for n in (1, 5, 10):
        values, index = fast.topk(x, n)
        ref_values, _ = x.topk(n, dim=-1)
        assert torch.equal(values, ref_values)
        assert torch.equal(x.gather(1, index), values)  # indices point at those values
        assert all(len(set(row)) == n for row in index.tolist())  # distinct entries
    rows = x[[0, 5]]  # no ties: the same indices as torch.topk
    assert torch.equal(fast.topk(rows, 10)[1], rows.topk(10, dim=-1).indices)


class TestDropout:
    def test_rate_lanes_and_expectation(self):
        torch.manual_seed(0)
        drop = fast.install(torch.nn.Dropout(0.1)).train()
        x = torch.ones(400, 1000)
        y = drop(x)
        zero = y == 0
        assert abs(zero.float().mean().item() - 0.1) < 0.003
        # Four 16-bit draws come from each 64-bit word: every lane must be unbiased.
        lanes = zero.flatten()[:400_000].view(-1, 4).float().mean(0)
        assert (lanes - 0.1).abs().max().item() < 0.005
        kept = y[~zero]
        torch.testing.assert_close(kept, torch.full_like(kept, 65536 / (65536 - 6554)))
        assert abs(y.mean().item() - 1.0) < 0.01

    def test_seeded_eval_identity_gradient_and_the_plain_path(self):
        drop = fast.install(torch.nn.Dropout(0.3)).train()
        x = torch.randn(7, 13, requires_grad=True)
        torch.manual_seed(5)
        a = drop(x)
        torch.manual_seed(5)
        b = drop(x)
        torch.testing.assert_close(a, b)
        a.sum().backward()
        torch.testing.assert_close(x.grad, (a / x).detach())  # grad = mask * scale
        assert drop.eval()(x) is x
        drop.train()
        torch.manual_seed(5)
        with fast.enabled(False, "dropout"):
            plain = drop(x)
        torch.manual_seed(5)
        assert torch.equal(plain, torch.nn.functional.dropout(x, 0.3))


def test_the_ablation_benchmark_runs(tmp_path, capsys):
    """benchmarks/ablation.py (tiny sizes): every trick of the seam switched off alone."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import ablation

    sizes = "--d-model 16 --n-heads 2 --encoder-layers 1 --decoder-layers 1 --d-ff 32 --vocab 640"
    work = "--train-batch 4 --decode-batch 4 --new-tokens 3 --train-steps 1 --beam 2"
    out = tmp_path / "ablation.json"
    ablation.main(f"{sizes} {work} --repeats 1 --warmup 0 --json {out}".split())
    rows = json.loads(out.read_text())["rows"]
    variants = {(r["measurement"], r["variant"]) for r in rows}
    assert ("train", "- fused_loss") in variants and ("beam", "- slots") in variants
    assert ("one", "- small_rows") in variants  # one sentence alone: a request at a time
    assert all(r["value"] > 0 for r in rows)
    assert "fast off (plain path)" in capsys.readouterr().out


# --------------------------------------------------------------------------- decoder step


def _decode_step_by_step(model, src, mask, tgt):
    """Logits ``(B, T, V)`` of each cached one-position step of ``tgt``, and the cache."""
    cache = model.new_cache(4)  # grows past 4 during the steps
    memory = model.encode(src, mask)
    steps = [
        model.decode(tgt[:, t : t + 1], memory if t == 0 else None, mask, cache)
        for t in range(tgt.size(1))
    ]
    return torch.cat(steps, dim=1), cache


@pytest.mark.parametrize(
    "fields",
    [
        {},  # Pre-LN, ReLU (oneDNN's post-op), sinusoidal positions
        {"norm_first": False, "activation": "gelu", "positional": "learned"},
        {"positional": "rotary", "activation": "silu", "output_bias": True},
    ],
)
@pytest.mark.parametrize(("masked", "linear"), [(True, True), (False, True), (True, False)])
def test_decoder_step_gives_the_logits_and_caches_of_the_layers(
    monkeypatch, fields, masked, linear
):
    """One position per row through ``step.decoder_step`` or through the decoder's modules:
    the same logits (float32 rounding) and cached keys/values, with a source of padding only
    (every key masked) among the rows; its products through oneDNN or, with the ``linear``
    trick off, ``F.linear``."""
    torch.manual_seed(0)
    model = Transformer(
        vocab_size=60, d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=64,
        **fields,
    ).eval()  # fmt: skip
    _randomise_output_bias(model)
    src = torch.randint(4, 60, (3, 7))
    src[1, 4:] = 0
    src[2, :] = 0
    mask = padding_mask(src, 0) if masked else None
    tgt = torch.randint(4, 60, (3, 6))
    calls = _count_calls(monkeypatch, step, "decoder_step")
    with torch.inference_mode(), fast.enabled(linear, "linear"):
        on, cache_on = _decode_step_by_step(model, src, mask, tgt)
        assert len(calls) == tgt.size(1)
        with fast.enabled(False, "step"):
            off, cache_off = _decode_step_by_step(model, src, mask, tgt)
    assert len(calls) == tgt.size(1)  # switched off: the modules
    torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-5)
    for layer_on, layer_off in zip(cache_on.layers, cache_off.layers, strict=True):
        for kv_on, kv_off in zip(layer_on, layer_off, strict=True):
            torch.testing.assert_close(kv_on.keys, kv_off.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(kv_on.values, kv_off.values, rtol=1e-5, atol=1e-5)


def test_decoder_step_makes_the_source_bias_once_per_mask(monkeypatch):
    """The step's additive source bias is made at the first step and again only for another
    mask object (rows left the batch), and the logits are those of the decoder's modules."""
    torch.manual_seed(0)
    model = Transformer(
        vocab_size=60, d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=64
    ).eval()
    src = torch.randint(4, 60, (3, 7))
    src[1, 4:] = 0
    mask = padding_mask(src, 0)
    tokens = torch.randint(4, 60, (3, 1))
    made = _count_calls(monkeypatch, step, "attend_first_if_empty")
    with torch.inference_mode():
        memory = model.encode(src, mask)
        logits, plain = [], []
        for steps_on, out in ((True, logits), (False, plain)):
            cache, rows = model.new_cache(), mask
            with fast.enabled(steps_on, "step"):
                for t in range(4):
                    if t == 2:  # the first sentence leaves the batch
                        cache.reorder(torch.tensor([1, 2]), include_cross=True)
                        rows = mask[1:]
                    n = rows.size(0)
                    out.append(model.decode(tokens[-n:], memory[-n:], rows, cache))
    assert len(made) == 2  # steps 0 and 2 (the switched-off modules do not use the step's)
    for on, off in zip(logits, plain, strict=True):
        torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "layout"),
    [
        ((2, 4, 1, 8), (2, 4, 8, 5), "contiguous"),
        ((2, 4, 1, 8), (2, 4, 8, 5), "time-major"),  # keys (L, B, H, Dh) seen as (B, H, Dh, L)
        ((2, 4, 3, 8), (2, 4, 8, 5), "grouped"),  # queries (G, g, H, Dh) seen as (G, H, g, Dh)
        ((2, 4, 1, 8), (1, 4, 8, 5), "broadcast"),  # matmul's broadcasting
    ],
)
def test_batched_product_equals_matmul(a_shape, b_shape, layout):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(a_shape, generator=g), torch.randn(b_shape, generator=g)
    if layout == "time-major":
        b = b.permute(3, 0, 1, 2).contiguous().permute(1, 2, 3, 0)
    if layout == "grouped":
        a = a.transpose(1, 2).contiguous().transpose(1, 2)
    assert not b.is_contiguous() or not a.is_contiguous() or layout in ("contiguous", "broadcast")
    out = fast.batched_product(a, b)
    torch.testing.assert_close(out, torch.matmul(a, b), rtol=1e-6, atol=1e-6)
    half = fast.batched_product(a, b.to(torch.bfloat16))  # in a's dtype
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, torch.matmul(a, b.to(torch.bfloat16).float()))


def test_decoder_step_is_taken_for_float32_cpu_inference_of_one_position_only():
    model = Transformer(
        vocab_size=60, d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, d_ff=64
    )
    one, three = torch.ones(2, 1, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    decoder = model.decoder
    assert not step.use_decoder_step(decoder, one)  # training mode
    model.eval()
    assert not step.use_decoder_step(decoder, one)  # autograd on
    with torch.inference_mode():
        assert step.use_decoder_step(decoder, one)
        assert not step.use_decoder_step(decoder, three)
        with fast.enabled(False, "step"):
            assert not step.use_decoder_step(decoder, one)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not step.use_decoder_step(decoder, one)
        decoder.layers[0].cross_attn.record_weights = True  # Transformer.attention_maps
        assert not step.use_decoder_step(decoder, one)
        decoder.layers[0].cross_attn.record_weights = False
        model.double()
        assert not step.use_decoder_step(decoder, one)
        model.float()
        with pytest.raises(ValueError, match="cross-attention needs key_value"):
            model.decode(one, None, None, model.new_cache())


# --------------------------------------------------------------------------- row buckets


def test_row_buckets_hold_every_count_with_little_padding_and_few_shapes():
    for rows in range(1, 20000):
        size = fast.row_bucket(rows)
        assert rows <= size and (size * 8 <= rows * 9 if rows >= 128 else size - rows < 16)
    octave = {fast.row_bucket(rows) for rows in range(2049, 4097)}
    assert len(octave) == 8  # 2304, 2560, ..., 4096
    assert fast.row_bucket(4096) == 4096 and fast.row_bucket(4097) == 4608


@pytest.mark.parametrize("shape", [(37, 48), (3, 11, 48), (256, 48)])
def test_bucketed_linear_gives_f_linears_values_and_gradients(shape):
    """Padding rows change neither the kept rows nor any gradient (float64: exact sums)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 80).double()
    x = torch.randn(*shape, 48, dtype=torch.float64, requires_grad=True)
    out = fast.bucketed_linear(x, layer.weight, layer.bias)
    ref = F.linear(x, layer.weight, layer.bias)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(out, (x, layer.weight, layer.bias), g)
    refs = torch.autograd.grad(ref, (x, layer.weight, layer.bias), g)
    for a, b in zip(grads, refs, strict=True):
        torch.testing.assert_close(a, b)


def test_bfloat16_cpu_training_pads_the_rows_of_linear_layers(monkeypatch):
    """fast.Linear pads rows under bfloat16 autocast with autograd on, and only there."""
    padded = []
    real_pad = F.pad
    monkeypatch.setattr(
        F, "pad", lambda t, p, *a, **k: padded.append(t.shape) or real_pad(t, p, *a, **k)
    )
    layer = Linear(8, 4)
    x = torch.randn(5, 7, 8, requires_grad=True)
    layer(x).sum().backward()  # float32 training
    with torch.no_grad():
        layer(x)  # float32 inference
    with torch.autocast("cpu", dtype=torch.bfloat16), fast.enabled(False, "row_buckets"):
        layer(x)  # switched off
    assert padded == []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert padded == [(35, 8)] and out.shape == (5, 7, 4) and out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out, F.linear(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16())
    )
    out.float().sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    layer.bfloat16()(x.detach().bfloat16().requires_grad_())  # bfloat16 weights, no autocast
    assert padded[-1] == (35, 8)


@needs_bf16
def test_bfloat16_cpu_inference_pads_the_rows_of_its_onednn_products(monkeypatch):
    """Decoding brings new row counts as sentences end: the prepacked bfloat16 product runs on
    rows padded to a bucket, with F.linear's values for the real rows."""
    shapes = []
    real = fast._MKLDNN._linear_pointwise
    monkeypatch.setattr(
        fast,
        "_MKLDNN",
        SimpleNamespace(
            _linear_pointwise=lambda x, *a: shapes.append(x.shape) or real(x, *a),
            _reorder_linear_weight=fast._MKLDNN._reorder_linear_weight,
        ),
    )
    torch.manual_seed(0)
    layer = Linear(8, 4)
    x = torch.randn(5, 7, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
        with fast.enabled(False, "row_buckets"):
            plain = layer(x)
        expected = F.linear(x, layer.weight, layer.bias)
    assert shapes == [(48, 8), (5, 7, 8)]
    assert out.shape == (5, 7, 4) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, plain)
    torch.testing.assert_close(out.float(), expected.float(), rtol=1e-2, atol=1e-2)


def test_bucket_index_adds_padding_positions_only_for_bfloat16_cpu_training():
    weight = torch.zeros(4, 4)
    mask = torch.rand(9, 13, generator=torch.Generator().manual_seed(0)) < 0.8
    index = mask.flatten().nonzero().squeeze(1)
    total = mask.numel()
    assert fast.bucket_index(index, total, weight) is index  # float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bucketed = fast.bucket_index(index, total, weight)
        with torch.no_grad():
            assert fast.bucket_index(index, total, weight) is index
        # no padding position left to add: the count stays
        assert fast.bucket_index(torch.arange(total), total, weight).numel() == total
    n = index.numel()
    assert bucketed.numel() == min(fast.row_bucket(n), total) > n
    assert torch.equal(bucketed[:n], index)
    extra = bucketed[n:]
    assert not mask.flatten()[extra].any() and extra.unique().numel() == extra.numel()


def test_bfloat16_training_step_with_row_buckets_matches_the_one_without():
    """TranslationModule's fused path under bfloat16 autocast: bucketed row counts (padding
    rows in the feed-forward layers, an ignored padding tail in the loss's last chunk) give
    the loss and gradients of the unbucketed step, up to bfloat16 rounding."""
    from seq2seq.nn import linear_label_smoothed_cross_entropy

    torch.manual_seed(0)
    model = Transformer(
        vocab_size=300, d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
        dropout=0.0,
    )  # fmt: skip
    src = torch.randint(4, 300, (24, 13))
    src[::3, 9:] = 0
    tgt_in, tgt_out = torch.randint(4, 300, (24, 15)), torch.randint(4, 300, (24, 15))
    tgt_in[1::4, 11:] = tgt_out[1::4, 11:] = 0
    mask = padding_mask(src, 0)

    def step():
        index = (tgt_out.flatten() != 0).nonzero().squeeze(1)
        src_index = mask.flatten().nonzero().squeeze(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            w = model.output_weight
            index = fast.bucket_index(index, tgt_out.numel(), w)
            src_index = fast.bucket_index(src_index, src.numel(), w)
            hidden = model.features(src, tgt_in, mask, index, src_index=src_index, tgt_index=index)
            target = tgt_out.flatten()[index]
            loss, nll = linear_label_smoothed_cross_entropy(hidden, w, target, 0.1, chunk_size=64)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        return index.numel(), loss, nll, grads

    rows, loss, nll, grads = step()
    with fast.enabled(False, "row_buckets"):
        rows_off, loss_off, nll_off, grads_off = step()
    assert rows > rows_off  # buckets on: padding rows, and a padded tail in the loss
    torch.testing.assert_close(loss, loss_off, rtol=2e-2, atol=0)
    torch.testing.assert_close(nll, nll_off, rtol=2e-2, atol=0)
    for a, b in zip(grads, grads_off, strict=True):
        assert torch.isfinite(a).all()
        cosine = F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0)
        assert cosine > 0.99


@pytest.mark.skipif(
    not hasattr(__import__("ctypes").CDLL(None), "gnu_get_libc_version"), reason="not glibc"
)
def test_keep_freed_heap_sets_glibcs_parameters_unless_switched_off(monkeypatch):
    calls = []
    monkeypatch.setattr(fast.ctypes, "CDLL", lambda name: _FakeLibc(calls))
    with fast.enabled(False, "heap"):
        assert fast.keep_freed_heap() is False
    assert calls == []
    assert fast.keep_freed_heap() is True
    assert calls == [(-3, 32 << 20), (-1, 2**31 - 1), (-2, 512 << 20)]


class _FakeLibc:
    def __init__(self, calls):
        self.calls = calls
        self.gnu_get_libc_version = object()

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return 1
