"""Multi-head attention against a plain softmax(QK^T / sqrt(d_k) + M) V reference."""

from __future__ import annotations

import pytest
import torch

from seq2seq.nn import MultiHeadAttention, padding_mask
from seq2seq.nn.attention import KVCache, attend_first_if_empty, reference_attention

D, H = 16, 4


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
def test_cached_self_attention_equals_full(chunks):
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(2, 6, D, dtype=torch.float64)
    full = mha(x, is_causal=True)
    cache = KVCache(static=False, capacity=2)  # forces the buffer to grow
    outs, start = [], 0
    for size in chunks:
        outs.append(mha(x[:, start : start + size], is_causal=True, cache=cache))
        start += size
    torch.testing.assert_close(torch.cat(outs, dim=1), full)
    assert cache.length == 6


def test_cache_reorder_selects_rows():
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(3, 4, D, dtype=torch.float64)
    cache = KVCache(static=False)
    mha(x[:, :3], is_causal=True, cache=cache)
    index = torch.tensor([2, 2, 0])
    cache.reorder(index)
    step = mha(x[index, 3:], is_causal=True, cache=cache)
    torch.testing.assert_close(step, mha(x[index], is_causal=True)[:, 3:])


@torch.no_grad()
def test_repeated_reorders_reuse_buffers_and_select_rows():
    """Beam-search-like use: reorders between single steps (buffers swapped, batch shrinking)."""
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(4, 6, D, dtype=torch.float64)
    cache = KVCache(static=False, capacity=3)  # grows while reordering
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
def test_reorder_copying_only_moved_rows_selects_rows():
    """``moved`` (rows with ``index[i] != i``) copies just those rows, sources read first."""
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(6, 5, D, dtype=torch.float64)
    cache = KVCache(static=False)
    rows = torch.arange(6)
    mha(x[:, :1], is_causal=True, cache=cache)
    for step, index in enumerate([[0, 1, 2, 3, 4, 5], [1, 0, 2, 3, 4, 5], [0, 0, 2, 2, 4, 5]], 1):
        index = torch.tensor(index)
        moved = (index != torch.arange(6)).nonzero().squeeze(1)
        cache.reorder(index, moved)
        rows = rows[index]
        out = mha(x[rows, step : step + 1], is_causal=True, cache=cache)
        torch.testing.assert_close(out, mha(x[rows, : step + 1], is_causal=True)[:, -1:])


@pytest.mark.parametrize("self_attention", [True, False])
def test_cached_single_steps_in_bfloat16(self_attention):
    """Single-query cached steps under bfloat16 autocast (float32 cache) match the fused path."""
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
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., :3] = True
    fixed = attend_first_if_empty(mask)
    assert torch.equal(fixed[0], mask[0])
    assert fixed[1].flatten().tolist() == [True, False, False, False, False]
    mha = MultiHeadAttention(D, H)
    x = torch.randn(2, 5, D, requires_grad=True)
    out = mha(x, mask=fixed)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match=r"d_model \(10\).*n_heads \(4\)"):
        MultiHeadAttention(10, 4)


def test_cached_single_query_accepts_a_mask_broadcast_over_the_batch():
    """The single-query path turns a ``(1, 1, 1, S)`` mask into its bias for every row."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, self_attention=False).double().train()  # dropout 0
    memory = torch.randn(3, 5, 16, dtype=torch.float64)
    query = torch.randn(3, 1, 16, dtype=torch.float64)
    mask = torch.tensor([True, True, True, False, False]).view(1, 1, 1, 5)
    cached = mha(query, memory, mask=mask, cache=KVCache(True))
    torch.testing.assert_close(cached, mha(query, memory, mask=mask.expand(3, 1, 1, 5)))
