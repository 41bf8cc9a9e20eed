"""A run's folders: writability, the lock of a checkpoint folder, the cleanup of folders a
command created and left empty, the refusal of a new run over an earlier run's
checkpoints, and the saved config of a command that shares a folder with another."""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import filelock
import lightning as L
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from seq2seq.checkpoint import CheckpointError, load_checkpoint, resume_flags
from seq2seq.files import write_error
from seq2seq.temporaries import remove_abandoned


def check_writable(trainer: L.Trainer, checkpoints: bool = True) -> None:
    """Fails before training if a log or (with ``checkpoints``) a checkpoint folder cannot be
    created or written.

    Raises:
        OSError: naming the setting and the folder, with the error number of the failure.
    """
    folders = [(logger.save_dir, "the logger's save_dir") for logger in trainer.loggers]
    folders += [
        (callback.dirpath, "ModelCheckpoint's dirpath")
        for callback in trainer.callbacks
        if checkpoints and isinstance(callback, ModelCheckpoint)
    ]
    folders.append((trainer.default_root_dir, "trainer.default_root_dir"))
    for folder, setting in folders:
        if not folder or "://" in str(folder):
            continue
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            raise OSError(
                err.errno,
                f"cannot write to {folder} ({setting}): {err.strerror or err}; choose a "
                "writable folder before training",
            ) from err


#: The lock file of a checkpoint folder in use by ``seq2seq fit`` (see :class:`FolderLock`),
#: and the side file beside it that names the holder's process id.
LOCK_NAME = ".seq2seq.lock"
PID_NAME = ".seq2seq.lock.pid"


class RunConfig(SaveConfigCallback):
    """Lightning's ``config.yaml`` of a command, not written over that of another command in
    the same folder: a resumed ``fit`` that logs into the folder of the run it resumes writes
    ``config.resumed-step<N>.yaml`` (``N``: the checkpoint's step) beside the run's
    ``config.yaml`` (with a first line saying that optimizer and schedule settings are the
    checkpoint's), and ``validate``/``test`` into a folder that holds one (without a logger,
    ``trainer.default_root_dir``) write ``config.<command>.yaml``; ``-2``, ``-3`` ... after a
    name taken. A new ``fit`` writes ``config.yaml``, as Lightning does; a resume at its
    ``max_steps`` (which trains nothing) writes none."""

    resumed_step: int | None = None
    """The step of the checkpoint a ``fit`` resumes from (set by the command line)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        header = None
        if self.resumed_step is not None and 0 <= trainer.max_steps <= self.resumed_step:
            self.already_saved = True  # nothing is trained; the command says which limit
        if not self.already_saved and self.save_to_log_dir:
            log_dir = trainer.log_dir  # on every rank: it broadcasts
            fs = get_filesystem(log_dir)
            command = trainer.state.fn.value if trainer.state.fn else str(stage)
            if trainer.is_global_zero and fs.isfile(os.path.join(log_dir, self.config_filename)):
                stem = None
                if command != "fit":
                    stem = f"config.{command}"
                elif self.resumed_step is not None:
                    stem = f"config.resumed-step{self.resumed_step}"
                    header = (
                        f"# the settings of fit --ckpt_path, resumed at step {self.resumed_step};"
                        " the run keeps the checkpoint's optimizer and lr_scheduler settings "
                        "where these differ (it warned of them)\n"
                    )
                if stem is not None:  # never over an earlier one: a second resume or test
                    names = (f"{stem}.yaml", *(f"{stem}-{i}.yaml" for i in range(2, 10_000)))
                    self.config_filename = next(
                        n for n in names if not fs.isfile(os.path.join(log_dir, n))
                    )
        super().setup(trainer, pl_module, stage)
        if header and trainer.is_global_zero:
            path = Path(trainer.log_dir, self.config_filename)
            path.write_text(header + path.read_text(encoding="utf-8"), encoding="utf-8")


class FolderLock:
    """An exclusive lock on ``folder`` for one ``seq2seq fit``.

    The lock is ``filelock``'s (``flock`` on :data:`LOCK_NAME` on POSIX), which the operating
    system releases when the process ends, however it ends; the holder's process id goes to
    the side file :data:`PID_NAME` (a lock file's content is ``filelock``'s to manage), for the
    error of a second ``fit``. :meth:`release` removes both files.

    Args:
        folder: the checkpoint folder (existing).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / LOCK_NAME
        self.pid_path = folder / PID_NAME
        self._lock: filelock.FileLock | None = None

    def acquire(self) -> None:
        """Takes the lock, without waiting, and writes this process's id beside it.

        Raises:
            OSError: if another process holds it (naming the folder and that process's id),
                or the lock file cannot be created; a :class:`~seq2seq.files.WriteError` if
                the process id cannot be written beside it.
        """
        lock = filelock.FileLock(str(self.path), timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise self._in_use(self._holder()) from None
        self._lock = lock
        try:
            self.pid_path.write_text(f"{os.getpid()}\n", encoding="ascii")
        except OSError as err:
            self.release()
            raise write_error(
                err, self.pid_path, "Nothing was trained; the folder's checkpoints are untouched."
            ) from err

    def check_free(self) -> None:
        """Checks, without creating the lock file, that no other process holds the lock (a
        later :meth:`acquire` can still find it taken).

        Raises:
            OSError: if another process holds it, as :meth:`acquire` does.
        """
        if not self.path.is_file():
            return
        lock = filelock.FileLock(str(self.path), timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise self._in_use(self._holder()) from None
        except OSError:  # a lock file that cannot be opened: acquire reports on it
            return
        lock.release()

    def _in_use(self, holder: int | None) -> OSError:
        """The error that the lock is held by process ``holder`` (``None``: unknown)."""
        pid = f" (pid {holder})" if holder else ""
        return OSError(
            f"{self.folder} is in use by another seq2seq fit{pid}, which writes its "
            "checkpoints there; wait for it to end, or give this run another folder with "
            "--checkpoint_dir DIR"
        )

    def _holder(self) -> int | None:
        """The process id the holder wrote beside the lock, if any."""
        try:
            return int(self.pid_path.read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        """Removes the lock's files and releases it (nothing if not held)."""
        if self._lock is None:
            return
        lock, self._lock = self._lock, None
        try:
            # Removed while held, so no other process can take the lock between the two.
            for path in (self.pid_path, self.path):
                path.unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            lock.release()


def _run_folders(trainer: L.Trainer) -> list[Path]:
    """The local folders a run of ``trainer`` writes into (absolute, not necessarily existing):
    each ``ModelCheckpoint``'s ``dirpath``, the ``save_dir`` of each logger, for a TensorBoard
    or CSV logger its ``root_dir`` and, once that exists, its ``log_dir`` (which fixes the
    run's version number, as the logger itself would; before, the logger would warn of a
    missing folder), and ``default_root_dir``. Remote paths (``s3://...``) are left out."""
    folders: list = [
        callback.dirpath for callback in trainer.callbacks if isinstance(callback, ModelCheckpoint)
    ]
    for logger in trainer.loggers:
        folders.append(getattr(logger, "save_dir", None))
        if isinstance(logger, (TensorBoardLogger, CSVLogger)):
            folders.append(logger.root_dir)
            if os.path.isdir(logger.root_dir):
                folders.append(logger.log_dir)
    folders.append(trainer.default_root_dir)
    return [
        Path(os.path.realpath(os.path.expanduser(folder)))
        for folder in folders
        if isinstance(folder, (str, os.PathLike)) and str(folder) and "://" not in str(folder)
    ]


def missing_folders(trainer: L.Trainer) -> list[Path]:
    """The folders of :func:`_run_folders` and their parents that do not exist (yet); a path
    that cannot be checked (e.g. no permission) counts as existing. Empty if the folders
    cannot be listed."""
    try:
        folders = _run_folders(trainer)
    except Exception:  # nothing is removed then; the command itself reports any real fault
        return []
    missing = []
    for folder in folders:
        for path in (folder, *folder.parents):
            try:
                os.lstat(path)
                break
            except FileNotFoundError:
                missing.append(path)
            except OSError:
                break
    return list(dict.fromkeys(missing))


def remove_empty_folders(new_folders: list[Path], trainer: L.Trainer) -> None:
    """Removes each of ``new_folders`` (folders that did not exist when the command started)
    that is now an empty folder, deepest first, so that a parent emptied by the removal of its
    children goes too; also the empty folders of :func:`_run_folders` found only now (such as a
    ``ModelCheckpoint`` folder inside the new ``log_dir``) that lie inside one of
    ``new_folders``. A folder holding anything, or that existed before, is left alone; a folder
    that cannot be removed is left as it is, silently."""
    new = set(new_folders)
    try:
        found = [f for f in _run_folders(trainer) if new.intersection(f.parents)]
    except Exception:  # cleaning up after an error must not replace that error
        found = []
    for folder in sorted(set(found) | new, key=lambda p: len(p.parts), reverse=True):
        try:
            if folder.is_dir() and not folder.is_symlink():
                folder.rmdir()  # only ever removes an empty folder
        except OSError:
            pass


def refuse_earlier_checkpoints(
    checkpoint_dirs: Sequence[Path],
    resuming: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
) -> None:
    """Refuses to start a new ``fit`` in a checkpoint folder that already holds checkpoints
    (``*.ckpt`` files): the new run's ``last.ckpt`` would replace the earlier run's, and
    ``--ckpt_path best`` or ``seq2seq average --dir`` would mix the two runs. With
    ``resuming`` (a checkpoint of another folder), the same for a run resumed from it. Called
    before anything is read or written. A folder that does not exist or cannot be listed
    passes (``fit`` reports an unwritable folder later). ``checkpoint_dir`` (the command's
    ``--checkpoint_dir``, if given) is named in the advice to resume.

    A folder in use by another ``seq2seq fit`` is reported as such (see :class:`FolderLock`;
    checked on global rank 0 only).

    Raises:
        OSError: if another ``seq2seq fit`` holds the lock of one of the folders.
        FileExistsError: naming the folder, what it holds (``last.ckpt`` and its step, the
            number of other checkpoints) and the ways out.
    """
    for folder in dict.fromkeys(checkpoint_dirs):
        if rank_zero_only.rank == 0:  # the other processes of a DDP run find rank 0's lock
            FolderLock(Path(os.path.realpath(folder))).check_free()
        try:
            found = sorted(p.name for p in folder.iterdir() if p.suffix == ".ckpt" and p.is_file())
        except OSError:
            continue
        if not found:
            continue
        others = len(found) - ("last.ckpt" in found)
        plural = "s" if others != 1 else ""
        if "last.ckpt" in found:
            try:
                step = load_checkpoint(folder / "last.ckpt", mmap=True).get("global_step")
            except (OSError, CheckpointError):
                step = None
            held = "last.ckpt" + (f" at step {step}" if step is not None else "")
            if others:
                held += f" and {others} other checkpoint{plural}"
            clash = "a new run there would replace its last.ckpt: resume it with " + resume_flags(
                checkpoint_dir
            )
        else:
            names = ", ".join(found[:3]) + (", ..." if others > 3 else "")
            held = f"{others} checkpoint{plural}, {names}, and no last.ckpt"
            clash = (
                "a new run there would mix its checkpoints with them: resume from one with "
                "--ckpt_path FILE"
            )
        if resuming is not None:
            own = Path(resuming).parent
            harm = (
                "replace its last.ckpt" if others < len(found) else "mix its checkpoints with them"
            )
            raise FileExistsError(
                f"{folder} already holds the checkpoints of another run ({held}); the run "
                f"resumed from {resuming} would {harm}: continue it in the checkpoint's own "
                f"folder with --checkpoint_dir {own} or in another one with --checkpoint_dir "
                f"DIR, or remove the .ckpt files from {folder}"
            )
        raise FileExistsError(
            f"{folder} already holds the checkpoints of an earlier run ({held}); {clash}, "
            "give the new run another folder with --checkpoint_dir DIR, or remove the .ckpt "
            f"files from {folder}"
        )


def lock_checkpoint_folders(trainer: L.Trainer) -> list[FolderLock]:
    """Locks the local ``dirpath`` of each ``ModelCheckpoint`` of ``trainer`` for this process
    (held until each lock's :meth:`FolderLock.release` or the process ends), and removes the
    ``.tmp`` temporaries that killed runs left there
    (:func:`seq2seq.temporaries.remove_abandoned`).

    Returns:
        The locks taken.

    Raises:
        OSError: if another ``seq2seq fit`` holds the lock of one of the folders (the locks
            taken before are released).
    """
    folders = [
        Path(callback.dirpath)
        for callback in trainer.checkpoint_callbacks
        if isinstance(callback, ModelCheckpoint)
        and callback.dirpath
        and "://" not in str(callback.dirpath)
    ]
    locks: list[FolderLock] = []
    try:
        for folder in dict.fromkeys(Path(os.path.realpath(f)) for f in folders):
            lock = FolderLock(folder)
            lock.acquire()
            locks.append(lock)
            remove_abandoned(folder, "*", ".tmp")  # checkpoint temporaries of killed runs
            if [p for p in folder.iterdir() if p.name not in (LOCK_NAME, PID_NAME)] == []:
                # Lightning's warning of a non-empty checkpoint folder would be about the lock.
                warnings.filterwarnings(
                    "ignore", message=f"Checkpoint directory {re.escape(str(folder))} exists and"
                )
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks
