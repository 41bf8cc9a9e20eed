"""``StepWindow``: the micro-batches of one optimizer step, turned into per-token gradients, the
logged training loss and a guard against a non-finite loss."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from seq2seq import compat
from seq2seq.checkpoint.load import resume_flags

__all__ = ["StepWindow"]


class StepWindow:
    """Sums over the micro-batches of one optimizer step (all ``accumulate_grad_batches`` of
    them), kept on the device until :meth:`close` reads them back, once per step.

    Training backpropagates the loss *summed* over target tokens; :meth:`close` divides the
    gradients by the real target tokens of the whole step on all processes, as fairseq does
    (Ott et al., 2019), and gives the label-smoothed loss and NLL per token of that step, not
    the last micro-batch's.
    """

    def __init__(self) -> None:
        self._tokens: torch.Tensor | None = None  # () long
        self._losses: torch.Tensor | None = None  # (2,): summed label-smoothed loss and NLL
        self._nonfinite: torch.Tensor | None = None  # () bool
        self._batches: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def add(
        self,
        loss_sum: torch.Tensor,
        nll_sum: torch.Tensor,
        n_tokens: torch.Tensor,
        batch_idx: int,
        index: torch.Tensor,
        accumulate_grad_batches: int,
    ) -> torch.Tensor:
        """Adds a micro-batch's sums (0-dim tensors; ``n_tokens`` long) without a device sync.

        Args:
            index: ``(B,)`` long 0-based lines of the batch's sentences, named if the loss is
                not finite.
            accumulate_grad_batches: the trainer's; Lightning divides the returned loss by it.

        Returns:
            The loss to backpropagate: ``loss_sum * accumulate_grad_batches``, so that the
            gradients hold d(sum of token losses).
        """
        if self._tokens is None:
            # At least float32, as wide as the loss (float64 under "64-true").
            dtype = torch.promote_types(loss_sum.dtype, torch.float32)
            self._tokens = torch.zeros((), dtype=torch.long, device=n_tokens.device)
            self._losses = torch.zeros(2, dtype=dtype, device=loss_sum.device)
            self._nonfinite = torch.zeros((), dtype=torch.bool, device=loss_sum.device)
        nonfinite = ~torch.isfinite(loss_sum.detach())
        self._nonfinite = self._nonfinite | nonfinite
        self._batches.append((batch_idx, index, nonfinite))
        self._tokens = self._tokens + n_tokens.detach()
        self._losses = self._losses + torch.stack([loss_sum, nll_sum]).detach().float()
        return loss_sum * accumulate_grad_batches

    def close(
        self,
        parameters: Iterable[torch.nn.Parameter],
        trainer: Any,
        checkpoint_dir: str | None = None,
    ) -> dict[str, torch.Tensor]:
        """Ends the step before its optimizer update: scales the gradients to d(mean over the
        step's real target tokens) and starts the next window.

        Args:
            parameters: the trained parameters; their ``.grad`` are scaled in place.
            trainer: the Lightning trainer: over its ``world_size`` processes DDP has averaged
                the gradients (multiplied back here) and ``strategy.reduce`` sums the window
                (one call, only with several processes); ``global_step``, ``current_epoch``
                and ``global_rank`` go into the error message.
            checkpoint_dir: the run's ``--checkpoint_dir``, named in how to resume.

        Returns:
            ``train/loss``, ``train/nll``, ``train/ppl`` (of the NLL, capped at e^50) and, when
            some parameter has a gradient, ``train/grad_norm`` (after scaling).

        Raises:
            FloatingPointError: if a micro-batch's loss on any process was not finite, naming
                the step and this process's batches; the gradients are left unscaled.
        """
        total = self._tokens.float()
        nonfinite = self._nonfinite.float()
        sums = torch.cat([torch.stack([total, nonfinite]), self._losses])
        world = trainer.world_size
        if world > 1:
            sums = trainer.strategy.reduce(sums, reduce_op="sum")
        total, nonfinite, loss_sum, nll_sum = sums.unbind()
        if nonfinite.item():  # the one host synchronisation per optimizer step
            raise FloatingPointError(self._nonfinite_message(trainer, checkpoint_dir))
        self._tokens = self._losses = self._nonfinite = None
        self._batches = []
        per_token = torch.stack([loss_sum, nll_sum]) / total.clamp(min=1)
        values = {"train/loss": per_token[0], "train/nll": per_token[1]}
        values["train/ppl"] = torch.exp(per_token[1].clamp(max=50))
        grads = [p.grad for p in parameters if p.grad is not None]
        compat.foreach_mul_(grads, world / total.clamp(min=1))
        if grads:
            # Every step, like the losses: a run that stops between two logging steps
            # (max_time) flushes the step metrics once more, which must not repeat an older
            # step's norm. One fused pass over the gradients.
            norms = compat.foreach_norm(grads)
            values["train/grad_norm"] = torch.linalg.vector_norm(torch.stack(norms))
        return values

    def _nonfinite_message(self, trainer: Any, checkpoint_dir: str | None) -> str:
        bad = [
            f"batch {batch_idx} of epoch {trainer.current_epoch} (sentences at 0-based lines "
            f"{index.tolist()[:8]}{' ...' if index.numel() > 8 else ''} of the training split)"
            for batch_idx, index, flag in self._batches
            if bool(flag)
        ]
        where = (
            "; ".join(bad)
            if bad
            else f"a batch of another process (this is rank {trainer.global_rank})"
        )
        return (
            f"non-finite training loss at step {trainer.global_step}: {where}. The optimizer step "
            "was not taken, so the weights and the checkpoints written so far are unaffected. "
            "Lower the learning rate, lengthen the warm-up or set trainer.gradient_clip_val, "
            f"then resume with {resume_flags(checkpoint_dir)}."
        )
