"""Linear layers with a faster CPU inference path.

At decoding shapes (a few dozen to a few hundred rows times ``d_model``), oneDNN's matrix
product with a weight laid out ahead of time for it ("prepacked") is 10-40% faster than the
BLAS call behind ``F.linear`` on AVX-512 CPUs. :func:`linear` takes that path for CPU inference
(autograd off) with float32 weights:

* float32 inputs, autocast off: float32 product; agrees with ``F.linear`` to float32 rounding
  (a different summation order);
* under ``torch.autocast("cpu", dtype=torch.bfloat16)``: a bfloat16 product with a bfloat16
  copy of the weight packed once, where ``F.linear`` under autocast converts the float32 weight
  to bfloat16 at every call (1.3 ms per call for an 8000 x 256 output projection here); the
  result is ``F.linear``'s under autocast (bfloat16 output, same rounding of the operands).
  Only where oneDNN reports bfloat16 support on this CPU.

``F.linear`` runs everywhere else: training, float64/float16, other devices, or a PyTorch build
without oneDNN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Linear", "PackedWeight", "linear"]

_MKLDNN = getattr(torch.ops, "mkldnn", None)
_ONEDNN = (
    torch.backends.mkldnn.is_available()
    and _MKLDNN is not None
    and hasattr(_MKLDNN, "_linear_pointwise")
    and hasattr(_MKLDNN, "_reorder_linear_weight")
)
_BF16 = _ONEDNN and bool(getattr(_MKLDNN, "_is_mkldnn_bf16_supported", lambda: False)())
_BATCH_HINT = 64  # rows the packed layout is tuned for; any number of rows is correct
_AUTOCAST_INPUTS = (torch.float32, torch.bfloat16)  # inputs bfloat16 autocast would cast
# activation -> (oneDNN post-op, its algorithm argument)
_ACTIVATIONS = {None: ("none", ""), "relu": ("relu", ""), "gelu": ("gelu", "none")}


def _key(t: Tensor | None) -> tuple | None:
    return None if t is None else (t.data_ptr(), t._version, tuple(t.shape))


class PackedWeight:
    """A weight's oneDNN-prepacked copy (float32, or bfloat16 for autocast), rebuilt when the
    weight changes.

    The copy is keyed on the tensor's storage and version counter, so an optimizer step or a
    ``load_state_dict`` (both modify the weight in place) invalidates it. It is a plain
    attribute, never part of a state dict.
    """

    __slots__ = ("bias", "key", "packed")

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.packed: Tensor | None = None
        self.bias: Tensor | None = None

    def get(
        self, weight: Tensor, bias: Tensor | None = None, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor | None]:
        """The packed weight and the bias, both in ``dtype``."""
        key = (_key(weight), _key(bias), dtype)
        if key != self.key or self.packed is None:
            self.packed = _MKLDNN._reorder_linear_weight(weight.detach().to(dtype), _BATCH_HINT)
            self.bias = None if bias is None else bias.detach().to(dtype)
            self.key = key
        return self.packed, self.bias


def _fast_dtype(x: Tensor, weight: Tensor) -> torch.dtype | None:
    """The dtype of the oneDNN product for this call, ``None`` for ``F.linear``."""
    if not (
        _ONEDNN
        and not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and weight.dtype == torch.float32
        and not torch.compiler.is_compiling()
    ):
        return None
    if torch.is_autocast_enabled("cpu"):
        bf16 = torch.get_autocast_dtype("cpu") == torch.bfloat16
        return torch.bfloat16 if bf16 and _BF16 and x.dtype in _AUTOCAST_INPUTS else None
    return torch.float32 if x.dtype == torch.float32 else None


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    packed: PackedWeight | None = None,
    *,
    activation: str | None = None,
    residual: Tensor | None = None,
) -> Tensor:
    """``act(x @ weight.T + bias) + residual``, as ``F.linear`` followed by the activation and
    the addition.

    On the oneDNN path the activation and (for float32) the residual addition are fused into the
    matrix product, saving one pass over the output each. Everywhere else they are separate
    operations with the same result up to floating-point rounding.

    Args:
        x: ``(..., in)`` input.
        weight: ``(out, in)`` weight.
        bias: ``(out,)`` bias or ``None``.
        packed: cache of ``weight``'s prepacked copy; with it, CPU inference runs through
            oneDNN (see the module docstring).
        activation: ``None``, ``"relu"`` or ``"gelu"`` (exact, erf form).
        residual: optional ``(..., out)`` tensor added to the (activated) product. Under
            bfloat16 autocast the sum takes the type promotion of ``residual + product``
            (float32 for a float32 residual), as the unfused expression would.

    Returns:
        ``(..., out)``, ``x``'s dtype (bfloat16 under bfloat16 autocast), or the promoted dtype
        with a residual.

    Raises:
        ValueError: for an unknown activation.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS, key=str)}")
    dtype = None if packed is None else _fast_dtype(x, weight)
    if dtype is not None:
        w, b = packed.get(weight, bias, dtype)
        x = x.to(dtype)
        if residual is not None and activation is None and residual.dtype == dtype:
            return _MKLDNN._linear_pointwise.binary(x, residual, w, b, "add")
        attr, algorithm = _ACTIVATIONS[activation]
        y = _MKLDNN._linear_pointwise(x, w, b, attr, [], algorithm)
    else:
        y = F.linear(x, weight, bias)
        if activation is not None:
            y = F.relu(y) if activation == "relu" else F.gelu(y)
    return y if residual is None else residual + y


class Linear(nn.Linear):
    """``nn.Linear`` whose float32 CPU inference goes through :func:`linear`'s oneDNN path."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._packed = PackedWeight()

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in)`` -> ``(..., out)``."""
        return linear(x, self.weight, self.bias, self._packed)
