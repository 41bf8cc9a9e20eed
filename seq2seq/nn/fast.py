"""The one seam for speed tricks that measured end to end pay (``benchmarks/README.md``,
"Ablation").

Each trick computes what its plain counterpart computes, up to floating-point rounding (or, for
dropout, with another draw of the same distribution); ``tests/test_fast.py`` checks both agree.
The code in ``attention.py``, ``layers.py`` and ``search.py`` is the plain path:

=====================  ====================================  ===============================
trick                  plain counterpart                     where it runs
=====================  ====================================  ===============================
``linear``             ``nn.Linear`` / ``F.linear``          CPU inference, float32 weights:
                                                             oneDNN with prepacked weights
``dropout``            ``nn.Dropout``                        CPU training: 16-bit draws
``topk``               ``torch.topk``                        CPU beam search, wide rows
``argmax``             ``torch.argmax``                      CPU greedy search
=====================  ====================================  ===============================

:func:`install` turns a model's ``nn.Linear`` and ``nn.Dropout`` modules into the
:class:`Linear` and :class:`Dropout` subclasses below (same parameters, same state dict);
:class:`~seq2seq.nn.Transformer` calls it. The fused output projection + loss
(:func:`seq2seq.nn.linear_label_smoothed_cross_entropy`) and the feed-forward sub-layers on
real tokens only (``Transformer.features(..., src_index, tgt_index)``) are chosen by their
callers; ``TranslationModule`` uses them when :func:`is_enabled`.

One setting switches every trick off: ``with seq2seq.nn.fast.enabled(False): ...``, or the
environment variable ``SEQ2SEQ_FAST=0`` for a whole process. ``enabled(False, "topk")``
switches one trick off (for the ablation).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "TRICKS",
    "Dropout",
    "Linear",
    "PackedWeight",
    "argmax",
    "enabled",
    "install",
    "is_enabled",
    "linear",
    "topk",
]

TRICKS = ("linear", "dropout", "topk", "argmax", "fused_loss", "real_rows")
"""Names of the tricks (``fused_loss`` and ``real_rows`` are switched by their callers)."""

_ON = {name: os.environ.get("SEQ2SEQ_FAST", "1") not in ("0", "false", "off") for name in TRICKS}


def is_enabled(name: str) -> bool:
    """Whether trick ``name`` (one of :data:`TRICKS`) is on."""
    return _ON[name]


@contextlib.contextmanager
def enabled(on: bool, *names: str) -> Iterator[None]:
    """Switch the tricks ``names`` (default: all) on or off inside the ``with`` block.

    Raises:
        ValueError: for an unknown name.
    """
    unknown = set(names) - set(TRICKS)
    if unknown:
        raise ValueError(f"unknown speed tricks {sorted(unknown)}; choose from {TRICKS}")
    saved = dict(_ON)
    _ON.update({name: on for name in names or TRICKS})
    try:
        yield
    finally:
        _ON.update(saved)


# --------------------------------------------------------------------------- oneDNN products
# At decoding shapes (tens to hundreds of rows times d_model) oneDNN's product with a weight laid
# out for it ahead of time ("prepacked") is 10-40% faster than the BLAS call behind F.linear on
# AVX-512 CPUs; under bfloat16 autocast it also avoids converting the float32 weight at every
# call (1.3 ms for an 8000 x 256 output projection), using a bfloat16 copy packed once.

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


def _key(t: Tensor | None) -> tuple | None:
    return None if t is None else (t.data_ptr(), t._version, tuple(t.shape))


class PackedWeight:
    """A weight's oneDNN-prepacked copy (float32, or bfloat16 for autocast), rebuilt when the
    weight changes (keyed on its storage and version counter, so an optimizer step or a
    ``load_state_dict`` invalidates it). A plain attribute, never part of a state dict."""

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


def _onednn_dtype(x: Tensor, weight: Tensor) -> torch.dtype | None:
    """The dtype of the oneDNN product for this call, ``None`` for ``F.linear``: CPU
    inference (autograd off) with float32 weights, float32 inputs or bfloat16 autocast."""
    if not (
        _ON["linear"]
        and _ONEDNN
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
    x: Tensor, weight: Tensor, bias: Tensor | None = None, packed: PackedWeight | None = None
) -> Tensor:
    """``F.linear(x, weight, bias)``; with ``packed`` (the cache of ``weight``'s prepacked
    copy), CPU inference runs through oneDNN: float32, or bfloat16 under bfloat16 autocast
    (``F.linear``'s result dtype and operand rounding there). ``(..., in)`` -> ``(..., out)``."""
    dtype = None if packed is None else _onednn_dtype(x, weight)
    if dtype is None:
        return F.linear(x, weight, bias)
    w, b = packed.get(weight, bias, dtype)
    return _MKLDNN._linear_pointwise(x.to(dtype), w, b, "none", [], "")


class Linear(nn.Linear):
    """``nn.Linear`` whose CPU inference goes through :func:`linear`'s oneDNN path."""

    _packed: PackedWeight

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in)`` -> ``(..., out)``."""
        return linear(x, self.weight, self.bias, self._packed)


# --------------------------------------------------------------------------- dropout


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose CPU training draws the keep mask as 16-bit uniform integers, four
    from each 64-bit draw of torch's default generator (so ``torch.manual_seed`` and saved RNG
    states govern it as they do ``F.dropout``): about four times faster than ``F.dropout``'s
    Bernoulli sampling. ``p`` is rounded to a multiple of ``2**-16`` (0.1 becomes 0.100006) and
    the scale ``1 / (1 - p)`` uses the rounded value, so the expectation is kept exactly. Other
    devices and code being compiled (``random_`` breaks graphs) use ``F.dropout``."""

    def forward(self, x: Tensor) -> Tensor:
        """``(...)`` float -> same shape and dtype."""
        if not self.training or self.p == 0.0:
            return x
        if not _ON["dropout"] or x.device.type != "cpu" or torch.compiler.is_compiling():
            return F.dropout(x, self.p, training=True)
        threshold = round(self.p * 65536)  # drop where a uniform 16-bit draw < threshold
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
        draws = bits.view(torch.int16)[:n].view(x.shape)  # uniform over [-2**15, 2**15)
        keep = draws >= threshold - 32768
        return x * keep.to(x.dtype).mul_(65536 / (65536 - threshold))


def install(model: nn.Module) -> nn.Module:
    """Turn the ``nn.Linear`` and ``nn.Dropout`` modules of ``model`` into :class:`Linear` and
    :class:`Dropout` in place (their class only: parameters and state dict are unchanged).
    Returns ``model``."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = Linear
            module._packed = PackedWeight()
        elif type(module) is nn.Dropout:
            module.__class__ = Dropout
    return model


# --------------------------------------------------------------------------- search


def argmax(x: Tensor) -> Tensor:
    """``x.argmax(dim=-1)`` of ``(N, V)`` scores (the first index of each row's maximum).

    On CPU ``torch.argmax`` over a long row is an indexed reduction that does not vectorise; a
    maximum over blocks of 64 entries, then the arg-max within the best block, is 3-4x faster
    at ``V = 8000``. bfloat16/float16 rows are widened to float32 first (exact).
    """
    n, v = x.shape
    if not _ON["argmax"] or x.device.type != "cpu" or v % 64 or not x.is_contiguous():
        return x.argmax(dim=-1)
    if x.dtype in (torch.bfloat16, torch.float16):
        x = x.float()
    blocks = x.view(n, v // 64, 64)
    best = blocks.amax(dim=-1).argmax(dim=-1)  # the first block holding the row maximum
    return best * 64 + blocks[torch.arange(n, device=x.device), best].argmax(dim=-1)


def topk(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``x.topk(n, dim=-1)`` of ``(R, W)`` scores, best first (ties may pick other indices of
    equal values).

    On CPU, for wide rows, a maximum over blocks of 64 entries comes first: the ``n`` largest
    entries lie in the ``n`` blocks with the largest maxima, so ``topk`` then runs over
    ``n * 64`` entries instead of ``W`` (5 instead of 15 ms for ``64 x 40000``, ``n = 10``).
    """
    rows, width = x.shape
    if not _ON["topk"] or x.device.type != "cpu" or width % 64 or width < 8 * 64 * n:
        return x.topk(n, dim=-1)
    if not x.is_contiguous():
        return x.topk(n, dim=-1)
    blocks = x.view(rows, width // 64, 64)
    top_blocks = blocks.amax(dim=-1).topk(n, dim=-1).indices  # (R, n)
    inside = blocks.gather(1, top_blocks.unsqueeze(-1).expand(rows, n, 64)).view(rows, n * 64)
    values, pos = inside.topk(n, dim=-1)
    return values, top_blocks.gather(1, pos // 64) * 64 + pos % 64
