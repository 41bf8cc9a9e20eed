"""Label-smoothed cross entropy.

Shapes follow the legend in :mod:`seq2seq.nn.attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.nn import fast
from seq2seq.nn.fast import PackedWeight, linear

__all__ = ["label_smoothed_cross_entropy", "linear_label_smoothed_cross_entropy"]


class _LabelSmoothedCE(torch.autograd.Function):
    """Fused forward/backward: one float32 log-softmax pass forward, one pass backward.

    The gradient with respect to the logits of a kept token,
    ``g_loss * (p - (1 - eps) * onehot - eps / V) + g_nll * (p - onehot)`` with ``p`` the
    softmax, is written directly instead of through autograd's gather, sum and log-softmax.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, ignore_index: int):
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        keep = target != ignore_index
        safe_target = target.masked_fill(~keep, 0).unsqueeze(-1)
        nll_sum = -(lprobs.gather(-1, safe_target).squeeze(-1) * keep).sum()
        smooth_sum = -(lprobs.sum(dim=-1) * keep).sum()
        vocab = lprobs.size(-1)
        loss_sum = (1.0 - epsilon) * nll_sum + epsilon / vocab * smooth_sum
        ctx.save_for_backward(lprobs, safe_target, keep)
        ctx.epsilon = epsilon
        ctx.logits_dtype = logits.dtype
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss: Tensor, g_nll: Tensor):
        lprobs, safe_target, keep = ctx.saved_tensors
        eps = ctx.epsilon
        keep = keep.unsqueeze(-1).to(lprobs.dtype)
        scale = (g_loss + g_nll) * keep
        shift = (g_loss * eps / lprobs.size(-1)) * keep
        # softmax(log p) == p; the softmax kernel is faster than exp on CPU.
        grad = lprobs.softmax(dim=-1).mul_(scale).sub_(shift)
        onehot = -(g_loss * (1.0 - eps) + g_nll) * keep
        grad.scatter_add_(-1, safe_target, onehot)
        return grad.to(ctx.logits_dtype), None, None, None


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int = 0
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed cross entropy and summed negative log-likelihood.

    ``loss = (1 - eps) * nll + eps / V * sum_v(-log p_v)`` per token: cross entropy against the
    target distribution ``(1 - eps) * onehot + eps / V`` (Szegedy et al. 2016, Sec. 7; the form
    of ``F.cross_entropy(..., label_smoothing=eps)``). Computed in float32 whatever the dtype of
    ``logits``, with a hand-written backward (one pass over the ``(N, V)`` probabilities).

    Args:
        logits: ``(N, V)`` or ``(B, T, V)`` float logits (any float dtype, may be a
            non-contiguous view).
        target: ``(N,)`` or ``(B, T)`` long target ids.
        epsilon: smoothing ``eps`` in ``[0, 1]``.
        ignore_index: target id that contributes nothing (padding).

    Returns:
        ``(loss_sum, nll_sum)``: float32 scalars summed over non-ignored tokens; divide by the
        number of such tokens for a mean. Both are differentiable.

    Raises:
        ValueError: if shapes do not match.
    """
    if logits.shape[:-1] != target.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree: "
            "expected logits of shape target.shape + (V,)"
        )
    return _LabelSmoothedCE.apply(logits, target, float(epsilon), ignore_index)


_GROUP_BYTES = 256 << 20  # the most logit gradients kept for one weight-gradient product


class _LinearLabelSmoothedCE(torch.autograd.Function):
    """Output projection + label-smoothed cross entropy over row chunks (see
    :func:`linear_label_smoothed_cross_entropy`). The forward pass also computes the gradients
    of ``loss_sum`` with respect to the hidden states and the weight, chunk by chunk; backward
    only scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, target, epsilon, ignore_index, chunk_size, bias):
        n, vocab = hidden.size(0), weight.size(0)
        device_type = hidden.device.type
        autocast = torch.is_autocast_enabled(device_type)
        grad_hidden = torch.empty_like(hidden)
        low = (torch.float16, torch.bfloat16)
        acc_dtype = torch.float32 if weight.dtype in low else weight.dtype
        # Under bfloat16 autocast the chunks' logit gradients are kept, up to _GROUP_BYTES of
        # them, and the weight gradient is one product over their rows, as autocast computes any
        # linear layer's: a product per chunk would add a V x D block in float32 per chunk.
        # (float16 keeps a product per chunk: a sum over more rows could overflow its range.)
        bf16 = autocast and torch.get_autocast_dtype(device_type) == torch.bfloat16
        grouped = bf16 and weight.dtype not in low and n > 0
        grad_weight = None if grouped else torch.zeros_like(weight, dtype=acc_dtype)
        grad_bias = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
        fused_acc = not autocast and hidden.dtype == acc_dtype
        # Logits through seq2seq.nn.fast.linear: on CPU the weight is packed for oneDNN once per
        # call and reused by every chunk (float32, or bfloat16 under autocast).
        packed, full_weight, full_bias = PackedWeight(), weight, bias
        if autocast:  # cast the weight once, not in every chunk's two products
            weight = weight.to(torch.get_autocast_dtype(device_type))
            bias = None if bias is None else bias.to(weight.dtype)
        loss_sum = hidden.new_zeros((), dtype=torch.float32)
        nll_sum = hidden.new_zeros((), dtype=torch.float32)
        # A short last chunk is padded with ignored rows where the products run in bfloat16 on
        # CPU, so that oneDNN reuses the kernels it compiled for the others (fast.row_buckets).
        pad_last = n > chunk_size and fast.bfloat16_cpu_product(hidden, weight, "row_buckets")
        if grouped:
            group = max(1, _GROUP_BYTES // (vocab * weight.element_size() * chunk_size))
            group *= chunk_size
            group = min(group, -(-n // chunk_size) * chunk_size)
            lows = hidden.new_empty((group, vocab), dtype=weight.dtype)
            kept_rows = hidden.new_empty((group, hidden.size(1)), dtype=weight.dtype)
        for start in range(0, n, chunk_size):
            h = hidden[start : start + chunk_size]
            t = target[start : start + chunk_size]
            rows = h.size(0)
            if pad_last and rows < chunk_size:
                h = F.pad(h, (0, 0, 0, chunk_size - rows))
                t = F.pad(t, (0, chunk_size - rows), value=ignore_index)
            keep = (t != ignore_index).unsqueeze(1)
            t = t.masked_fill(~keep.squeeze(1), 0).unsqueeze(1)
            # Logits in the dtype autocast chooses; log-probabilities in float32.
            if device_type == "cpu":
                logits = linear(h, full_weight, full_bias, packed=packed)
            elif bias is None:
                logits = h @ weight.t()
            else:
                logits = torch.addmm(bias, h, weight.t())
            lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
            nll = -(lprobs.gather(1, t) * keep).sum()
            smooth = -(lprobs.sum(dim=1, keepdim=True) * keep).sum()
            nll_sum += nll
            loss_sum += (1.0 - epsilon) * nll + epsilon / vocab * smooth
            # d loss / d logits = p - (1 - eps) * onehot - eps / V on kept rows. Ignored rows are
            # zeroed on the (rows, D) side of the two products, not in the (rows, V) gradient:
            # each pass over the (rows, V) block costs as much as a product here.
            grad = lprobs.exp_()
            grad.scatter_add_(1, t, keep.to(grad.dtype).mul_(-(1.0 - epsilon)))
            keep_h = keep.to(h.dtype)
            if grad_bias is not None:  # d loss / d bias: the logits' gradient over kept rows
                kept = keep.squeeze(1).to(grad.dtype)
                with torch.autocast(device_type, enabled=False):  # a float32 sum, not bf16's
                    grad_bias += kept @ grad - epsilon / vocab * kept.sum()
            # Subtract eps / V and round to the products' dtype in one pass.
            dtype = weight.dtype if autocast else h.dtype
            if grouped:
                at = start % group
                low = lows[at : at + h.size(0)]
            else:
                low = grad if grad.dtype == dtype else torch.empty_like(grad, dtype=dtype)
            torch.sub(grad, epsilon / vocab, out=low)
            grad_hidden[start : start + rows] = ((low @ weight) * keep_h)[:rows]
            if grouped:
                end = at + h.size(0)
                torch.mul(h, keep_h, out=kept_rows[at:end])
                if end == group or start + chunk_size >= n:  # the group is full, or the last
                    part = lows[:end].t() @ kept_rows[:end]
                    grad_weight = part.float() if grad_weight is None else grad_weight.add_(part)
            elif fused_acc:
                grad_weight.addmm_(low.t(), h * keep_h)
            else:
                grad_weight += low.t() @ (h * keep_h)
        saved = [grad_hidden, grad_weight.to(full_weight.dtype)]
        if grad_bias is not None:
            saved.append(grad_bias.to(full_bias.dtype))
        ctx.save_for_backward(*saved)
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss: Tensor, g_nll: Tensor):
        grad_hidden, grad_weight, *grad_bias = ctx.saved_tensors
        g = g_loss.to(grad_hidden.dtype)
        bias = grad_bias[0] * g.to(grad_bias[0].dtype) if grad_bias else None
        return grad_hidden * g, grad_weight * g.to(grad_weight.dtype), None, None, None, None, bias


def linear_label_smoothed_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    ignore_index: int = 0,
    chunk_size: int | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Output projection fused with :func:`label_smoothed_cross_entropy`.

    ``label_smoothed_cross_entropy(hidden @ weight.T + bias, target, epsilon)`` over chunks of
    ``chunk_size`` rows, never holding the ``(N, V)`` float32 logits; gradients are computed in
    the forward pass and scaled in backward (as Liger Kernel, Hsu et al. 2024, and Cut
    Cross-Entropy, Wijmans et al. 2024). Products in the autocast dtype, softmax in float32.

    Args:
        hidden: ``(N, D)`` float hidden states (e.g. the decoder's final states at the target
            positions; see ``Transformer.features``).
        weight: ``(V, D)`` output projection (``Transformer.output_weight``).
        target: ``(N,)`` long target ids.
        epsilon: smoothing ``eps`` in ``[0, 1]``.
        ignore_index: target id that contributes nothing (padding).
        chunk_size: rows per chunk; default 256 on CPU (a chunk's logits stay in cache), 4096
            elsewhere (fewer kernel launches).
        bias: optional ``(V,)`` differentiable bias of the logits (``Transformer.output_bias``).

    Returns:
        ``(loss_sum, nll_sum)`` float32 scalars summed over non-ignored tokens. Only
        ``loss_sum`` is differentiable; ``nll_sum`` is for reporting.

    Raises:
        ValueError: if shapes do not match or ``chunk_size < 1``.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.size(1) != weight.size(1):
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} must be (N, D) and "
            "(V, D)"
        )
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias {tuple(bias.shape)} must be ({weight.size(0)},), as weight's V")
    if target.shape != hidden.shape[:1]:
        raise ValueError(f"target {tuple(target.shape)} must be ({hidden.size(0)},)")
    if chunk_size is None:
        chunk_size = 256 if hidden.device.type == "cpu" else 4096
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return _LinearLabelSmoothedCE.apply(
        hidden, weight, target, float(epsilon), ignore_index, chunk_size, bias
    )
