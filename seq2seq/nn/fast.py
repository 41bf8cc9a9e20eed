"""The one seam for speed tricks that measured end to end pay (``benchmarks/README.md``,
section ``ablation.py``).

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
``one_query``          ``attention.attention`` (SDPA)        cached decoding steps in
                                                             inference on CPU: two batched
                                                             products
``cache``              ``kv_cache.KVCache`` (batch-major)    decoding: time-major
                                                             self-attention cache
                                                             (:mod:`~seq2seq.nn.time_major_cache`)
``slots``              beams in score order                  beam search: beams stay in
                                                             their parent's cache row
``step``               ``Decoder`` module by module          cached decoding steps in
                                                             float32 CPU inference: one
                                                             position per row, written out
                                                             (:mod:`seq2seq.nn.step`)
``small_rows``         the ``linear`` trick's oneDNN product  float32 CPU inference, at most
                                                             64 rows: MKL's product with
                                                             the weight transposed once
``row_buckets``        ``F.linear`` on the rows as they come  CPU training and decoding in
                                                             bfloat16: rows padded to one
                                                             of 8 counts per octave
``heap``               glibc's heap defaults                 CPU training in bfloat16 and
                                                             CPU decoding: freed memory
                                                             kept for reuse
                                                             (:func:`keep_freed_heap`)
=====================  ====================================  ===============================

:func:`install` turns a model's ``nn.Linear`` and ``nn.Dropout`` modules into the
:class:`Linear` and :class:`Dropout` subclasses below (same parameters, same state dict);
:class:`~seq2seq.nn.Transformer` calls it. The fused output projection + loss
(:func:`seq2seq.nn.linear_label_smoothed_cross_entropy`) and the feed-forward sub-layers on
real tokens only (``Transformer.features(..., src_index, tgt_index)``, whose row counts
:func:`bucket_index` rounds up) are chosen by their callers; ``TranslationModule`` uses them
when :func:`is_enabled`.

One setting switches every trick off: ``with seq2seq.nn.fast.enabled(False): ...``, or the
environment variable ``SEQ2SEQ_FAST=0`` for a whole process. ``enabled(False, "topk")``
switches one trick off (for the ablation).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from seq2seq.nn.kv_cache import KVCache
from seq2seq.nn.time_major_cache import TimeMajorKVCache

__all__ = [
    "TRICKS",
    "TimeMajorKVCache",
    "self_attention_cache",
    "slots_in_place",
    "one_query_attention",
    "batched_product",
    "Operands",
    "inference_operands",
    "inference_product",
    "use_one_query",
    "Dropout",
    "Linear",
    "PackedWeight",
    "enabled",
    "install",
    "keep_freed_heap",
    "is_enabled",
    "bfloat16_cpu_product",
    "bucket_index",
    "bucketed_linear",
    "linear",
    "row_bucket",
    "small_product",
    "topk",
    "SMALL_ROWS",
]

TRICKS = (
    "linear",
    "dropout",
    "topk",
    "one_query",
    "cache",
    "slots",
    "step",
    "small_rows",
    "fused_loss",
    "real_rows",
    "row_buckets",
    "heap",
)
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


# A fused optimizer step (AdamW(fused=True)) writes the weights in place without bumping their
# version counters: every optimizer step of this process counts, so each packed copy is rebuilt.
_optimizer_steps = 0


def _count_optimizer_step(optimizer, args, kwargs) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


class PackedWeight:
    """A weight's oneDNN-prepacked copy (float32, or bfloat16 for autocast), rebuilt when the
    weight changes: keyed on its storage and version counter (an in-place update,
    ``load_state_dict``) and on the optimizer steps taken in this process (a fused optimizer
    leaves the version counter as it is). Writes through ``weight.data`` are not seen. A plain
    attribute, never part of a state dict."""

    __slots__ = ("bias", "key", "packed", "transposed", "transposed_key")

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.packed: Tensor | None = None
        self.bias: Tensor | None = None
        self.transposed: Tensor | None = None
        self.transposed_key: tuple | None = None

    def get(
        self, weight: Tensor, bias: Tensor | None = None, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor | None]:
        """The packed weight and the bias, both in ``dtype``."""
        key = (_key(weight), _key(bias), dtype, _optimizer_steps)
        if key != self.key or self.packed is None:
            self.packed = _MKLDNN._reorder_linear_weight(weight.detach().to(dtype), _BATCH_HINT)
            self.bias = None if bias is None else bias.detach().to(dtype)
            self.key = key
        return self.packed, self.bias

    def transposed_weight(self, weight: Tensor) -> Tensor:
        """``weight.T`` ``(in, out)``, contiguous, for :func:`small_product`; rebuilt as above."""
        key = (_key(weight), _optimizer_steps)
        if key != self.transposed_key or self.transposed is None:
            self.transposed = weight.detach().t().contiguous()
            self.transposed_key = key
        return self.transposed


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
    (``F.linear``'s result dtype and operand rounding there); float32 products of at most
    :data:`SMALL_ROWS` rows run through :func:`small_product` (the ``small_rows`` trick).
    ``(..., in)`` -> ``(..., out)``."""
    dtype = None if packed is None else _onednn_dtype(x, weight)
    if dtype is None:
        return F.linear(x, weight, bias)
    if dtype == torch.float32 and _ON["small_rows"] and x.numel() <= SMALL_ROWS * x.size(-1):
        return small_product(x, packed.transposed_weight(weight), bias)
    w, b = packed.get(weight, bias, dtype)
    if dtype == torch.bfloat16 and _ON["row_buckets"]:  # oneDNN compiles per row count
        return _on_bucketed_rows(
            x, lambda rows: _MKLDNN._linear_pointwise(rows, w, b, "none", [], ""), dtype
        )
    return _MKLDNN._linear_pointwise(x.to(dtype), w, b, "none", [], "")


# The most rows of a float32 CPU inference product through small_product (``small_rows``): on
# an Ice Lake Xeon, prepacked oneDNN took 37-65 us at 1-4 rows of README-size layers, MKL 13-29.
SMALL_ROWS = 64


def small_product(
    x: Tensor, weight_t: Tensor, bias: Tensor | None = None, post: str = "none"
) -> Tensor:
    """``x @ weight_t + bias`` through BLAS (MKL's ``addmm``), ReLU'd with ``post="relu"``:
    ``(..., in)`` float32 and ``weight_t`` ``(in, out)`` -> ``(..., out)``."""
    rows = x if x.dim() == 2 else x.reshape(-1, x.size(-1))
    y = torch.mm(rows, weight_t) if bias is None else torch.addmm(bias, rows, weight_t)
    y = y.relu_() if post == "relu" else y
    return y if x.dim() == 2 else y.view(*x.shape[:-1], weight_t.size(1))


class Linear(nn.Linear):
    """``nn.Linear`` whose CPU inference goes through :func:`linear`'s oneDNN path."""

    _packed: PackedWeight

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in)`` -> ``(..., out)``."""
        if _bucketed(x, self.weight):
            return bucketed_linear(x, self.weight, self.bias)
        return linear(x, self.weight, self.bias, self._packed)


# --------------------------------------------------------------------------- row buckets
# oneDNN compiles a bfloat16 product (AMX or AVX512-BF16 kernels) for every new shape, and a
# training batch brings new row counts at every step: on an AMX Xeon, products of 1,500-3,000
# new rows x 256 x 1,024 took 2.5 times as long as with compiled kernels (benchmarks/README.md).
# Decoding brings a new row count whenever a sentence ends; with the default capacity of
# oneDNN's primitive cache (1,024) beam 5 over test_2016_flickr took 1.4 times as long.


def row_bucket(rows: int) -> int:
    """``rows`` rounded up to a multiple of an eighth of its octave, ``2 ** (floor(log2 rows) -
    3)``, and of 16: 8 counts per octave, at most 12.5% (about 4% on average) more rows from
    128 rows on, at most 15 more below."""
    step = max(16, 1 << max(rows.bit_length() - 4, 0))
    return -(-rows // step) * step


def _bucketed(x: Tensor, weight: Tensor) -> bool:
    """Whether the product of ``x`` and ``weight`` is CPU training in bfloat16 (autocast or
    bfloat16 tensors) with the ``row_buckets`` trick on."""
    return torch.is_grad_enabled() and bfloat16_cpu_product(x, weight, "row_buckets")


def bfloat16_cpu_product(x: Tensor, weight: Tensor, trick: str) -> bool:
    """Whether ``x @ weight.T`` runs in bfloat16 on CPU (under bfloat16 autocast, or both
    bfloat16), outside compiled code, with ``trick`` on."""
    if not (_ON[trick] and x.device.type == "cpu" and not torch.compiler.is_compiling()):
        return False
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu") == torch.bfloat16 and x.dtype in _AUTOCAST_INPUTS
    return x.dtype == weight.dtype == torch.bfloat16


def bucket_index(index: Tensor, total: int, weight: Tensor) -> Tensor:
    """``index``, ``(N,)`` long positions of the real tokens in a flattened ``(B * L)`` layout,
    followed by padding positions up to :func:`row_bucket` of ``N`` (at most ``total``), when
    training products with ``weight`` run in bfloat16 on CPU; otherwise ``index`` itself. The
    rows at padding positions are computed like any other, and a loss ignores their padding
    targets."""
    n = index.numel()
    size = min(row_bucket(n), total)
    if size == n or not _bucketed(weight, weight):
        return index
    free = torch.ones(total, dtype=torch.bool, device=index.device)
    free[index] = False
    return torch.cat([index, free.nonzero().squeeze(1)[: size - n]])


def bucketed_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` over the rows of ``x`` padded with zeros to
    :func:`row_bucket` of their number; the padding's outputs are dropped, so its gradients are
    zero. ``(..., in)`` -> ``(..., out)``, in ``F.linear``'s dtype."""
    # cast before padding under autocast: one copy, not two
    dtype = torch.bfloat16 if torch.is_autocast_enabled("cpu") else None
    return _on_bucketed_rows(x, lambda rows: F.linear(rows, weight, bias), dtype)


def _on_bucketed_rows(x: Tensor, product, dtype: torch.dtype | None) -> Tensor:
    """``product`` of the rows of ``x`` ``(..., in)`` (cast to ``dtype`` unless ``None``),
    padded with zero rows to :func:`row_bucket` of their number, the padding's outputs dropped:
    ``(..., out)``."""
    rows = x.reshape(-1, x.size(-1))
    if dtype is not None:
        rows = rows.to(dtype)
    n = rows.size(0)
    extra = row_bucket(n) - n
    out = product(F.pad(rows, (0, 0, 0, extra)))[:n] if extra else product(rows)
    return out.reshape(*x.shape[:-1], out.size(-1))


# --------------------------------------------------------------------------- heap
# glibc maps every block above a threshold (that it moves up to 32 MiB as blocks are freed)
# afresh and unmaps it on free, and returns the heap's free top to the system: each new
# activation then page-faults in again. Kept, bfloat16 steps on batches of varying shapes ran
# 12-20% faster on an AMX Xeon, the README job 1.5%, float32 decoding of test_2016_flickr 8%
# (greedy) and 14% (beam 5) faster (benchmarks/README.md, cpu_bf16.py). Translator (on CPU)
# and TranslationModule.setup call it.

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters


def keep_freed_heap() -> bool:
    """With the ``heap`` trick on and glibc's allocator, have it keep freed memory for reuse for
    the rest of the process: blocks up to 32 MiB come from the heap (``M_MMAP_THRESHOLD``), whose
    top is returned to the system only beyond 2 GiB free (``M_TRIM_THRESHOLD``) and grows 512 MiB
    at a time (``M_TOP_PAD``); the process keeps its peak memory. The environment variables
    ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_TOP_PAD_`` set the same.
    Returns whether it was applied."""
    if not _ON["heap"]:
        return False
    try:
        libc = ctypes.CDLL(None)
        # glibc only: other C libraries read these parameters otherwise
        mallopt = libc.mallopt if hasattr(libc, "gnu_get_libc_version") else None
    except OSError:
        return False
    if mallopt is None:
        return False
    settings = (
        (_M_MMAP_THRESHOLD, 32 << 20),
        (_M_TRIM_THRESHOLD, 2**31 - 1),
        (_M_TOP_PAD, 512 << 20),
    )
    return all(mallopt(param, value) == 1 for param, value in settings)


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


def topk(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``x.topk(n, dim=-1)`` of ``(R, W)`` scores, best first (ties may pick other indices of
    equal values).

    On CPU, for wide rows, a maximum over blocks of 64 entries comes first: the ``n`` largest
    entries lie in the ``n`` blocks with the largest maxima, so ``topk`` then runs over
    ``n * 64`` entries instead of ``W`` (5 instead of 15 ms for ``64 x 40000``, ``n = 10``).
    """
    rows, width = x.shape
    wide = width % 64 == 0 and width >= 8 * 64 * n
    if not (_ON["topk"] and x.device.type == "cpu" and wide and x.is_contiguous()):
        return x.topk(n, dim=-1)
    blocks = x.view(rows, width // 64, 64)
    top_blocks = blocks.amax(dim=-1).topk(n, dim=-1).indices  # (R, n)
    inside = blocks.gather(1, top_blocks.unsqueeze(-1).expand(rows, n, 64)).view(rows, n * 64)
    values, pos = inside.topk(n, dim=-1)
    return values, top_blocks.gather(1, pos // 64) * 64 + pos % 64


# --------------------------------------------------------------------------- attention


def use_one_query(q: Tensor, dropout: float) -> bool:
    """Whether a cached decoding step (one query per row, ``(B, H, T, Dh)`` with ``T`` the
    beams sharing a cross-attention row) takes :func:`one_query_attention`: CPU inference."""
    return (
        _ON["one_query"]
        and q.device.type == "cpu"
        and dropout == 0.0
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
    )


def one_query_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False
) -> Tensor:
    """:func:`seq2seq.nn.attention.attention` for a cached decoding step, as two batched
    products (``softmax(q K^T / sqrt(Dh) + M) V``): SDPA's CPU kernel costs about 1.7 ms per
    call at ``64 x 4`` heads of one query over 30 keys, the products and softmax about 1 ms.
    ``is_causal`` restricts nothing here: the queries are the newest positions (or, grouped,
    the beams of one sentence in cross-attention). ``mask`` allows at least one key per row
    (the caller's :func:`~seq2seq.nn.attention.attend_first_if_empty`)."""
    scores = batched_product(q, k.transpose(-2, -1)).mul_(q.size(-1) ** -0.5)
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    return batched_product(scores.softmax(dim=-1), v)


def batched_product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of ``(..., M, K)`` and ``(..., K, N)`` in ``a``'s dtype, through one ``bmm``
    when the batch dimensions are equal: ``matmul``'s broadcasting costs about 10 µs of views
    and copies a call, 12 calls a step of the README model at one row."""
    b = b if b.dtype == a.dtype else b.to(a.dtype)
    if a.dim() < 3 or a.shape[:-2] != b.shape[:-2]:
        return torch.matmul(a, b)
    flat = torch.bmm(a.flatten(0, -3), b.flatten(0, -3))
    return flat.view(*a.shape[:-1], b.size(-1))


# --------------------------------------------------------------------------- decoder step
# The operands of the products of seq2seq.nn.step.decoder_step (the ``step`` trick).


class Operands(NamedTuple):
    """The operands of one float32 CPU inference product, :func:`inference_product`'s
    arguments after ``x`` in order (``inference_product(x, *operands)``)."""

    weight: Tensor  # oneDNN's packed copy when ``prepacked``, else the module's weight
    bias: Tensor | None
    prepacked: bool
    transposed: Tensor | None  # the small_rows trick's weight, or None
    post: str = "none"  # "relu": ReLU after the product (oneDNN's post-op when prepacked)


def inference_operands(lin: nn.Module) -> Operands:
    """The :class:`Operands` of ``lin``'s float32 CPU inference product: the oneDNN-packed
    weight where :class:`Linear` would take it (the ``linear`` trick), else the weight itself;
    with the ``small_rows`` trick on, the transposed weight of :func:`small_product`."""
    packed = getattr(lin, "_packed", None)
    if packed is None or not (_ON["linear"] and _ONEDNN) or lin.weight.dtype != torch.float32:
        return Operands(lin.weight, lin.bias, False, None)
    transposed = packed.transposed_weight(lin.weight) if _ON["small_rows"] else None
    return Operands(*packed.get(lin.weight, lin.bias), True, transposed)


def inference_product(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    prepacked: bool,
    transposed: Tensor | None = None,
    post: str = "none",
) -> Tensor:
    """``x @ weight.T + bias`` of :func:`inference_operands` (the fields of
    :class:`Operands`), ReLU'd with ``post="relu"``; at most :data:`SMALL_ROWS` rows through
    :func:`small_product` when ``transposed`` is given. ``(N, in)`` float32 -> ``(N, out)``."""
    if transposed is not None and x.numel() <= SMALL_ROWS * x.size(-1):
        return small_product(x, transposed, bias, post)
    if prepacked:
        return _MKLDNN._linear_pointwise(x, weight, bias, post, [], "")
    y = F.linear(x, weight, bias)
    return torch.relu_(y) if post == "relu" else y


# --------------------------------------------------------------------------- decoding caches


def self_attention_cache() -> type[KVCache]:
    """The class of the self-attention caches of a new decoding run."""
    return TimeMajorKVCache if _ON["cache"] else KVCache


def slots_in_place(parent: Tensor) -> Tensor:
    """An order of the new beams of each sentence that keeps them in their parent's slot.

    Beam slots carry no order (beams are compared by score only), so each parent's first
    (best) child takes the parent's slot and the other children fill the free slots, in order;
    reordering the caches then leaves the first children's rows where they are
    (:class:`TimeMajorKVCache` copies only the others). Switched off: the identity.

    Args:
        parent: ``(A, K)`` long parent slot of each new beam.

    Returns:
        ``(A, K)`` long ``order``: slot ``s`` receives new beam ``order[:, s]``.
    """
    a, k = parent.shape
    slot_ids = torch.arange(k, device=parent.device)
    if not _ON["slots"]:
        return slot_ids.expand(a, k)
    same = parent.unsqueeze(2) == parent.unsqueeze(1)  # (A, K, K): beams j, i share a parent
    first = ~(same & (slot_ids.unsqueeze(1) > slot_ids)).any(dim=2)  # no earlier sibling
    taken = (parent.unsqueeze(2) == slot_ids).any(dim=1)  # (A, K): slot is some beam's parent
    free = torch.sort(taken.long() * k + slot_ids, dim=1).values % k  # free slots first
    rank = (~first).long().cumsum(dim=1) - 1  # position of a later sibling among them
    slot = torch.where(first, parent, free.gather(1, rank.clamp_min(0)))
    return torch.empty_like(slot).scatter_(1, slot, slot_ids.expand(a, k).contiguous())
