"""Output files: checks of an output path before any work (:func:`check_output_file`), atomic
writes (:func:`atomic_write`), and the error of a write the machine refused (:class:`WriteError`).

Both read an output path as a shell redirection would:

- A *descriptor path* names an open file descriptor of this process (``/dev/stdout``,
  ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``), read as written, before links are
  followed. It must be open for writing, whatever it is open on (a terminal, a pipe, a file the
  shell redirected to), and is written through that descriptor itself (a duplicate of it),
  never replaced nor reopened by name: when the shell redirected it to a file, the output
  continues at the file's current offset, after what was written there before, and what the
  shell or this process writes there afterwards follows it. Python's own
  ``sys.stdout``/``sys.stderr`` are flushed first when they write to that descriptor (so the
  order of the output is kept), and the descriptor stays open.
- A *stream*, a device or a pipe (``/dev/null``, ``>(gzip > out.gz)``), must be writable and is
  written directly. On a descriptor or a stream, what was written before an exception stays
  written.
- A link is written through: the file it points to is replaced, the link stays.
- Any other path is a file, written to a temporary file beside it that is renamed over it at
  the end, so a reader never sees a half-written file and a failed write (an exception,
  Ctrl-C) leaves the previous file as it was. The temporary file's unique name names its writer
  (:mod:`seq2seq.temporaries`: a later run removes it if this one is killed), so no other file
  is ever overwritten; it takes the permissions of the file it replaces, or for a new file
  those a plain ``open`` would give it (hard links to a replaced file keep the old one).
"""

from __future__ import annotations

import difflib
import errno
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from seq2seq.temporaries import temporary_prefix

_FD_PATH = re.compile(r"/(?:dev/fd|proc/(?:self|thread-self|(?P<pid>\d+))/fd)/(?P<fd>\d+)")
_STD_PATHS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_STD_NAMES = {0: "standard input", 1: "standard output", 2: "standard error"}


class WriteError(OSError):
    """A file or folder of ours that the machine refused to write (a full disk, a quota, a
    read-only file system, a permission, an I/O error), with what was kept.

    Raised by our writers (:func:`atomic_write` and the writers built on it, the tokenised
    cache, ``seq2seq export``'s folder) in place of the machine's ``OSError``, whose error
    number it keeps (``ENOSPC``, ``EDQUOT``, ``EROFS``, ``EACCES``, ``EIO``, ``EFBIG``, ...).
    ``str()`` is the one line the command line prints after ``seq2seq: error:``::

        cannot write run/epoch01-step20.ckpt: No space left on device (errno 28, ENOSPC).
        run/last.ckpt still holds step 10; free space and resume with --ckpt_path last

    Args:
        path: the file (or folder) that could not be written; for a stream, its name
            (``standard output``).
        number: the error number (``errno``), or ``None`` where the machine gave none.
        strerror: the error number's meaning (``os.strerror(number)`` when ``None``).
        kept: a sentence of what was kept (the previous file, its step, ...). It may be
            replaced after the failure (:attr:`kept`), by whoever learns what the disk holds
            then (e.g. ``LastCheckpoint`` after its own save on the stop).
    """

    def __init__(
        self, path: str | Path, number: int | None, strerror: str | None, kept: str
    ) -> None:
        if strerror is None:
            strerror = os.strerror(number) if number is not None else "write failed"
        super().__init__(number, strerror)
        self.path = str(path)
        self.kept = kept

    def __str__(self) -> str:
        code = ""
        if self.errno is not None:
            name = errno.errorcode.get(self.errno)
            code = f" (errno {self.errno}{', ' + name if name else ''})"
        return f"cannot write {self.path}: {self.strerror}{code}. {self.kept}"

    def __reduce__(self):  # picklable (between DDP processes) despite the other signature
        return (type(self), (self.path, self.errno, self.strerror, self.kept))


class _WritePermissionError(WriteError, PermissionError):
    """A :class:`WriteError` of ``EACCES``/``EPERM``: still caught as a ``PermissionError``."""


#: Error numbers of a write that the machine refused: a full disk, a quota, a file too large
#: for the file system or a limit, a read-only file system, a permission, an I/O error.
DISK_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)


def disk_error(err: BaseException) -> OSError | None:
    """The ``OSError`` of the machine (one of :data:`DISK_ERRNOS`) behind ``err``, else
    ``None``.

    ``err`` itself when it is such an ``OSError``; for a ``RuntimeError``, the ``OSError`` it
    was raised while handling (its ``__cause__``/``__context__`` chain). ``torch.save``'s zip
    writer reports a full disk so: the file object's ``write`` raises ``OSError(ENOSPC)``, and
    closing the archive then raises ``RuntimeError: [enforce fail at inline_container.cc]
    unexpected pos``. A ``RuntimeError`` without an ``OSError`` behind it is no disk error.
    """
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):
            if isinstance(cause, WriteError) or cause.errno in DISK_ERRNOS:
                return cause
            return None
        if not isinstance(cause, RuntimeError):
            return None
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def write_error(err: OSError, path: str | Path, kept: str) -> OSError:
    """``err``, an ``OSError`` of writing ``path``, as the error to raise.

    One of :data:`DISK_ERRNOS` becomes a :class:`WriteError` saying ``kept`` (one of
    ``EACCES``/``EPERM`` is a ``PermissionError`` too); a :class:`WriteError` is returned as
    it is. Any other (``path`` is a folder, a folder missing, ...) stays an ``OSError`` of its
    kind (``IsADirectoryError``, ...), its message naming ``path``.
    """
    if isinstance(err, WriteError):
        return err
    strerror = err.strerror or (None if err.errno is not None else str(err) or None)
    if err.errno not in DISK_ERRNOS:
        if err.errno is None:
            return err
        return OSError(err.errno, f"cannot write {path}: {strerror}")
    kind = _WritePermissionError if isinstance(err, PermissionError) else WriteError
    return kind(path, err.errno, strerror, kept)


def kept_sentence(path: str | Path) -> str:
    """What a failed atomic write of ``path`` keeps: the previous file, or that nothing
    partial was written."""
    if Path(path).is_file():
        return f"The previous {path} is unchanged."
    return "Nothing partial was written."


def _descriptor(path: Path) -> int | None:
    """The file descriptor of this process that ``path`` names as written (links are not
    followed): ``/dev/stdout`` 1, ``/dev/stderr`` 2, ``/dev/stdin`` 0, ``/dev/fd/N`` and
    ``/proc/self/fd/N`` N; ``None`` for any other path (and off POSIX systems)."""
    if os.name != "posix":
        return None
    name = "/" + os.path.abspath(path).lstrip("/")  # as the kernel reads "//dev/stdout" too
    if name in _STD_PATHS:
        return _STD_PATHS[name]
    match = _FD_PATH.fullmatch(name)
    if match is None or (match["pid"] is not None and int(match["pid"]) != os.getpid()):
        return None
    return int(match["fd"])


def _describe_fd(fd: int) -> str:
    """``file descriptor 1 (standard output)``, or ``file descriptor 7``."""
    return f"file descriptor {fd}" + (f" ({_STD_NAMES[fd]})" if fd in _STD_NAMES else "")


def _check_descriptor(path: Path, fd: int, setting: str) -> None:
    """Refuse a descriptor path (:func:`_descriptor`) whose descriptor is closed or not open
    for writing."""
    import fcntl

    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError as err:
        raise FileNotFoundError(
            f"{setting} {path}: {_describe_fd(fd)} is not open in this process"
        ) from err
    if flags & os.O_ACCMODE not in (os.O_WRONLY, os.O_RDWR):
        raise PermissionError(f"{setting} {path}: {_describe_fd(fd)} is not open for writing")


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

    Each kind of path is checked as :mod:`seq2seq.files` describes. For a file, a trial file is
    created in the folder that would hold the output (with ``make_parents``, its nearest
    existing ancestor) and removed at once: that catches read-only folders and file systems
    that take no new files (``/proc``), which permission bits do not show.

    Args:
        path: the file to be written.
        setting: the option or argument that gave ``path`` (e.g. ``--output``), named in the
            error.
        make_parents: whether missing parent folders will be created (then the nearest
            existing one must take new files); otherwise the parent folder must exist.

    Raises:
        IsADirectoryError: if ``path`` is a folder.
        FileNotFoundError: if ``path`` names a descriptor that is not open (``/dev/fd/9``
            with no descriptor 9), or the parent folder is missing without ``make_parents``.
        NotADirectoryError: if the parent (or nearest existing ancestor) is not a folder.
        PermissionError: if a descriptor is not open for writing, a stream is not writable,
            or the folder takes no new file (any other ``OSError`` of the trial file too).
    """
    path = Path(path)
    fd = _descriptor(path)
    if fd is not None:
        _check_descriptor(path, fd, setting)
        return
    if path.is_dir():
        raise IsADirectoryError(f"{setting} {path} is a folder; give a file name")
    if _is_stream(path):
        if not os.access(path, os.W_OK):
            raise PermissionError(f"{setting} {path} is not writable")
        return
    path = _through_links(path)  # the file is written in the link target's folder
    folder = path.parent
    if make_parents:
        # The folders to be created do not exist yet: the nearest existing one must take them.
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    if not folder.exists():
        raise FileNotFoundError(f"{setting} {path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"{setting} {path}: {folder} is not a folder")
    try:
        fd, trial = tempfile.mkstemp(dir=folder, prefix=temporary_prefix(path.name), suffix=".tmp")
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
    kept: str | None = None,
) -> Iterator[IO[Any]]:
    """Open a new temporary file beside ``path`` for writing; rename it to ``path`` when the
    ``with`` block ends without an exception.

    Descriptor paths, streams and links are written as :mod:`seq2seq.files` describes (for a
    descriptor, the data is flushed when the block ends). Missing parent folders are created.

    Args:
        path: the file to write.
        mode: ``"w"`` (text) or ``"wb"`` (bytes).
        encoding, newline: as for :func:`open` (text mode).
        fsync: flush the data to disk before the rename, and the rename after it (for a
            descriptor, best effort: pipes and terminals cannot be).
        kept: the sentence of what a failed write kept, for its :class:`WriteError`; by
            default :func:`kept_sentence` of ``path`` (taken before anything is written).

    Yields:
        The open temporary file (or the descriptor, device or pipe).

    Raises:
        WriteError: naming ``path`` and ``kept``, if the machine refuses to write the file, in
            the ``with`` block too (also a ``RuntimeError`` over such an error: :func:`disk_error`).
        OSError: of its kind (``IsADirectoryError`` for a folder, ...), naming ``path``, for
            other errors of writing or renaming; a broken pipe on a stream stays a
            ``BrokenPipeError``.
    """
    path = Path(path)
    fd = _descriptor(path)
    if fd is not None:
        _flush_python_streams(fd)
        with stream_errors(f"{path} ({_STD_NAMES[fd]})" if fd in _STD_NAMES else str(path)):
            copy = os.dup(fd)  # closing it leaves ``fd`` open; both share the file offset
            try:
                f = os.fdopen(copy, mode, encoding=encoding, newline=newline)
            except BaseException:
                os.close(copy)
                raise
            with f:
                yield f
                f.flush()
                if fsync:
                    try:
                        os.fsync(copy)
                    except OSError:
                        pass  # a pipe or a terminal
        return
    if _is_stream(path):
        with stream_errors(str(path)), open(path, mode, encoding=encoding, newline=newline) as f:
            yield f
        return
    path = _through_links(path)
    if kept is None:
        kept = kept_sentence(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=path.parent, prefix=temporary_prefix(path.name), suffix=".tmp"
        )
    except OSError as err:
        raise write_error(err, path, kept) from err
    try:
        try:
            with os.fdopen(fd, mode, encoding=encoding, newline=newline) as f:
                yield f
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.chmod(tmp, _new_mode(path))  # not mkstemp's private 0o600
            os.replace(tmp, path)
        except (OSError, RuntimeError) as err:  # RuntimeError: torch.save's full disk
            cause = disk_error(err) or (err if isinstance(err, OSError) else None)
            if cause is None:
                raise
            raise write_error(cause, path, kept) from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(path.parent)


class Terminated(SystemExit):
    """A SIGTERM, raised where a command is (the console script's handler for the commands
    that run without Lightning), so that what it was writing is cleaned up as after a Ctrl-C:
    :func:`atomic_write` removes its temporary file. Exit status 143."""


@contextmanager
def stream_errors(name: str) -> Iterator[None]:
    """An ``OSError`` of writing to a stream (a descriptor, device or pipe, e.g. standard
    output redirected to a full disk) named ``name`` in the ``with`` block, as a
    :class:`WriteError`; a broken pipe (the reader went away, ``| head``) stays as it is."""
    try:
        yield
    except OSError as err:
        if isinstance(err, BrokenPipeError | WriteError) or err.errno not in DISK_ERRNOS:
            raise
        raise write_error(
            err,
            name,
            "What was written before the failure stays written: the output is incomplete.",
        ) from err


def _flush_python_streams(fd: int) -> None:
    """Flush ``sys.stdout``, ``sys.stderr`` (and the original ones, if replaced) where they
    write to descriptor ``fd``, so that what they hold comes before what is written to it."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None and stream.fileno() == fd:
                stream.flush()
        except (AttributeError, OSError, ValueError):  # no descriptor (captured), or closed
            pass


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


def folders_alike(folder: Path) -> list[str]:
    """The folders spelt like ``folder`` (case aside) where it does not exist: the first missing
    part of its path replaced by a folder beside it of a close spelling (a mistyped path)."""
    if folder.exists():
        return []
    parent = next((p for p in folder.parents if p.is_dir()), None)
    missing = folder.relative_to(parent).parts[0] if parent is not None else ""
    try:
        beside = [p.name for p in parent.iterdir() if p.is_dir()] if missing else []
    except OSError:  # an unreadable parent: no hint
        beside = []
    lowered = {name.lower(): name for name in beside}
    close = difflib.get_close_matches(missing.lower(), list(lowered), n=3, cutoff=0.8)
    return [str(parent / lowered[name] / folder.relative_to(parent / missing)) for name in close]


def new_folder_hint(folder: Path) -> str:
    """``" (a new folder; did you mean /data/multi30k?)"`` for a ``folder`` that does not exist,
    naming the folders beside it spelt alike (:func:`folders_alike`); ``""`` for one that
    exists."""
    if folder.exists():
        return ""
    alike = folders_alike(folder)
    return f" (a new folder; did you mean {' or '.join(alike)}?)" if alike else " (a new folder)"


def local_folder(folder: str | Path | None) -> str | None:
    """``folder`` as an absolute path with links resolved, or None for None and for a remote
    location (``s3://...``)."""
    if folder is None or "://" in str(folder):
        return None
    return os.path.realpath(folder)
