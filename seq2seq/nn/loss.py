"""Label-smoothed cross entropy.

Shapes follow the legend in :mod:`seq2seq.nn.attention`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["label_smoothed_cross_entropy"]


class _LabelSmoothedCE(torch.autograd.Function):
    """Fused forward/backward: one float32 log-softmax pass forward, one pass backward.

    The gradient with respect to the logits of a kept token is
    ``g_loss * (p - (1 - eps) * onehot - eps / V) + g_nll * (p - onehot)`` with ``p`` the softmax,
    written directly instead of through autograd's chain of gather, sum and log-softmax.
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
