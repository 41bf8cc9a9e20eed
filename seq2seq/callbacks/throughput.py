"""``TokenThroughput``: the ``train/tokens_per_s`` metric, as fairseq's ``wps``."""

from __future__ import annotations

import time
from typing import Any

import lightning as L

from seq2seq import compat

__all__ = ["TokenThroughput"]


class TokenThroughput(L.Callback):
    """Logs ``train/tokens_per_s`` (on the progress bar) at the end of every training batch:
    this process's real target tokens (``batch["n_tokens"]``) over the time of the batches since
    the value last went to the logger (every ``log_every_n_steps`` optimizer steps, all the
    micro-batches of the last one included), so a slow batch between two written values is not
    lost. A batch right after an epoch's start or a
    validation, whose time since the previous batch is unknown, is left out.

    :class:`~seq2seq.module.TranslationModule` adds it to every trainer
    (``configure_callbacks``); configs need not name it.
    """

    def __init__(self) -> None:
        self._last_batch_time: float | None = None  # when the previous training batch ended
        self._tokens, self._seconds = 0, 0.0  # the window since the last written value

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_batch_time = None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_batch_time = None  # not over a validation's time

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        tokens = int(batch.get("n_tokens", 0))
        if self._last_batch_time is not None and tokens:
            self._tokens += tokens
            self._seconds += now - self._last_batch_time
        self._last_batch_time = now
        if self._seconds > 0:
            pl_module.log("train/tokens_per_s", self._tokens / self._seconds, prog_bar=True)
            # Every micro-batch of a logged optimizer step is written (accumulate_grad_batches):
            # the window restarts after the step's last, so the value covers the whole step.
            ends_step = (batch_idx + 1) % getattr(trainer, "accumulate_grad_batches", 1) == 0
            if ends_step and compat.logs_written_now(trainer):
                self._tokens, self._seconds = 0, 0.0
