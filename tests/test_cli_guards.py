"""Guards of the command line: ``test`` without test splits, and two ``fit`` runs on one
checkpoint folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

fcntl = pytest.importorskip("fcntl")

_HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
sys.stdin.read()
"""


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_test_without_test_splits_is_one_line(tiny_run, in_tmp, multi30k_dir, monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "test",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir),
        "--data.test_splits", "[]",
        "--ckpt_path", str(tiny_run / "checkpoints/tiny/last.ckpt"),
    )  # fmt: skip
    assert code == 1, err
    assert err[-1] == (
        "seq2seq: error: test has nothing to score: --data.test_splits is empty; name the test "
        "split(s), e.g. --data.test_splits '[test]' (SEQ2SEQ_TRACEBACK=1 shows where)"
    )
    assert not any("Traceback" in line for line in err), err


def _fit_argv(multi30k_dir: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir),
        "--trainer.max_steps", "2",
        "--trainer.val_check_interval", "2",
        *extra,
    ]  # fmt: skip


def test_fit_refuses_a_checkpoint_folder_another_fit_writes_to(
    in_tmp, multi30k_dir, monkeypatch, capsys
):
    """While another process holds the lock of checkpoints/tiny, fit stops before training
    with one line naming the folder and that process, and leaves the folder's files as they
    were; a smoke run (which writes no checkpoint) still runs. Once the holder has ended (here:
    killed, leaving its lock file behind), fit trains and writes its checkpoints there."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    folder = in_tmp / "checkpoints" / "tiny"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"the other run's last.ckpt")
    (folder / "epoch=0-step=10.ckpt").write_bytes(b"the other run's best checkpoint")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(folder / ".seq2seq.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _files(folder)

        code, _, err = run_main(monkeypatch, capsys, *_fit_argv(multi30k_dir))
        assert code == 1, err
        assert err[-1].startswith(
            f"seq2seq: error: {folder.resolve()} is in use by another seq2seq fit "
            f"(pid {holder.pid})"
        ), err
        assert "dirpath" in err[-1]
        assert _files(folder) == before
        assert not (in_tmp / "lightning_logs").exists()  # the folders it made are removed

        code, _, err = run_main(
            monkeypatch, capsys, *_fit_argv(multi30k_dir, "--trainer.fast_dev_run", "true")
        )
        assert code == 0, err
        assert _files(folder) == before
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
        holder.stdin.close()

    assert (folder / ".seq2seq.lock").read_text().strip() == str(holder.pid)  # left behind
    code, _, err = run_main(monkeypatch, capsys, *_fit_argv(multi30k_dir))
    assert code == 0, err
    after = _files(folder)
    assert ".seq2seq.lock" not in after  # removed when fit ends
    assert after["last.ckpt"] != before["last.ckpt"]


def test_fit_in_a_new_folder_leaves_no_lock_and_no_warning(in_tmp, multi30k_dir, recwarn):
    """The lock file neither stays behind nor makes Lightning warn of a non-empty folder."""
    from seq2seq.cli import cli_main

    cli_main(_fit_argv(multi30k_dir))
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]
    names = sorted(p.name for p in (in_tmp / "checkpoints" / "tiny").iterdir())
    assert "last.ckpt" in names and ".seq2seq.lock" not in names


def test_a_held_lock_stops_a_second_lock_and_is_released(tmp_path):
    from seq2seq.cli import _FolderLock

    first = _FolderLock(tmp_path)
    first.acquire()
    assert (tmp_path / ".seq2seq.lock").read_text().strip().isdigit()
    with pytest.raises(OSError, match=rf"{tmp_path} is in use by another seq2seq fit \(pid \d+\)"):
        _FolderLock(tmp_path).acquire()
    first.release()
    assert list(tmp_path.iterdir()) == []
    second = _FolderLock(tmp_path)
    second.acquire()
    second.release()
