"""A plain line of training progress every ``log_every_n_steps`` optimizer steps
(:class:`TextProgress`), for a log written to a file or a pipe, where a progress bar's redraws
would fill it with carriage returns (fairseq switches to its ``simple`` log format there in the
same way). ``seq2seq fit`` adds it, with ``trainer.log_every_n_steps``, when stdout is not a
terminal and no progress bar is asked for::

    epoch 3 | step 350 | loss 3.214 | lr 8.93e-04 | tok/s 2,950 | 0:05:12

``loss`` and ``tok/s`` cover the optimizer steps since the previous line (for the first line:
since this process started training, also in a resumed run), so they never reuse figures of an
interrupted run:

- ``loss``: the mean of their ``train/loss`` values (the module's loss per real target token
  of one optimizer step), as fairseq's log lines average over their interval (one step's value
  alone swings from step to step); with gradient accumulation each optimizer step counts once.
- ``lr``: the learning rate of the optimizer step just taken (the first parameter group's, read
  from the optimizer, so it is known from the first step of a process, also in a resumed run).
- ``tok/s``: the real target tokens of those batches divided by the wall-clock seconds they
  took, validations excluded.
- the time (hours:minutes:seconds): with Lightning's ``Timer`` callback
  (``--trainer.max_time``), its training time of the whole run, the time ``max_time`` is
  checked against: the wall-clock time of every process of the run, validations included,
  restored from the checkpoint in a resumed run. Without a ``Timer``, the wall-clock time since
  this process started training.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Timer


class TextProgress(L.Callback):
    """Print the progress line of :mod:`seq2seq.callbacks.progress` every ``every_n_steps``
    optimizer steps (on global rank 0).

    Args:
        every_n_steps: optimizer steps between lines.

    Raises:
        ValueError: if ``every_n_steps`` is below 1.
    """

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._start = time.monotonic()
        self._printed: int | None = None
        self._lr: float | None = None  # learning rate of the last optimizer step
        self._tokens = 0  # real target tokens trained since the last line
        self._seconds = 0.0  # training time, in seconds, of those tokens before `_since`
        self._since: float | None = None  # when the clock last started; None while paused
        self._loss_sum = 0.0  # sum of the train/loss values of the steps since the last line
        self._loss_steps = 0  # number of those optimizer steps
        self._stepped = False  # an optimizer step was taken in the batch under way

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.monotonic()
        self._printed = trainer.global_step
        self._lr = None
        self._tokens, self._seconds, self._since = 0, 0.0, None
        self._loss_sum, self._loss_steps, self._stepped = 0.0, 0, False

    def _pause(self) -> None:
        """Stops the clock of the tok/s window (a validation, the end of an epoch)."""
        if self._since is not None:
            self._seconds += time.monotonic() - self._since
            self._since = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._since is None:  # the first batch of this process, an epoch, or after a pause
            self._since = time.monotonic()

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._lr = float(optimizer.param_groups[0]["lr"])
        # The module logs this step's train/loss after this hook (Lightning calls the
        # callbacks' hook first): it is read when the batch ends.
        self._stepped = True

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if isinstance(batch, dict):
            self._tokens += int(batch.get("n_tokens", 0))
        if self._stepped:  # the last batch of an optimizer step: its loss is logged now
            self._stepped = False
            loss = trainer.callback_metrics.get("train/loss")
            if loss is not None:
                self._loss_sum += float(loss)
                self._loss_steps += 1
        step = trainer.global_step
        if step == self._printed or step % self.every_n_steps:
            return
        self._printed = step
        now = time.monotonic()
        seconds = self._seconds + (now - self._since if self._since is not None else 0.0)
        tokens, loss_sum, loss_steps = self._tokens, self._loss_sum, self._loss_steps
        self._tokens, self._seconds, self._since = 0, 0.0, now
        self._loss_sum, self._loss_steps = 0.0, 0
        if not trainer.is_global_zero:
            return
        parts = [f"epoch {trainer.current_epoch}", f"step {step}"]
        if loss_steps:
            parts.append(f"loss {loss_sum / loss_steps:.3f}")
        lr = self._lr if self._lr is not None else trainer.progress_bar_metrics.get("train/lr")
        if lr is not None:
            parts.append(f"lr {float(lr):.2e}")
        if tokens and seconds > 0:
            parts.append(f"tok/s {tokens / seconds:,.0f}")
        timer = next((c for c in getattr(trainer, "callbacks", ()) if isinstance(c, Timer)), None)
        elapsed = timer.time_elapsed("train") if timer is not None else now - self._start
        parts.append(str(timedelta(seconds=int(elapsed))))
        print(" | ".join(parts), flush=True)
