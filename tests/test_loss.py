"""Label-smoothed cross entropy against torch's own implementation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.nn import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy
from seq2seq.nn import loss as loss_module

PAD = 0


def _data(shape=(3, 5), vocab=11, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(*shape, vocab, generator=g).to(dtype)
    target = torch.randint(1, vocab, shape, generator=g)
    target[..., -2:] = PAD
    return logits, target


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("shape", [(15,), (3, 5)])
def test_matches_torch_cross_entropy(epsilon, shape):
    logits, target = _data(shape)
    loss, nll = label_smoothed_cross_entropy(logits, target, epsilon, PAD)
    flat_logits, flat_target = logits.reshape(-1, logits.size(-1)), target.reshape(-1)
    expected = F.cross_entropy(
        flat_logits, flat_target, ignore_index=PAD, reduction="sum", label_smoothing=epsilon
    )
    expected_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, expected_nll)


def test_padding_is_ignored():
    logits, target = _data()
    loss, nll = label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    changed = logits.clone()
    changed[target == PAD] = 100.0 * torch.randn_like(changed[target == PAD])
    loss2, nll2 = label_smoothed_cross_entropy(changed, target, 0.1, PAD)
    torch.testing.assert_close((loss, nll), (loss2, nll2))
    all_pad = torch.zeros_like(target)
    assert label_smoothed_cross_entropy(logits, all_pad, 0.1, PAD)[0].item() == 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits_computed_in_float32(dtype):
    logits, target = _data(dtype=dtype)
    logits.requires_grad_(True)
    loss, nll = label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32
    expected, _ = label_smoothed_cross_entropy(logits.detach().float(), target, 0.1, PAD)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert logits.grad.dtype == dtype and torch.isfinite(logits.grad).all()


def test_non_contiguous_logits_and_shape_error():
    logits, target = _data(vocab=11)
    logits = torch.cat([logits, torch.randn(3, 5, 5)], dim=-1)
    view = logits[..., :11]  # like the vocabulary-padded output, sliced
    loss, _ = label_smoothed_cross_entropy(view, target, 0.1, PAD)
    expected, _ = label_smoothed_cross_entropy(view.contiguous(), target, 0.1, PAD)
    torch.testing.assert_close(loss, expected)
    with pytest.raises(ValueError, match="disagree"):
        label_smoothed_cross_entropy(logits, target[:, :2], 0.1, PAD)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_gradients_match_autograd_reference(epsilon):
    logits, target = _data()
    ours = logits.clone().requires_grad_(True)
    loss, nll = label_smoothed_cross_entropy(ours, target, epsilon, PAD)
    (2.0 * loss + 3.0 * nll).backward()
    ref = logits.clone().requires_grad_(True)
    flat, flat_target = ref.reshape(-1, ref.size(-1)), target.reshape(-1)
    ref_loss = F.cross_entropy(
        flat, flat_target, ignore_index=PAD, reduction="sum", label_smoothing=epsilon
    )
    ref_nll = F.cross_entropy(flat, flat_target, ignore_index=PAD, reduction="sum")
    (2.0 * ref_loss + 3.0 * ref_nll).backward()
    torch.testing.assert_close(ours.grad, ref.grad)
    assert torch.count_nonzero(ours.grad[target == PAD]) == 0


def _linear_data(n=300, d=16, vocab=50, dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    weight = torch.randn(vocab, d, generator=g).to(dtype).requires_grad_()
    target = torch.randint(1, vocab, (n,), generator=g)
    target[::7] = PAD
    return hidden, weight, target


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 64, 100, 1000])
def test_fused_linear_loss_equals_projection_then_loss(chunk_size, with_bias):
    """Loss, nll and the gradients (hidden, weight and the optional bias) of the chunked fused
    version equal the unfused ones, whatever the chunking (including a last partial chunk and
    padding rows)."""
    hidden, weight, target = _linear_data()
    g = torch.Generator().manual_seed(2)
    bias = torch.randn(weight.size(0), generator=g, dtype=weight.dtype) if with_bias else None
    params = [hidden, weight] if bias is None else [hidden, weight, bias.requires_grad_()]
    loss, nll = linear_label_smoothed_cross_entropy(
        hidden, weight, target, 0.1, PAD, chunk_size=chunk_size, bias=bias
    )
    grads = torch.autograd.grad(3.0 * loss, params)
    logits = hidden @ weight.t() if bias is None else hidden @ weight.t() + bias
    ref_loss, ref_nll = label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    ref_grads = torch.autograd.grad(3.0 * ref_loss, params)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-6, atol=0)
    for a, b in zip(grads, ref_grads, strict=True):  # float32 softmax
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert not nll.requires_grad
    if bias is not None:  # the bias matters here
        plain, _ = linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1, PAD)
        assert not torch.allclose(plain, loss)


@pytest.mark.parametrize("group_bytes", [1, None])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_linear_loss_under_bf16_autocast_is_close(with_bias, group_bytes, monkeypatch):
    """Under bf16 autocast the loss and gradients match float32 to bfloat16 rounding, with the
    weight gradient one product over all chunks (default) or one per chunk (``group_bytes=1``)."""
    if group_bytes is not None:
        monkeypatch.setattr(loss_module, "_GROUP_BYTES", group_bytes)
    hidden, weight, target = _linear_data(dtype=torch.float32)
    bias = torch.randn(weight.size(0)).requires_grad_() if with_bias else None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = linear_label_smoothed_cross_entropy(
            hidden, weight, target, 0.1, PAD, 64, bias=bias
        )
        logits = hidden @ weight.t()
        ref, _ = label_smoothed_cross_entropy(
            logits if bias is None else logits + bias.to(logits.dtype), target, 0.1, PAD
        )
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=2e-3, atol=0)
    params = [hidden, weight] if bias is None else [hidden, weight, bias]
    grads = torch.autograd.grad(loss, params)
    logits = hidden @ weight.t() if bias is None else hidden @ weight.t() + bias
    exact, _ = label_smoothed_cross_entropy(logits, target, 0.1, PAD)  # float32 throughout
    for got, want in zip(grads, torch.autograd.grad(exact, params), strict=True):
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        # bfloat16 products: a few parts in a thousand of the gradient's norm
        assert (got - want).norm() <= 2e-2 * want.norm()
    assert grads[0][target == PAD].abs().max() == 0  # padding rows get no gradient


def test_fused_linear_loss_rejects_bad_shapes():
    hidden, weight, target = _linear_data()
    with pytest.raises(ValueError, match="must be"):
        linear_label_smoothed_cross_entropy(hidden, weight[:, :3], target, 0.1)
    with pytest.raises(ValueError, match="target"):
        linear_label_smoothed_cross_entropy(hidden, weight, target[:5], 0.1)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1, chunk_size=0)
    with pytest.raises(ValueError, match=r"bias \(49,\) must be \(50,\)"):
        linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1, bias=weight[1:, 0])
