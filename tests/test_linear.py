"""The oneDNN inference path of seq2seq.nn.linear agrees with F.linear and stays in sync."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seq2seq.nn.linear as linear_module
from seq2seq.nn import Transformer, padding_mask
from seq2seq.nn.linear import Linear, PackedWeight, linear

needs_onednn = pytest.mark.skipif(not linear_module._ONEDNN, reason="PyTorch without oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 64, 130])
def test_inference_path_matches_f_linear(rows):
    torch.manual_seed(0)
    layer = Linear(48, 80)
    x = torch.randn(rows, 1, 48)
    with torch.no_grad():
        fast = layer(x)
    assert layer._packed.packed is not None  # the oneDNN path was taken
    torch.testing.assert_close(fast, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_packed_copy_follows_in_place_updates():
    torch.manual_seed(0)
    layer = Linear(16, 8)
    x = torch.randn(3, 16)
    with torch.no_grad():
        layer(x)
        layer.weight.mul_(2.0)  # as an optimizer step or load_state_dict would
        after = layer(x)
    torch.testing.assert_close(after, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


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
    assert calls == []


needs_bf16 = pytest.mark.skipif(not linear_module._BF16, reason="no oneDNN bfloat16 on this CPU")


@needs_bf16
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
def test_bfloat16_autocast_inference_matches_f_linear_and_packs_once(monkeypatch, input_dtype):
    torch.manual_seed(0)
    layer = Linear(48, 80)
    x = torch.randn(64, 1, 48).to(input_dtype)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.linear(x, layer.weight, layer.bias)
        fast = layer(x)
        packed = layer._packed.packed
        layer(x)
        assert layer._packed.packed is packed  # packed once, not converted at every call
    assert fast.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(fast.float(), expected.float(), rtol=1e-2, atol=1e-2)
    with torch.no_grad():  # back to float32: repacked in float32
        torch.testing.assert_close(
            layer(x.float()), F.linear(x.float(), layer.weight, layer.bias), rtol=1e-5, atol=1e-5
        )


@needs_onednn
def test_decoding_logits_match_with_and_without_onednn(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(
        vocab_size=60, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64
    ).eval()
    src = torch.randint(4, 60, (3, 9))
    src[1, 6:] = 0
    tgt = torch.randint(4, 60, (3, 5))
    mask = padding_mask(src, 0)
    with torch.inference_mode():
        fast = model(src, tgt, mask)
        monkeypatch.setattr(linear_module, "_ONEDNN", False)
        slow = model(src, tgt, mask)
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("with_residual", [False, True])
def test_activation_and_residual_equal_the_separate_operations(
    monkeypatch, onednn, activation, with_residual
):
    if onednn and not linear_module._ONEDNN:
        pytest.skip("PyTorch without oneDNN")
    monkeypatch.setattr(linear_module, "_ONEDNN", onednn)
    torch.manual_seed(0)
    layer = Linear(48, 80)
    x = torch.randn(64, 48)
    residual = torch.randn(64, 80) if with_residual else None
    with torch.no_grad():
        fused = linear(
            x, layer.weight, layer.bias, layer._packed, activation=activation, residual=residual
        )
        expected = F.linear(x, layer.weight, layer.bias)
        expected = {None: expected, "relu": F.relu(expected), "gelu": F.gelu(expected)}[activation]
        if residual is not None:
            expected = residual + expected
    assert (layer._packed.packed is not None) == onednn
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-5)


@needs_bf16
def test_residual_under_bfloat16_autocast_is_added_in_float32():
    torch.manual_seed(0)
    layer = Linear(48, 80)
    x, residual = torch.randn(64, 48), torch.randn(64, 80)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear(x, layer.weight, layer.bias, layer._packed, residual=residual)
        expected = residual + F.linear(x, layer.weight, layer.bias)
    assert out.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)


def test_unknown_activation_is_refused():
    layer = Linear(4, 3)
    with pytest.raises(ValueError, match="activation must be one of"):
        linear(torch.randn(2, 4), layer.weight, activation="tanh")
