"""``ExactResume``: the random generators' states and the loop-state fix-ups that make a run
resumed from a checkpoint continue the interrupted one exactly."""

from __future__ import annotations

import sys
from typing import Any

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from seq2seq import compat
from seq2seq.checkpoint.format import CHECKPOINT_KEY
from seq2seq.checkpoint.training import (
    capture_rng_state,
    keep_cut_epoch_unfinished,
    restore_rng_state,
    run_validation_again,
    settle_validation_progress,
    validation_cut_short,
)

__all__ = ["ExactResume"]


class ExactResume(L.Callback):
    """Makes a resumed ``fit`` draw the same dropout masks, train the same batches and log at the
    same steps as an uninterrupted run (Lightning restores optimizer, scheduler and loop state
    only).

    It writes the generators' states into ``checkpoint[CHECKPOINT_KEY]["rng"]`` (see
    :mod:`seq2seq.checkpoint.format`) and restores them at the first training batch after
    resuming, once the data loaders are set up. Inside a training batch (Ctrl-C) it writes the
    states from the batch's start, which the resumed run trains again. It corrects Lightning's
    loop state for stops that Lightning records as finished work:
    :func:`~seq2seq.checkpoint.training.keep_cut_epoch_unfinished`,
    :func:`~seq2seq.checkpoint.training.run_validation_again` and
    :func:`~seq2seq.checkpoint.training.settle_validation_progress`.

    :class:`~seq2seq.module.TranslationModule` adds it to every trainer
    (``configure_callbacks``); configs need not name it.
    """

    def __init__(self) -> None:
        self._resume_rng: dict[str, Any] | None = None  # from a loaded checkpoint, not yet used
        self._step_rng: dict[str, Any] | None = None  # at the start of the last training batch
        self._training_epoch: int | None = None  # the epoch under way in fit
        self._validation_open = False  # a validation of fit under way, not yet scored
        self._validation_cut = False  # the loaded checkpoint's validation, to be run again
        self.validated_at_start = False
        """Whether this fit, resumed with no batch left to train, ran the validation that a
        stop had cut short (:func:`run_cut_validation`)."""

    def validation_scored(self) -> None:
        """Called once a validation of ``fit`` is scored: a stop from then on need not run it
        again (its score is logged and its checkpoints follow)."""
        self._validation_open = False

    # ------------------------------------------------------------------ tracking
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A run resumed mid-epoch continues its epoch without on_train_epoch_start.
        self._training_epoch = trainer.current_epoch
        self._validation_open = False
        self._run_cut_validation(trainer)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A fit loop with nothing to train returns before on_train_start and on_train_end.
        if self._run_cut_validation(trainer):
            for callback in trainer.callbacks:
                if type(callback).__name__ == "LastCheckpoint":  # its end-of-training save
                    callback.on_train_end(trainer, pl_module)

    def _run_cut_validation(self, trainer: L.Trainer) -> bool:
        """Runs the loaded checkpoint's validation that a stop cut short where this fit has
        no batch to train (:func:`run_cut_validation`), once; whether it ran."""
        ran = self._validation_cut and _no_batch_left(trainer)
        self._validation_cut = False
        if ran:
            self.validated_at_start = True
            run_cut_validation(trainer)
        return ran

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training_epoch = trainer.current_epoch

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        # Nothing draws random numbers between this hook and training_step.
        if self._resume_rng is not None:
            restore_rng_state(self._resume_rng)  # the streams (dropout) where the run left them
            self._resume_rng = None
        self._step_rng = capture_rng_state()  # for a checkpoint written inside this batch

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validation_open = trainer.state.fn == "fit" and not trainer.sanity_checking

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        rng = self._step_rng if _batch_under_way(trainer) else None
        checkpoint.setdefault(CHECKPOINT_KEY, {})["rng"] = rng or capture_rng_state()
        checkpoint[CHECKPOINT_KEY]["precision"] = str(trainer.precision)
        if _epoch_cut_short(trainer, self._training_epoch):
            keep_cut_epoch_unfinished(checkpoint, self._training_epoch)
        if self._validation_open:  # stopped (Ctrl-C, SIGTERM) before this validation's score
            run_validation_again(checkpoint)
        else:
            settle_validation_progress(checkpoint)
        if _in_validation_forced_by_stop(trainer) and "loops" in checkpoint:
            # Written during the validation that a stop request added after the last batch,
            # before Lightning counted that batch in its logging step. A resumed run counts it
            # on its own only where this validation was due anyway (it then skips it);
            # otherwise it would log every value one step early.
            compat.add_to_saved_logged_step(checkpoint, 1)

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Restored at the next training batch, after the data loaders have been set up.
        self._resume_rng = checkpoint.get(CHECKPOINT_KEY, {}).get("rng")
        if self._resume_rng is not None and trainer.state.fn == "fit":
            # after Lightning's "Seed set to N", which a resumed run does not follow
            rank_zero_info(
                "Random generators continue from the checkpoint (dropout, batch order): "
                "seed_everything sets the start of a new run only"
            )
        warn_other_precision(trainer, checkpoint.get(CHECKPOINT_KEY, {}).get("precision"))
        settle_validation_progress(checkpoint)  # before Lightning restores its loops from it
        self._validation_cut = validation_cut_short(checkpoint)


def _no_batch_left(trainer: L.Trainer) -> bool:
    """Whether a resumed ``fit`` stops before its first batch: at ``max_steps`` or after
    ``max_epochs`` (Lightning's fit loop then ends without the validation it would run
    again)."""
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return True
    epochs = trainer.fit_loop.epoch_progress.current.processed
    return trainer.max_epochs not in (None, -1) and epochs >= trainer.max_epochs


def run_cut_validation(trainer: L.Trainer) -> None:
    """Runs the validation that a stop cut short, where the resumed ``fit`` has no batch left
    to train (the run's last validation, stopped with Ctrl-C or SIGTERM): Lightning runs such
    a validation again only after a training batch. Its score is logged and its checkpoints
    are written as the uninterrupted run's were, as the training loop runs it."""
    trainer.validating = True
    trainer.fit_loop.epoch_loop.val_loop.run()
    trainer.training = True


def warn_other_precision(trainer: L.Trainer, saved: str | None) -> None:
    """One line (global rank 0) when ``fit`` resumes a run that trained in another
    ``--trainer.precision`` (``saved``; ``None`` in checkpoints written before it was kept):
    the run goes on in the new one, with other rounding and speed, not as it would have."""
    current = None if saved is None else str(trainer.precision)
    if current is None or current == saved or trainer.state.fn != "fit":
        return
    if trainer.is_global_zero:
        print(
            f"seq2seq: warning: resuming a run trained with --trainer.precision {saved} under "
            f"--trainer.precision {current}: it goes on in {current} (give --trainer.precision "
            f"{saved} to keep the run's)",
            file=sys.stderr,
        )


def _batch_under_way(trainer: L.Trainer) -> bool:
    """Whether fit is inside a training batch (begun, not processed yet)."""
    if not trainer.training:
        return False
    batches = trainer.fit_loop.epoch_loop.batch_progress.current
    return batches.ready > batches.processed


def _epoch_cut_short(trainer: L.Trainer, epoch: int | None) -> bool:
    """Whether fit is stopping (``max_time``, ``max_steps``, early stopping) inside training
    epoch ``epoch``, after some of its batches and before its last one."""
    if not trainer.training or epoch is None:
        return False
    batches = trainer.fit_loop.epoch_loop.batch_progress
    if batches.current.completed == 0:
        return False
    if batches.is_last_batch or batches.current.ready >= trainer.num_training_batches:
        return False  # the epoch reached its end (or limit_train_batches)
    max_steps = trainer.max_steps
    return trainer.should_stop or (max_steps != -1 and trainer.global_step >= max_steps)


def _in_validation_forced_by_stop(trainer: L.Trainer) -> bool:
    """Whether fit is in a validation that runs after a training batch only because a stop was
    requested (``Trainer.should_stop``: ``max_time``, early stopping), not because the
    ``val_check_interval`` / epoch schedule asks for one at this batch.

    Mirrors Lightning's ``_TrainingEpochLoop._should_check_val_fx`` without its stop clause;
    a time-based ``val_check_interval`` counts as not due.
    """
    if not (trainer.validating and trainer.state.fn == "fit" and trainer.should_stop):
        return False
    if trainer.sanity_checking:
        return False
    loop = trainer.fit_loop.epoch_loop
    batches = loop.batch_progress
    if batches.current.completed == 0 or batches.current.completed != batches.current.ready:
        return False  # not after a finished training batch
    if batches.is_last_batch:
        return False
    if compat.val_check_time_interval(trainer) is not None:
        return True
    if trainer.val_check_batch == float("inf"):
        return True
    every_epoch = trainer.check_val_every_n_epoch is not None
    iteration = loop.batch_idx if every_epoch else loop.total_batch_idx
    return (iteration + 1) % trainer.val_check_batch != 0
