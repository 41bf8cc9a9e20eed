"""Learning-rate schedules for Transformer training."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


class InverseSqrtLR(LambdaLR):
    """Linear warmup, then decay proportional to the inverse square root of the step.

    The factor applied to each parameter group's base learning rate at optimizer step ``s``
    (counted from 1) is ``min(s / warmup_steps, sqrt(warmup_steps / s))``: it rises linearly to
    1 at ``warmup_steps`` and then decays as ``s ** -0.5``. This is the schedule of Vaswani et
    al. (2017), "Attention Is All You Need", Section 5.3, eq. 3, with the peak learning rate
    given by the optimizer's ``lr`` instead of ``d_model ** -0.5`` (fairseq's
    ``inverse_sqrt``).

    Step it once per optimizer step (Lightning: ``"interval": "step"``).

    Args:
        optimizer: the wrapped optimizer; its ``lr`` is the peak learning rate.
        warmup_steps: number of optimizer steps of linear warmup; 0 disables warmup.

    Raises:
        ValueError: if ``warmup_steps`` is negative.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 4000) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, lr_lambda=self._factor)

    def _factor(self, step: int) -> float:
        step = step + 1  # LambdaLR counts from 0; the first optimizer step is step 1.
        if self.warmup_steps == 0:
            return 1.0 / math.sqrt(step)
        return min(step / self.warmup_steps, math.sqrt(self.warmup_steps / step))
