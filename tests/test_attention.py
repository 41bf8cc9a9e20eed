"""Multi-head attention against a plain softmax(QK^T / sqrt(d_k) + M) V reference."""

from __future__ import annotations

import math

import pytest
import torch

from seq2seq.nn import MultiHeadAttention, fast, padding_mask
from seq2seq.nn.attention import KVCache, attend_first_if_empty, attention

# The plain self-attention cache and the time-major one of seq2seq.nn.fast.
SELF_CACHES = pytest.mark.parametrize("cache_class", [KVCache, fast.TimeMajorKVCache])

D, H = 16, 4


def reference_attention(q, k, v, mask=None):
    """Plain ``softmax(Q K^T / sqrt(Dh) + M) V`` (Vaswani et al. 2017, Eq. 1); ``mask`` bool,
    broadcastable to ``(..., T, L)``, True = may attend."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


def _split(x: torch.Tensor) -> torch.Tensor:
    b, length, _ = x.shape
    return x.view(b, length, H, D // H).transpose(1, 2)


def _reference(mha: MultiHeadAttention, query, memory=None, mask=None) -> torch.Tensor:
    """Plain computation of multi-head attention from the module's weights."""
    if mha.self_attention:
        q, k, v = mha.qkv(query).split(D, dim=-1)
    else:
        q = mha.q(query)
        k, v = mha.kv(memory).split(D, dim=-1)
    out = reference_attention(_split(q), _split(k), _split(v), mask)
    return mha.out(out.transpose(1, 2).reshape(query.shape))


@pytest.fixture
def tokens() -> torch.Tensor:
    torch.manual_seed(0)
    tok = torch.randint(1, 9, (3, 7))
    tok[1, 4:] = 0
    tok[2, 2:] = 0
    return tok


def test_padding_mask(tokens):
    mask = padding_mask(tokens, 0)
    assert mask.dtype == torch.bool and mask.shape == (3, 1, 1, 7)
    assert mask[1, 0, 0].tolist() == [True] * 4 + [False] * 3


@pytest.mark.parametrize("padded", [False, True])
def test_self_attention_matches_reference(tokens, padded):
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(3, 7, D, dtype=torch.float64)
    mask = padding_mask(tokens, 0) if padded else None
    torch.testing.assert_close(mha(x, mask=mask), _reference(mha, x, mask=mask))


def test_causal_self_attention_matches_reference():
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(mha(x, is_causal=True), _reference(mha, x, mask=causal))


@pytest.mark.parametrize("padded", [False, True])
def test_cross_attention_matches_reference(tokens, padded):
    mha = MultiHeadAttention(D, H, self_attention=False).double()
    query = torch.randn(3, 4, D, dtype=torch.float64)
    memory = torch.randn(3, 7, D, dtype=torch.float64)
    mask = padding_mask(tokens, 0) if padded else None
    expected = _reference(mha, query, memory, mask)
    torch.testing.assert_close(mha(query, memory, mask=mask), expected)
    # With a cache: keys/values computed at the first call, reused afterwards.
    cache = KVCache(static=True)
    torch.testing.assert_close(mha(query, memory, mask=mask, cache=cache), expected)
    torch.testing.assert_close(mha(query, None, mask=mask, cache=cache), expected)


@pytest.mark.parametrize("chunks", [[1] * 6, [2, 1, 3], [4, 2]])
@SELF_CACHES
def test_cached_self_attention_equals_full(chunks, cache_class):
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(2, 6, D, dtype=torch.float64)
    full = mha(x, is_causal=True)
    cache = cache_class(static=False, capacity=2)  # forces the buffer to grow
    outs, start = [], 0
    for size in chunks:
        outs.append(mha(x[:, start : start + size], is_causal=True, cache=cache))
        start += size
    torch.testing.assert_close(torch.cat(outs, dim=1), full)
    assert cache.length == 6


@SELF_CACHES
def test_cache_reorder_selects_rows(cache_class):
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(3, 4, D, dtype=torch.float64)
    cache = cache_class(static=False)
    mha(x[:, :3], is_causal=True, cache=cache)
    index = torch.tensor([2, 2, 0])
    cache.reorder(index)
    step = mha(x[index, 3:], is_causal=True, cache=cache)
    torch.testing.assert_close(step, mha(x[index], is_causal=True)[:, 3:])


@torch.no_grad()
@SELF_CACHES
def test_repeated_reorders_reuse_buffers_and_select_rows(cache_class):
    """Beam-search-like use: reorders between single steps (buffers swapped, batch shrinking)."""
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(4, 6, D, dtype=torch.float64)
    cache = cache_class(static=False, capacity=3)  # grows while reordering
    rows = torch.arange(4)
    mha(x[:, :1], is_causal=True, cache=cache)
    for step, index in enumerate(
        [[3, 3, 1, 0], [0, 2, 1, 1], [2, 0, 3], [1, 1, 0], [2, 0]], start=1
    ):
        index = torch.tensor(index)
        cache.reorder(index)
        rows = rows[index]
        out = mha(x[rows, step : step + 1], is_causal=True, cache=cache)
        torch.testing.assert_close(out, mha(x[rows, : step + 1], is_causal=True)[:, -1:])


@torch.no_grad()
@SELF_CACHES
def test_reorders_that_move_few_rows_select_rows(cache_class):
    """Reorders that keep most rows in place (beams staying with their parents), swap two,
    copy a row over another or drop rows read every source row before it is overwritten."""
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(6, 7, D, dtype=torch.float64)
    cache = cache_class(static=False)
    rows = torch.arange(6)
    mha(x[:, :1], is_causal=True, cache=cache)
    # the last two: rows leaving, as finished sentences leave a search
    moves = [[0, 1, 2, 3, 4, 5], [1, 0, 2, 3, 4, 5], [0, 0, 2, 2, 4, 5], [0, 5, 2, 3], [0, 1, 3]]
    for step, index in enumerate(moves, 1):
        index = torch.tensor(index)
        cache.reorder(index)
        rows = rows[index]
        out = mha(x[rows, step : step + 1], is_causal=True, cache=cache)
        torch.testing.assert_close(out, mha(x[rows, : step + 1], is_causal=True)[:, -1:])


@pytest.mark.parametrize("self_attention", [True, False])
def test_cached_single_steps_in_bfloat16(self_attention):
    """Single-query cached steps under bfloat16 autocast match the full pass."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H, self_attention=self_attention)
    x = torch.randn(3, 5, D)
    memory = torch.randn(3, 7, D)
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False
    kwargs = dict(is_causal=True) if self_attention else dict(mask=mask)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = mha(x, None if self_attention else memory, **kwargs)
        cache = KVCache(static=not self_attention)
        steps = [
            mha(x[:, i : i + 1], None if self_attention else memory, cache=cache, **kwargs)
            for i in range(5)
        ]
    assert steps[0].dtype == torch.bfloat16
    torch.testing.assert_close(torch.cat(steps, 1).float(), full.float(), atol=3e-2, rtol=3e-2)


def test_fully_masked_row_is_finite():
    """A row whose keys are all masked attends to the first key, inside attention itself."""
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., :3] = True
    fixed = attend_first_if_empty(mask)
    assert torch.equal(fixed[0], mask[0])
    assert fixed[1].flatten().tolist() == [True, False, False, False, False]
    mha = MultiHeadAttention(D, H)
    x = torch.randn(2, 5, D, requires_grad=True)
    out = mha(x, mask=mask)  # the caller's mask as it is
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(out, mha(x, mask=fixed))


@pytest.mark.parametrize("past", [0, 3])
def test_attention_function_matches_the_reference(past):
    """Causal attention of T new queries over ``past`` cached keys plus their own, with key
    padding: the lower triangle shifted by the cached steps."""
    torch.manual_seed(0)
    t = 4
    q = torch.randn(2, H, t, 8, dtype=torch.float64)
    k, v = (torch.randn(2, H, past + t, 8, dtype=torch.float64) for _ in range(2))
    pad = torch.ones(2, 1, 1, past + t, dtype=torch.bool)
    pad[1, ..., -1:] = False
    causal = torch.ones(t, past + t, dtype=torch.bool).tril(past)
    expected = reference_attention(q, k, v, pad & causal)
    torch.testing.assert_close(attention(q, k, v, pad, is_causal=True), expected)
    no_pad = reference_attention(q, k, v, causal)
    torch.testing.assert_close(attention(q, k, v, is_causal=True), no_pad)


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match=r"d_model \(10\).*n_heads \(4\)"):
        MultiHeadAttention(10, 4)


def test_cached_single_query_accepts_a_mask_broadcast_over_the_batch():
    """A ``(1, 1, 1, S)`` mask applies to every row of a cached single-query step."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, self_attention=False).double().train()  # dropout 0
    memory = torch.randn(3, 5, 16, dtype=torch.float64)
    query = torch.randn(3, 1, 16, dtype=torch.float64)
    mask = torch.tensor([True, True, True, False, False]).view(1, 1, 1, 5)
    cached = mha(query, memory, mask=mask, cache=KVCache(True))
    torch.testing.assert_close(cached, mha(query, memory, mask=mask.expand(3, 1, 1, 5)))


def test_bfloat16_cpu_training_attends_through_the_math_path():
    """Under CPU bfloat16 autocast with autograd, attention avoids the flash kernel (whose
    backward is slow there) and its gradients stay those of float32 within bfloat16 rounding;
    without autograd (decoding) the flash kernel still runs."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 2, 16, 8, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.ones(4, 1, 1, 16, dtype=torch.bool)
    mask[0, ..., 10:] = False
    reference = attention(q, k, v, mask)
    (want,) = torch.autograd.grad(reference.square().sum(), q)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
        (got,) = torch.autograd.grad(out.float().square().sum(), q)
    names = {event.key for event in prof.key_averages()}
    assert not any("flash" in name for name in names) and "aten::bmm" in names
    torch.testing.assert_close(out.float(), reference, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got, want, atol=6e-2, rtol=6e-2)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    assert any("flash" in event.key for event in prof.key_averages())
