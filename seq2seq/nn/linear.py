"""Linear layers with a faster CPU inference path.

At decoding shapes (a few dozen to a few hundred rows times ``d_model``), oneDNN's matrix
product with a weight laid out ahead of time for it ("prepacked") is 10-40% faster than the
BLAS call behind ``F.linear`` on AVX-512 CPUs. :func:`linear` takes that path for float32 CPU
inference (autograd off, autocast off) and ``F.linear`` everywhere else: training, other
dtypes, other devices, or a PyTorch build without oneDNN. Results agree with ``F.linear`` to
float32 rounding (a different summation order).
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
_BATCH_HINT = 64  # rows the packed layout is tuned for; any number of rows is correct


class PackedWeight:
    """A weight's oneDNN-prepacked copy, rebuilt when the weight changes.

    The copy is keyed on the tensor's storage and version counter, so an optimizer step or a
    ``load_state_dict`` (both modify the weight in place) invalidates it. It is a plain
    attribute, never part of a state dict.
    """

    __slots__ = ("key", "packed")

    def __init__(self) -> None:
        self.key: tuple[int, int, tuple[int, ...]] | None = None
        self.packed: Tensor | None = None

    def get(self, weight: Tensor) -> Tensor:
        key = (weight.data_ptr(), weight._version, tuple(weight.shape))
        if key != self.key or self.packed is None:
            self.packed = _MKLDNN._reorder_linear_weight(weight.detach(), _BATCH_HINT)
            self.key = key
        return self.packed


def _fast_path(x: Tensor, weight: Tensor) -> bool:
    return (
        _ONEDNN
        and not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


def linear(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, packed: PackedWeight | None = None
) -> Tensor:
    """``x @ weight.T + bias``, as ``F.linear``.

    Args:
        x: ``(..., in)`` input.
        weight: ``(out, in)`` weight.
        bias: ``(out,)`` bias or ``None``.
        packed: cache of ``weight``'s prepacked copy; with it, float32 CPU inference runs
            through oneDNN (see the module docstring).

    Returns:
        ``(..., out)``.
    """
    if packed is not None and _fast_path(x, weight):
        return _MKLDNN._linear_pointwise(x, packed.get(weight), bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` whose float32 CPU inference goes through :func:`linear`'s oneDNN path."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._packed = PackedWeight()

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in)`` -> ``(..., out)``."""
        return linear(x, self.weight, self.bias, self._packed)
