"""Output files: checks of an output path before any work, and atomic writes."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _is_stream(path: Path) -> bool:
    """Whether ``path`` (through links) is an existing file that is not a regular file or a
    folder: a terminal, ``/dev/stdout`` or ``/dev/null``, a pipe (``>(gzip > out.gz)``)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_output_file(path: str | Path, setting: str, make_parents: bool = True) -> None:
    """Refuse an output file that could not be written, before any work is done for it.

    A device or a pipe (``/dev/stdout``, ``>(gzip > out.gz)``) must be writable. Otherwise a
    file is created in the folder that would hold the output (with ``make_parents``, its
    nearest existing ancestor) and removed at once: that catches read-only folders and file
    systems that take no new files (``/proc``), which permission bits do not show.

    Args:
        path: the file to be written (a link is followed).
        setting: the option or argument that gave ``path`` (e.g. ``--output``), named in the
            error.
        make_parents: whether missing parent folders will be created (then the nearest
            existing one must take new files); otherwise the parent folder must exist.

    Raises:
        IsADirectoryError: if ``path`` is a folder.
        FileNotFoundError: if the parent folder is missing and ``make_parents`` is false.
        NotADirectoryError: if the parent (or, with ``make_parents``, the nearest existing
            ancestor) is not a folder.
        PermissionError: if a device or pipe is not writable, or the folder takes no new file
            (any other ``OSError`` of the trial file is raised as one too).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{setting} {path} is a folder; give a file name")
    if _is_stream(path):
        if not os.access(path, os.W_OK):
            raise PermissionError(f"{setting} {path} is not writable")
        return
    path = _through_links(path)
    folder = path.parent
    if make_parents:
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    if not folder.exists():
        raise FileNotFoundError(f"{setting} {path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"{setting} {path}: {folder} is not a folder")
    try:
        fd, trial = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise PermissionError(
            f"{setting} {path}: no file can be written in folder {folder} ({err.strerror or err})"
        ) from err
    os.close(fd)
    os.unlink(trial)


def _through_links(path: Path) -> Path:
    """The file a link points to (an output written "through" the link), else ``path``."""
    return path.resolve() if path.is_symlink() else path


@contextmanager
def atomic_write(
    path: str | Path,
    mode: str = "w",
    encoding: str | None = None,
    newline: str | None = None,
    fsync: bool = False,
) -> Iterator[IO[Any]]:
    """Open a new temporary file beside ``path`` for writing; rename it to ``path`` when the
    ``with`` block ends without an exception.

    A reader therefore never sees a half-written file, and a write that fails (an exception,
    Ctrl-C) leaves the previous file at ``path`` as it was and removes the temporary file. The
    temporary file has a unique name (``.<name>.<random>.tmp``), so no other file is ever
    overwritten; it takes the permissions of the file it replaces, or for a new file those a
    plain ``open`` would give it (hard links to a replaced file keep the old one). Missing parent
    folders are created. A link is written through (the file it points to is replaced, the
    link stays); a device or a pipe (``/dev/stdout``, ``>(gzip > out.gz)``) is written
    directly, as a shell redirection would.

    Args:
        path: the file to write.
        mode: ``"w"`` (text) or ``"wb"`` (bytes).
        encoding: text encoding (text mode).
        newline: as for :func:`open` (text mode).
        fsync: flush the data to disk before the rename, and the rename after it.

    Yields:
        The open temporary file (or the device or pipe).

    Raises:
        OSError: if the file cannot be written or renamed (e.g. ``path`` is a folder); a
            failed rename names ``path``.
    """
    path = Path(path)
    if _is_stream(path):
        with open(path, mode, encoding=encoding, newline=newline) as f:
            yield f
        return
    path = _through_links(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=encoding, newline=newline) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, _new_mode(path))
        try:
            os.replace(tmp, path)
        except OSError as err:
            raise OSError(err.errno, f"could not write {path}: {err.strerror or err}") from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(path.parent)


def _new_mode(path: Path) -> int:
    """Permission bits for the file that replaces ``path``: those of the existing file, else
    ``0o666`` less the umask, as ``open`` creates a file (``mkstemp`` makes it ``0o600``)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_dir(directory: Path) -> None:
    """Makes a rename in ``directory`` durable (best effort; not all systems allow it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
