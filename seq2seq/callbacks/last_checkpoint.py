"""``LastCheckpoint``: ``last.ckpt`` after every validation, at the end of training and when a
run stops (Ctrl-C, SIGTERM, an error), with a Ctrl-C inside a batch finishing that batch."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from seq2seq import compat
from seq2seq.checkpoint.load import resume_flags
from seq2seq.checkpoint.training import recorded_step
from seq2seq.files import WriteError


class LastCheckpoint(L.Callback):
    """Writes ``last.ckpt`` after every validation of ``fit`` and when ``fit`` stops on an
    exception (Ctrl-C, SIGTERM, an error), in the folder of the trainer's ``ModelCheckpoint``.

    Lightning's ``ModelCheckpoint(save_last=True)`` rewrites ``last.ckpt`` only when it also keeps
    a checkpoint (a validation whose score ranks among the best ``save_top_k``), so without this
    callback a run resumed with ``--ckpt_path last`` restarts from its last improvement. The
    file holds the full training state (the ``ModelCheckpoint`` state included, so ``best`` still
    resolves). An interrupted run's state goes to ``last.ckpt`` only, not among the scored
    checkpoints (``ModelCheckpoint(save_on_exception=True)`` would add an unscored file there,
    which ``seq2seq average --last`` would then pick). When training ends after steps that no
    validation followed (``max_steps`` reached between validations), their state is written to
    ``last.ckpt`` too, so the file always holds the final step. Needs a ``ModelCheckpoint`` with
    a ``dirpath``; does nothing otherwise, nor in a ``fast_dev_run`` (which writes no
    checkpoint, as Lightning's own callbacks do there).

    In a single-process run, Ctrl-C (SIGINT) inside a training batch lets that batch finish,
    its optimizer update included, and stops at its end (a second Ctrl-C stops at once): an
    update cut short half-way would leave weights and optimizer state that no step of an
    uninterrupted run has. Outside a batch (e.g. during a validation) Ctrl-C stops at once.
    With gradient accumulation a "batch" here is the whole window of ``accumulate_grad_batches``
    batches of one optimizer step, for Ctrl-C and for Lightning's graceful stop on SIGTERM
    alike: a stop between them would lose the gradients of the window's first batches.
    """

    def __init__(self) -> None:
        #: The run's ``--checkpoint_dir`` (set by the command line when given), named in the
        #: messages that say how to resume.
        self.checkpoint_dir: str | None = None
        #: The TensorBoard logger's name where the command line gave it, named there too.
        self.logger_name: str | None = None
        self._saved_step: int | None = None  # global step of the last state written
        self._start_step: int | None = None  # global step when this process started training
        self._in_batch = False  # inside a training batch (or an accumulation window)
        self._interrupt_pending = False
        self._sigterm_pending = False  # a SIGTERM inside an accumulation window, held back
        self.stopped_on_ctrl_c = False  # fit stopped at a batch's end after a Ctrl-C
        self._previous_handler: Any = None  # the SIGINT handler replaced in on_train_start

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._in_batch and not self._interrupt_pending:
            self._interrupt_pending = True
            print(
                "Ctrl-C: stopping after the training batch under way (Ctrl-C again to stop now)",
                file=sys.stderr,
                flush=True,
            )
            return
        raise KeyboardInterrupt

    def _restore_sigint(self) -> None:
        if self._previous_handler is not None:
            if signal.getsignal(signal.SIGINT) == self._on_sigint:
                signal.signal(signal.SIGINT, self._previous_handler)
            self._previous_handler = None
        self._in_batch = self._interrupt_pending = self._sigterm_pending = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        self._in_batch = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if compat.accumulating(trainer):
            # No optimizer update yet: the batch window goes on. A SIGTERM now would stop with
            # the window's gradients accumulated but not applied, which a resumed run cannot
            # recover (it skips the batches counted as done): Lightning's stop waits for the
            # window's end.
            if compat.sigterm_received(trainer):
                compat.set_sigterm_received(trainer, False)
                self._sigterm_pending = True
            return
        self._in_batch = False
        if self._sigterm_pending:
            self._sigterm_pending = False
            compat.set_sigterm_received(trainer, True)
        if self._interrupt_pending:
            self._interrupt_pending = False
            self.stopped_on_ctrl_c = True
            # Lightning's graceful stop, as for SIGTERM: after this batch's logging (and a
            # validation due here), with the batch counted as done.
            if not compat.set_sigterm_received(trainer, True):
                raise KeyboardInterrupt

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # A resume from a copied or moved run folder: its ModelCheckpoint state names the old
        # folder, and Lightning would drop the scores of the kept checkpoints for it (the
        # next validation's becoming "best" whatever its score). Runs before any restore.
        states = checkpoint.get("callbacks") or {}
        for callback in getattr(trainer, "checkpoint_callbacks", []):
            state = states.get(callback.state_key)
            if isinstance(state, dict) and callback.dirpath:
                states[callback.state_key] = state_in_folder(state, callback.dirpath)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_sigint()
        path = self._path(trainer)
        if path is None or trainer.global_step in (0, self._saved_step):
            return
        self._save(trainer, path)
        checkpoint = trainer.checkpoint_callback
        if getattr(checkpoint, "monitor", None) and not getattr(checkpoint, "best_model_path", ""):
            rank_zero_info(
                f"training ended at step {trainer.global_step} before its first validation: no "
                f"checkpoint is scored by {checkpoint.monitor} yet (--ckpt_path best finds "
                f"none); the training state is in {path}: use {self._resume_flags()}"
            )

    def _resume_flags(self) -> str:
        return f"{resume_flags(self.checkpoint_dir, self.logger_name)} added to the run's command"

    def _path(self, trainer: L.Trainer) -> Path | None:
        checkpoint = trainer.checkpoint_callback
        if trainer.state.fn != "fit" or trainer.fast_dev_run:
            return None
        if not getattr(checkpoint, "dirpath", None):
            return None
        return Path(checkpoint.dirpath) / "last.ckpt"

    def _save(self, trainer: L.Trainer, path: Path) -> None:
        logged_steps = compat.logged_step(trainer)  # the step Lightning's loggers use
        batches = trainer.fit_loop.epoch_loop.batch_progress.current
        if batches.ready > batches.processed and logged_steps > 0:
            # Stopped inside a batch (Ctrl-C): the resumed run trains that batch again, and
            # Lightning, which adds one to this count when it resumes, would log it (and every
            # later value) one step late.
            compat.set_logged_step(trainer, logged_steps - 1)
        try:
            trainer.save_checkpoint(path, weights_only=False)
        finally:
            compat.set_logged_step(trainer, logged_steps)
        self._saved_step = trainer.global_step

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_step = trainer.global_step
        if (
            trainer.world_size == 1
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self._path(trainer)
        if path is None or trainer.sanity_checking:
            return
        # Runs before ModelCheckpoint's own hook (Lightning calls checkpoint callbacks last),
        # which overwrites this file with its updated record when it keeps this validation.
        self._save(trainer, path)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore_sigint()
        path = self._path(trainer)
        # Nothing trained in this process (e.g. an error while resuming, before the first
        # batch): the checkpoint it started from, or an earlier run's, is worth more.
        trained = not (
            path is None or self._start_step is None or trainer.global_step == self._start_step
        )
        if isinstance(exception, WriteError):
            # The disk refused a write: it is reported once, in the words of what it holds now.
            # The save is still tried (space may have been freed meanwhile), quietly.
            if path is not None:
                exception.kept = self._kept_after_write_error(trainer, path, save=trained)
            return
        if not trained:
            return
        try:
            self._save(trainer, path)
        except WriteError as err:  # the stop's own save failed: that is the error to report
            err.kept = self._kept_after_write_error(trainer, path, save=False)
            if not isinstance(exception, KeyboardInterrupt | SIGTERMException):
                err.kept += f" (Training had stopped on {type(exception).__name__}.)"
            raise
        cause = "KeyboardInterrupt" if self.stopped_on_ctrl_c else type(exception).__name__
        if self.stopped_on_ctrl_c or isinstance(exception, KeyboardInterrupt | SIGTERMException):
            rank_zero_info(
                f"{cause}: saved the training state at step "
                f"{trainer.global_step} to {path}; resume with {self._resume_flags()}"
            )
        else:  # an error: resuming before its cause is mended meets it again
            rank_zero_info(
                f"training stopped on an error ({cause}, below); the training state at step "
                f"{trainer.global_step} is saved to {path}: once the cause is mended, resume "
                f"with {self._resume_flags()}"
            )

    def _kept_after_write_error(self, trainer: L.Trainer, path: Path, save: bool) -> str:
        """What ``last.ckpt`` (``path``) holds after a refused write, read from the disk, and
        how to go on; with ``save``, the training state is saved there first if it can be."""
        saved = False
        if save:
            try:
                self._save(trainer, path)
                saved = True
            except WriteError:
                pass  # still refused: the previous file is as it was
        resume = self._resume_flags()
        step = recorded_step(path)
        if step is None:
            return (
                f"No training state was kept ({path} holds none); free space and start the "
                "run again"
            )
        if saved:
            return (
                f"The training state at step {step} was saved to {path} after it; free space "
                f"and resume with {resume}"
            )
        return f"{path} still holds step {step}; free space and resume with {resume}"


def state_in_folder(state: dict[str, Any], dirpath: str) -> dict[str, Any]:
    """``ModelCheckpoint``'s state with the files it records moved to ``dirpath`` (by name),
    where it recorded another folder and each of its ranked files is in ``dirpath``; ``state``
    as it is otherwise (the same folder, or a file missing: Lightning then keeps the best
    path alone, and says so)."""
    recorded = state.get("dirpath")
    if not recorded or os.path.realpath(recorded) == os.path.realpath(dirpath):
        return state
    folder = Path(dirpath)
    ranked = [*state.get("best_k_models", {}), state.get("best_model_path")]
    if not all((folder / Path(path).name).is_file() for path in ranked if path):
        return state

    def moved(path: str | None) -> str | None:
        return str(folder / Path(path).name) if path else path

    return state | {
        "dirpath": dirpath,
        "best_model_path": moved(state.get("best_model_path")),
        "kth_best_model_path": moved(state.get("kth_best_model_path")),
        "last_model_path": moved(state.get("last_model_path")),
        "best_k_models": {moved(k): v for k, v in state.get("best_k_models", {}).items()},
    }
