"""Training-side checkpoint code: atomic checkpoint writing for Lightning, and the random
generator and loop states that make a resumed run continue the interrupted one exactly."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from seq2seq.checkpoint.load import load_checkpoint
from seq2seq.files import WriteError, atomic_write

__all__ = [
    "AtomicCheckpointIO",
    "capture_rng_state",
    "keep_cut_epoch_unfinished",
    "recorded_step",
    "restore_rng_state",
    "run_validation_again",
    "settle_validation_progress",
    "validation_cut_short",
]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file beside its destination, then renames it.

    The file under the final name is therefore always a complete checkpoint: a process killed
    while saving, or a full disk, leaves the previous file (e.g. ``last.ckpt``) untouched, and
    the temporary file is removed when the write fails with an exception. The data are
    flushed to disk (``fsync``) before the rename. Lightning's default writer stages the file
    in the system temporary folder instead, which is only atomic when that folder is on the
    same file system as the checkpoints. Paths with a URL scheme (``s3://`` ...) are left to
    Lightning's writer.

    ``seq2seq fit`` installs it in place of Lightning's default ``TorchCheckpointIO``.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        """Saves ``checkpoint`` to ``path`` atomically.

        Raises:
            WriteError: (an ``OSError``, keeping the error number) if the file cannot be
                written (e.g. ``ENOSPC``; torch's zip writer then raises a ``RuntimeError``
                while handling the file's ``OSError``, taken as that ``OSError``, see
                :func:`seq2seq.files.disk_error`), naming the path; the previous file at
                ``path`` is unchanged and no partial file is left.
        """
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        try:
            with atomic_write(path, "wb", fsync=True) as f:
                torch.save(checkpoint, f)
        except WriteError as err:
            step = recorded_step(path)
            if step is not None:
                err.kept = f"The previous {path} (step {step}) is unchanged."
            raise


def recorded_step(path: str | Path) -> int | None:
    """The global step recorded in the checkpoint at ``path``, or ``None`` where no readable
    checkpoint is there (the tensors are mapped, not read)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return int(load_checkpoint(path, mmap=True)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def capture_rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and PyTorch's (CPU and current CUDA device) generators.

    Returned as tensors and plain values only, so a checkpoint holding it still loads with
    ``torch.load(weights_only=True)``. :func:`restore_rng_state` sets them back.
    """
    version, keys, gauss = random.getstate()
    algorithm, np_keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "keys": list(keys), "gauss": gauss},
        "numpy": {
            "algorithm": algorithm,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Sets the random generators to a state captured by :func:`capture_rng_state`."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["keys"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (
            npy["algorithm"],
            npy["keys"].numpy().astype(np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def keep_cut_epoch_unfinished(checkpoint: dict[str, Any], epoch: int) -> None:
    """Record training epoch ``epoch``, which a stop ended before its last batch, as unfinished
    in ``checkpoint``, so resuming trains the rest of it.

    When ``max_time``, ``max_steps`` or early stopping ends training before an epoch's last
    batch, Lightning still runs the epoch-end steps and counts the epoch processed, then
    completed; a checkpoint written then (``ModelCheckpoint(save_last=True)`` saves at the end
    of a training epoch when it validates once per epoch, and at the end of training) would make
    a resumed run start the next epoch and skip the untrained batches. This writes the epoch
    progress of an uninterrupted run in the middle of ``epoch`` (the state Lightning restarts
    mid-epoch from), and the epoch of the data module's saved position (``"train_sampler"`` or
    ``"train_stream"``, see :class:`seq2seq.data.TranslationDataModule`), so the resumed epoch
    continues after the batches trained.

    Args:
        checkpoint: the dictionary Lightning is about to write (edited in place).
        epoch: 0-based index of the cut epoch.
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    if not fit_loop:
        return
    for progress in fit_loop["epoch_progress"].values():  # "total" and "current"
        progress.update(ready=epoch + 1, started=epoch + 1, processed=epoch, completed=epoch)
    checkpoint["epoch"] = epoch
    for state in checkpoint.values():
        if isinstance(state, dict):
            for key in ("train_sampler", "train_stream"):
                if isinstance(state.get(key), dict) and "epoch" in state[key]:
                    state[key]["epoch"] = epoch


def run_validation_again(checkpoint: dict[str, Any]) -> None:
    """Record the validation of ``fit`` under way in ``checkpoint`` so that a resumed run runs
    it again from its first batch.

    Lightning re-runs an interrupted validation only when the stop came inside a batch's
    ``validation_step``; stopped elsewhere (between batches, as SIGTERM does, or while the
    corpus scores are computed) the resumed run skips it, and that step's score, scored
    checkpoint and early-stopping count are lost. This writes the validation's progress as
    that case: one batch begun and none processed.

    Args:
        checkpoint: the dictionary Lightning is about to write (edited in place).
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    progress = fit_loop.get("epoch_loop.val_loop.batch_progress") if fit_loop else None
    if not progress:
        return
    before = progress["total"]["ready"] - progress["current"]["ready"]  # earlier validations
    for key, done in (("total", before), ("current", 0)):
        progress[key].update(ready=done + 1, started=done + 1, processed=done, completed=done)
    progress["is_last_batch"] = False


def validation_cut_short(checkpoint: dict[str, Any]) -> bool:
    """Whether ``checkpoint`` holds a validation of ``fit`` that a stop cut short (a batch of
    it begun and not completed), which a resumed run runs again."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    progress = fit_loop.get("epoch_loop.val_loop.batch_progress") if fit_loop else None
    if not progress:
        return False
    current = progress["current"]
    return current["started"] > current["completed"] or current["ready"] > current["completed"]


def settle_validation_progress(checkpoint: dict[str, Any]) -> None:
    """Align the all-time counters of ``fit``'s validation batches in ``checkpoint`` with the
    batches completed, unless a validation is under way there (a batch of it begun and not
    completed).

    A validation cut short (inside a batch, or recorded by :func:`run_validation_again`)
    leaves one batch begun and never completed in these counters: Lightning resets only the
    per-validation counters when it runs that validation again, and from any later
    checkpoint written at a validation step would run a validation again on resume, a second
    one at a step already scored.

    Args:
        checkpoint: a checkpoint being written or restored (edited in place).
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    progress = fit_loop.get("epoch_loop.val_loop.batch_progress") if fit_loop else None
    if not progress:
        return
    if validation_cut_short(checkpoint):
        return  # Lightning runs it again on resume
    total = progress["total"]
    for key in ("ready", "started", "processed"):
        total[key] = total["completed"]
