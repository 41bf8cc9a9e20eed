"""Output-path checks and atomic writes (``seq2seq.files``)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import refuse_new_files

from seq2seq.files import atomic_write, check_output_file

REPO = Path(__file__).resolve().parents[1]
needs_proc_fd = pytest.mark.skipif(
    not os.path.isdir("/proc/self/fd"), reason="needs Linux /dev/fd and /proc/self/fd"
)


def test_check_output_file_names_the_setting_and_the_fault(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("a file\n")
    (tmp_path / "locked").mkdir()
    refuse_new_files(monkeypatch, "locked")  # as a read-only folder (chmod does not stop root)
    check_output_file("out.txt", "--output")
    check_output_file("new/sub/out.txt", "--output")  # the folders will be made
    cases = [
        ("folder", {}, IsADirectoryError, "--output folder is a folder; give a file name"),
        ("new/out.txt", {"make_parents": False}, FileNotFoundError, "folder new does not exist"),
        ("afile/out.txt", {}, NotADirectoryError, "--output afile/out.txt: afile is not a folder"),
        ("locked/out.txt", {}, PermissionError, "no file can be written in folder locked"),
        ("locked/new/out.txt", {}, PermissionError, "no file can be written in folder locked"),
    ]
    for path, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            check_output_file(path, "--output", **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "folder", "locked"]


@pytest.mark.parametrize("fsync", [False, True])
def test_atomic_write_replaces_the_file_whole_or_not_at_all(tmp_path, fsync):
    path = tmp_path / "sub" / "out.bin"
    with atomic_write(path, "wb", fsync=fsync) as f:
        f.write(b"first")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # as open() makes it
    with pytest.raises(KeyboardInterrupt), atomic_write(path, "wb", fsync=fsync) as f:
        f.write(b"half")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"first"
    assert [p.name for p in path.parent.iterdir()] == ["out.bin"]
    path.chmod(0o640)  # a replaced file keeps its permissions
    with atomic_write(path, "wb", fsync=fsync) as f:
        f.write(b"second")
    assert path.read_bytes() == b"second" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_pipe_is_written_directly_and_a_link_through(tmp_path):
    """A pipe (as /dev/stdout or a shell's >(gzip > x.gz) can be) is written as a shell
    redirection would, not replaced by a regular file; a link stays a link to the new file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    check_output_file(fifo, "--output")
    received = []
    import threading

    # A daemon thread: a writer that replaced the pipe would leave it waiting forever.
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    with atomic_write(fifo, "wb") as f:
        f.write(b"through the pipe\n")
    reader.join(timeout=10)
    assert received == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)

    target = tmp_path / "target.txt"
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    check_output_file(link, "--output")
    with atomic_write(link, "w") as f:
        f.write("new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.txt", "target.txt"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_a_folder_that_takes_no_new_files_is_refused_up_front():
    """/proc looks writable to root by its permission bits but takes no new file: the trial
    file finds that before any work."""
    with pytest.raises(PermissionError, match="--output /proc/out.txt: no file can be written"):
        check_output_file("/proc/out.txt", "--output")


@needs_proc_fd
def test_an_open_descriptor_is_written_through_not_replaced(tmp_path):
    """/dev/fd/N and /proc/self/fd/N name a descriptor of this process, which may be a shell's
    redirection to a regular file: it is written through, at the offset it shares, as the shell
    would, not replaced by a new file (that would lose what came before and after); a closed
    descriptor or one open only for reading is refused in one line."""
    path = tmp_path / "log.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"before\n")
        for name, mode, text in (
            (f"/dev/fd/{fd}", "w", "text\n"),
            (f"/proc/self/fd/{fd}", "wb", b"bytes\n"),
        ):
            check_output_file(name, "--output")
            with atomic_write(name, mode, fsync=True) as f:
                f.write(text)
        os.write(fd, b"after\n")  # fd is still open, and writes on after the output
    finally:
        os.close(fd)
    assert path.read_text() == "before\ntext\nbytes\nafter\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt"]

    read_only = os.open(path, os.O_RDONLY)
    closed = os.dup(read_only)
    os.close(closed)
    try:
        for name, error, message in (
            (
                f"/dev/fd/{read_only}",
                PermissionError,
                f"descriptor {read_only} is not open for writing",
            ),
            (
                f"/proc/self/fd/{closed}",
                FileNotFoundError,
                f"descriptor {closed} is not open in this process",
            ),
        ):
            with pytest.raises(error) as info:
                check_output_file(name, "--output")
            assert str(info.value) == f"--output {name}: file {message}"
    finally:
        os.close(read_only)
    assert path.read_text() == "before\ntext\nbytes\nafter\n"


@needs_proc_fd
def test_dev_stdout_redirected_to_a_file_gives_what_a_redirection_gives(tmp_path):
    """``(echo before; seq2seq translate --output /dev/stdout; echo after) > log``: the log holds
    all of it in order, with what Python had buffered in sys.stdout before the output."""
    code = (
        "from seq2seq.files import atomic_write, check_output_file\n"
        "print('python before')\n"
        "check_output_file('/dev/stdout', '--output')\n"
        "with atomic_write('/dev/stdout', 'w', encoding='utf-8') as f:\n"
        "    f.write('translations\\n')\n"
        "print('python after')\n"
    )
    log = tmp_path / "log.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    with open(log, "w") as out:
        out.write("shell before\n")
        out.flush()
        subprocess.run([sys.executable, "-c", code], stdout=out, env=env, check=True, timeout=60)
        out.write("shell after\n")
    assert log.read_text() == (
        "shell before\npython before\ntranslations\npython after\nshell after\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt"]
