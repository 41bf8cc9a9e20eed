"""Temporary files and folders that name their owner, and the removal of those a killed run
left behind.

Every temporary of ours sits beside its target as ``.<target>.<host>-<pid>-<start>.<random>``
(plus ``.tmp``, ``.part`` or ``.old`` for some kinds): the host name, the process id and the
process's start time (clock ticks since boot from ``/proc``, 0 where there is none), so that a
later run can tell a temporary whose writer is gone from one another process is still
writing. Temporaries named before owners were recorded (``.<target>.<random>``) carry no owner
and are judged by their age alone.

The host name stands for the process table: containers that share one host name but not their
processes should not share a cache folder, as each would take the other's writers for gone.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import time
from functools import cache
from pathlib import Path

#: Seconds after its last change when a temporary whose owner cannot be checked (another
#: host, or a name without an owner) counts as abandoned: 24 hours.
ABANDONED_AGE = 24 * 60 * 60

# The random part of tempfile's names (8 characters of this alphabet); ours are alike, so
# one pattern recognises both.
_RANDOM_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_RANDOM = rf"[{_RANDOM_CHARS}]{{8}}"
_OWNER = r"(?P<host>[^.]+)-(?P<pid>\d+)-(?P<start>\d+)"


def _host() -> str:
    """This machine's name as it appears in temporaries: characters other than letters,
    digits and ``-`` (a dot of a domain name) become ``_``."""
    return re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname()) or "host"


def _process(pid: int) -> tuple[str, int] | None:
    """``(state, start)`` of process ``pid`` from ``/proc/<pid>/stat``: its state letter
    (``Z`` for a zombie) and its start time in clock ticks since boot; ``None`` where it
    cannot be read (no ``/proc``, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces; fields from 3 follow.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime)
    except (IndexError, ValueError):
        return None


@cache
def _owner(pid: int) -> str:
    process = _process(pid)
    return f"{_host()}-{pid}-{process[1] if process else 0}"


def owner_tag() -> str:
    """``<host>-<pid>-<start>`` of this process (start 0 where ``/proc`` is missing); a forked
    process (a DataLoader worker) gets its own."""
    return _owner(os.getpid())


def temporary_prefix(target: str) -> str:
    """The prefix of a temporary for the file or folder named ``target``:
    ``.<target>.<host>-<pid>-<start>.``, to which ``tempfile`` adds its random part (and the
    suffix it is given)."""
    return f".{target}.{owner_tag()}."


def make_temporary_folder(parent: str | Path, target: str) -> Path:
    """Creates a new, empty temporary folder for ``target`` in ``parent``, named as the module
    describes (no suffix).

    Unlike ``tempfile.mkdtemp`` (always ``0o700``), the folder gets the mode the umask gives
    any new folder (``0o777`` less the umask, by the kernel, so no umask is read and threads
    do not race), so a cache shared by a group stays readable for it once renamed into place.

    Raises:
        OSError: if the folder cannot be created.
    """
    parent = Path(parent)
    prefix = temporary_prefix(target)
    for _ in range(100):
        path = parent / (prefix + "".join(secrets.choice(_RANDOM_CHARS) for _ in range(8)))
        try:
            os.mkdir(path, 0o777)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no new temporary folder name for {parent / target} after 100 tries")


def _name_pattern(target: str, suffix: str) -> re.Pattern[str]:
    """Temporaries of targets matching the glob ``target`` (``*`` and ``?``) with ``suffix``:
    the owner is optional (names without one)."""
    glob = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in target)
    return re.compile(rf"\.{glob}\.(?:{_OWNER}\.)?{_RANDOM}{re.escape(suffix)}")


def _alive(pid: int, start: int) -> bool:
    """Whether process ``pid`` of this host, started at ``start`` (0: unknown), still runs.
    Where it cannot be told, it counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # PermissionError: a process of another user
    process = _process(pid)
    if process is None:
        return True
    state, started = process
    if state in ("Z", "X"):  # exited, not yet reaped: it writes nothing more
        return False
    return not start or started == start  # another start: the id was reused


def _last_change(path: Path) -> float:
    """The latest modification time of ``path`` and, for a folder, of everything in it."""
    latest = os.lstat(path).st_mtime
    if path.is_dir() and not path.is_symlink():
        for root, folders, files in os.walk(path):
            for name in folders + files:
                try:
                    latest = max(latest, os.lstat(os.path.join(root, name)).st_mtime)
                except OSError:
                    pass
    return latest


def abandoned(path: str | Path, max_age: float = ABANDONED_AGE, now: float | None = None) -> str:
    """Why the temporary ``path`` is abandoned, or ``""`` if it may still be in use.

    A temporary whose owner ran on this host is abandoned when that process is gone (or its
    id now belongs to a process started later), never while it runs; one whose owner ran on
    another host, or whose name records no owner, when neither it nor anything in it changed
    for ``max_age`` seconds.

    Args:
        path: a temporary named by :func:`temporary_prefix` or an older one without owner.
        max_age: seconds without change after which an unverifiable temporary is abandoned.
        now: the current time (``time.time()``), for tests.

    Returns:
        ``"its owner, process N, is gone"``, ``"unchanged for more than 24 h"``, or ``""``.
    """
    path = Path(path)
    match = re.search(rf"\.{_OWNER}\.{_RANDOM}(?:\.[a-z]+)?$", path.name)
    if match is not None and match["host"] == _host():
        pid = int(match["pid"])
        if _alive(pid, int(match["start"])):
            return ""
        return f"its owner, process {pid}, is gone"
    try:
        age = (time.time() if now is None else now) - _last_change(path)
    except OSError:
        return ""  # removed meanwhile
    if age > max_age:
        return f"unchanged for more than {max_age / 3600:g} h"
    return ""


def remove_abandoned(
    folder: str | Path, target: str = "*", suffix: str = "", max_age: float = ABANDONED_AGE
) -> list[Path]:
    """Removes the abandoned temporaries (see :func:`abandoned`) of ``target`` in ``folder``,
    logging one line for each (its path and why it counts as abandoned).

    A temporary that cannot be removed (another user's) is warned about and left; the run goes
    on.

    Args:
        folder: the folder that holds the targets (nothing happens if it does not exist).
        target: the name of the file or folder the temporaries were written for, or a glob of
            such names (``*`` any characters, ``?`` one), e.g. ``"*.ckpt"``.
        suffix: what the temporaries' names end with after the random part (``".tmp"`` for
            :func:`seq2seq.files.atomic_write`, ``".part"`` for downloads, ``""`` for
            folders).
        max_age: see :func:`abandoned`; default :data:`ABANDONED_AGE`.

    Returns:
        The temporaries removed.
    """
    pattern = _name_pattern(target, suffix)
    try:
        names = sorted(os.listdir(folder))
    except OSError:  # missing, or not a folder: nothing to clean
        return []
    removed = []
    for name in names:
        if not pattern.fullmatch(name):
            continue
        path = Path(folder) / name
        reason = abandoned(path, max_age)
        if not reason:
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue  # another run removed it first
        except OSError as err:
            _report(
                f"Could not remove the abandoned temporary {path} ({reason}): "
                f"{err.strerror or err}; it is left there.",
                warn=True,
            )
            continue
        _report(f"Removed the abandoned temporary {path} ({reason}).")
        removed.append(path)
    return removed


def _report(message: str, warn: bool = False) -> None:
    """An info line (or a warning) as the other messages of a run are given: through
    Lightning's rank-zero logger, imported only when there is something to say (a run that
    finds nothing to remove does not load Lightning for it)."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

    (rank_zero_warn if warn else rank_zero_info)(message)
