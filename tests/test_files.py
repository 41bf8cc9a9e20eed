"""Output-path checks and atomic writes (``seq2seq.files``)."""

from __future__ import annotations

import os
import stat

import pytest
from conftest import refuse_new_files

from seq2seq.files import atomic_write, check_output_file


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
