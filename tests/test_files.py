"""Output-path checks and atomic writes (``seq2seq.files``)."""

from __future__ import annotations

import os
import stat

import pytest

from seq2seq.files import atomic_write, check_output_file


def test_check_output_file_names_the_setting_and_the_fault(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("a file\n")
    (tmp_path / "locked").mkdir()
    real_access = os.access
    monkeypatch.setattr(
        "os.access",
        lambda path, mode: os.path.basename(path) != "locked" and real_access(path, mode),
    )  # as for a read-only folder (chmod does not stop root)
    check_output_file("out.txt", "--output")
    check_output_file("new/sub/out.txt", "--output")  # the folders will be made
    cases = [
        ("folder", {}, IsADirectoryError, "--output folder is a folder; give a file name"),
        ("new/out.txt", {"make_parents": False}, FileNotFoundError, "folder new does not exist"),
        ("afile/out.txt", {}, NotADirectoryError, "--output afile/out.txt: afile is not a folder"),
        ("locked/out.txt", {}, PermissionError, "folder locked is not writable"),
        ("locked/new/out.txt", {}, PermissionError, "folder locked is not writable"),
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
