"""Tests of seq2seq.temporaries: temporaries that name their owner, the removal of those a
killed run left (tokenised cache, SentencePiece model, checkpoints, exports, downloads), the
modes of the cache, and two runs preparing one cache at once."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import MULTI30K, REPO, multi30k_lines, multi30k_slice

from seq2seq import temporaries
from seq2seq.temporaries import (
    ABANDONED_AGE,
    make_temporary_folder,
    remove_abandoned,
    temporary_prefix,
)

VOCAB = 200
SIZES = {"train": 300, "val": 40, "test_2016_flickr": 40}


_STARTS: dict[int, int] = {}  # start times of the processes of dead_pid


@pytest.fixture
def dead_pid() -> int:
    """The id of a process of this host that has exited (and been reaped); the temporaries
    of :func:`_owned` record its start time, so that a new process given the same id
    meanwhile would not keep them."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    start = temporaries._process(process.pid)  # a zombie until waited for
    process.wait()
    _STARTS[process.pid] = start[1] if start else 0
    return process.pid


def _owned(target: str, pid: int, suffix: str = "", start: int | None = None) -> str:
    """The name of a temporary of ``target`` owned by process ``pid`` of this host."""
    start = _STARTS.get(pid, 0) if start is None else start
    return f".{target}.{temporaries._host()}-{pid}-{start}.abcd_123{suffix}"


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------------- the rules
def test_a_dead_owners_temporary_goes_a_live_owners_stays(tmp_path, dead_pid, caplog):
    dead = tmp_path / _owned("last.ckpt", dead_pid, ".tmp")
    dead.write_bytes(b"half a checkpoint")
    fd, live = tempfile.mkstemp(dir=tmp_path, prefix=temporary_prefix("last.ckpt"), suffix=".tmp")
    os.close(fd)
    _age(Path(live), 10 * ABANDONED_AGE)  # a live owner's temporary is kept at any age
    (tmp_path / "last.ckpt").write_bytes(b"the good checkpoint")
    with caplog.at_level(logging.INFO):
        removed = remove_abandoned(tmp_path, "*", ".tmp")
    assert removed == [dead]
    assert _names(tmp_path) == sorted(["last.ckpt", Path(live).name])
    lines = [r.getMessage() for r in caplog.records if "abandoned" in r.getMessage()]
    assert lines == [
        f"Removed the abandoned temporary {dead} (its owner, process {dead_pid}, is gone)."
    ]


def test_old_style_and_other_host_temporaries_go_by_age_alone(tmp_path):
    old_style = tmp_path / ".val_deen_0123456789abcdef.k2j_x9q1"
    old_style.mkdir()
    (old_style / "data.arrow").write_bytes(b"rows")
    other_host = tmp_path / ".val_deen_0123456789abcdef.elsewhere-1-0.abcdefgh"
    other_host.mkdir()
    assert remove_abandoned(tmp_path) == []
    _age(old_style, 2 * ABANDONED_AGE)  # the file inside is still recent: the folder is in use
    assert remove_abandoned(tmp_path) == []
    _age(old_style / "data.arrow", 2 * ABANDONED_AGE)
    _age(other_host, 2 * ABANDONED_AGE)
    assert sorted(remove_abandoned(tmp_path)) == sorted([old_style, other_host])
    assert _names(tmp_path) == []


def test_a_reused_process_id_does_not_keep_a_temporary(tmp_path):
    if not Path(f"/proc/{os.getpid()}/stat").is_file():
        pytest.skip("no /proc: process start times are unknown")
    start = int(temporary_prefix("x").split(".")[2].rsplit("-", 1)[1])
    mine = tmp_path / _owned("x", os.getpid(), ".tmp", start)
    reused = tmp_path / _owned("y", os.getpid(), ".tmp", start + 1)
    for path in (mine, reused):
        path.write_text("")
    assert remove_abandoned(tmp_path, "*", ".tmp") == [reused]
    assert _names(tmp_path) == [mine.name]


def test_only_temporaries_of_the_target_are_touched(tmp_path, dead_pid):
    keep = [
        "last.ckpt",
        "last.ckpt.tmp",  # a user's file
        ".last.ckpt.notes",  # a hidden file of the user, not a temporary's shape
        _owned("best.ckpt", dead_pid, ".tmp"),  # another target
        _owned("last.ckpt", dead_pid, ".part"),  # another suffix
    ]
    for name in keep:
        (tmp_path / name).write_text("")
        _age(tmp_path / name, 2 * ABANDONED_AGE)
    assert remove_abandoned(tmp_path, "last.ckpt", ".tmp") == []
    assert _names(tmp_path) == sorted(keep)
    assert remove_abandoned(tmp_path / "missing", "*") == []


def test_an_unremovable_temporary_is_warned_about_and_left(tmp_path, dead_pid, monkeypatch):
    dead = tmp_path / _owned("x", dead_pid)
    dead.mkdir()

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(temporaries.shutil, "rmtree", refuse)
    with pytest.warns(UserWarning, match=r"Could not remove the abandoned temporary .*left there"):
        assert remove_abandoned(tmp_path) == []
    assert dead.is_dir()


# ---------------------------------------------------------------------- modes
@pytest.mark.parametrize("umask", [0o002, 0o022])
def test_cache_folders_and_files_follow_the_umask(tmp_path, umask, train_spm):
    from seq2seq.data.corpus import locate_split
    from seq2seq.data.token_cache import tokenized_split
    from seq2seq.data.tokenizer import Tokenizer

    data = multi30k_slice(tmp_path / "data", {"val": 20})
    corpus = locate_split(data, "val", "de", "en")
    tokenizer = Tokenizer.load(_spm(train_spm))
    previous = os.umask(umask)
    try:
        made = make_temporary_folder(tmp_path, "plain")
        table, written = tokenized_split(
            corpus, tokenizer, tmp_path / "cache" / "tokenized", "deen", corpus.fingerprint()
        )
    finally:
        os.umask(previous)
    assert written
    folder = Path(table.cache_files[0]["filename"]).parent
    assert stat.S_IMODE(made.stat().st_mode) == 0o777 & ~umask
    for path in (folder, folder.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~umask, path
    files = list(folder.iterdir())
    assert files
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


# ---------------------------------------------------------------------- runs
def _spm(train_spm) -> Path:
    train = [multi30k_lines("train", lang, SIZES["train"], MULTI30K) for lang in ("de", "en")]
    return train_spm(train[0] + train[1], VOCAB)


# A preparation of the tokenised cache of split argv[3] of corpus argv[1] with the model
# argv[2] into argv[4], as prepare_data does it. Once its table is written in the temporary
# folder, it prints the table's digest, and then (argv[5] a folder) waits until two runs have
# got that far, or (argv[5] "-") sleeps until it is killed.
_PREPARE = textwrap.dedent(
    """
    import hashlib, os, sys, time
    from pathlib import Path
    from seq2seq.data import token_cache as cache
    from seq2seq.data.corpus import locate_split
    from seq2seq.data.tokenizer import Tokenizer

    data, spm, split, folder, barrier = sys.argv[1:6]
    real = cache.write_tokenized

    def write(corpus, tokenizer, file, streaming=False, languages=None):
        rows = real(corpus, tokenizer, file, streaming, languages)
        print(hashlib.sha256(file.read_bytes()).hexdigest(), flush=True)
        if barrier == "-":
            time.sleep(60)
        (Path(barrier) / str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while len(list(Path(barrier).iterdir())) < 2:
            if time.monotonic() > deadline:
                raise SystemExit("the other preparation did not start")
            time.sleep(0.02)
        return rows

    cache.write_tokenized = write
    corpus = locate_split(Path(data), split, "de", "en")
    table, _ = cache.tokenized_split(
        corpus, Tokenizer.load(spm), Path(folder), "deen", corpus.fingerprint()
    )
    print(len(table), flush=True)
    """
)


def _prepare(data: Path, spm: Path, split: str, folder: Path, barrier: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", _PREPARE, str(data), str(spm), split, str(folder), barrier],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_a_killed_preparations_temporary_is_removed_by_the_next(tmp_path, train_spm, caplog):
    from seq2seq.data.datamodule import TranslationDataModule

    data = multi30k_slice(tmp_path / "data", SIZES)
    spm = _spm(train_spm)
    cache = tmp_path / "cache"
    folder = cache / "tokenized"
    killed = _prepare(data, spm, "val", folder, "-")
    try:
        assert len(killed.stdout.readline().strip()) == 64, killed.stderr.read()
        left = list(folder.glob(".val_deen_*"))
        assert len(left) == 1 and (left[0] / "data.arrow").is_file()
        killed.send_signal(signal.SIGKILL)
    finally:
        killed.kill()
        killed.wait()
        killed.stdout.close()
        killed.stderr.close()
    assert left[0].is_dir()  # what the kill left behind
    dm = TranslationDataModule(
        data_dir=str(data), cache_dir=str(cache), tokenizer_path=str(spm), vocab_size=VOCAB,
        download=False,
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        dm.prepare_data()
    assert not left[0].exists()
    assert (
        f"Removed the abandoned temporary {left[0]} (its owner, process {killed.pid}, is gone)."
        in caplog.messages
    )
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []
    assert sorted(p.name.split("_")[0] for p in folder.iterdir()) == ["test", "train", "val"]
    dm.setup("validate")
    assert len(dm.val_set) == SIZES["val"]


def test_two_preparations_of_one_cache_at_once_both_succeed(tmp_path, train_spm):
    data = multi30k_slice(tmp_path / "data", {"val": SIZES["val"]})
    spm = _spm(train_spm)
    folder = tmp_path / "cache" / "tokenized"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    runs = [_prepare(data, spm, "val", folder, str(barrier)) for _ in range(2)]
    outputs = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        outputs.append(out.split())
    (digest_a, rows_a), (digest_b, rows_b) = outputs
    assert rows_a == rows_b == str(SIZES["val"])
    assert digest_a == digest_b  # both wrote the same table
    assert len(list(barrier.iterdir())) == 2  # both had written a table before either renamed
    (cached,) = folder.iterdir()  # one cache folder, no temporary left
    assert hashlib.sha256((cached / "data.arrow").read_bytes()).hexdigest() == digest_a


# ---------------------------------------------------------------------- other folders
def test_sentencepiece_temporaries_of_killed_runs_go(tmp_path, train_spm, dead_pid):
    from seq2seq.data.corpus import locate_split
    from seq2seq.data.spm_files import SentencePieceSettings, load_or_train

    data = multi30k_slice(tmp_path / "data", {"train": SIZES["train"]})
    cache = tmp_path / "cache"
    cache.mkdir()
    model = tmp_path / "models" / "spm.model"
    model.parent.mkdir()
    shutil.copy(_spm(train_spm), model)
    in_cache = cache / _owned("spm_deen_unigram_200_0123456789ab.model", dead_pid, ".tmp")
    beside = model.parent / _owned("spm.model", dead_pid, ".tmp")
    for path in (in_cache, beside):
        path.write_bytes(b"half a model")
    corpus = locate_split(data, "train", "de", "en")
    tokenizer = load_or_train(corpus, SentencePieceSettings(vocab_size=VOCAB), cache, model)
    assert tokenizer.vocab_size == VOCAB
    assert _names(cache) == [] and _names(model.parent) == ["spm.model"]


def test_checkpoint_temporaries_of_killed_runs_go_when_fit_locks_the_folder(tmp_path, dead_pid):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from seq2seq.cli.run_folder import lock_checkpoint_folders

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "last.ckpt").write_bytes(b"the good one")
    dead = folder / _owned("last.ckpt", dead_pid, ".tmp")
    dead.write_bytes(b"half of one")
    old_style = folder / ".epoch=1-step=10.ckpt.q1w2e3r4.tmp"
    old_style.write_bytes(b"half of another")
    _age(old_style, 2 * ABANDONED_AGE)
    trainer = SimpleNamespace(checkpoint_callbacks=[ModelCheckpoint(dirpath=folder)])
    locks = lock_checkpoint_folders(trainer)
    try:
        assert "last.ckpt" in _names(folder)
        assert not dead.exists() and not old_style.exists()
    finally:
        for lock in locks:
            lock.release()
    assert _names(folder) == ["last.ckpt"]


def test_export_removes_staging_folders_of_killed_exports(tmp_path, dead_pid):
    from seq2seq.export.common import MARKER, write_folder

    output = tmp_path / "ct2"
    staging = tmp_path / _owned("ct2", dead_pid)
    staging.mkdir()
    (staging / "model.bin").write_bytes(b"half")
    moved_aside = tmp_path / _owned("ct2", dead_pid, ".old")
    moved_aside.mkdir()  # the only copy of an earlier export while ct2 is missing: kept

    def build(folder: Path) -> None:
        (folder / "model.bin").write_bytes(b"whole")

    write_folder(output, build, {"format": "test"})
    assert _names(tmp_path) == sorted(["ct2", moved_aside.name])
    write_folder(output, build, {"format": "test"})  # now ct2 is in place: litter
    assert _names(tmp_path) == ["ct2"]
    assert sorted(p.name for p in output.iterdir()) == sorted([MARKER, "model.bin"])


def test_a_download_removes_partial_files_of_killed_downloads(tmp_path, dead_pid):
    from seq2seq.data.multi30k import download_multi30k

    source = tmp_path / "server"
    source.mkdir()
    (source / "val.de.gz").write_bytes(b"the file")
    root = tmp_path / "data"
    root.mkdir()
    partial = root / _owned("val.de.gz", dead_pid, ".part")
    partial.write_bytes(b"the f")
    sha = hashlib.sha256(b"the file").hexdigest()
    assert download_multi30k(root, source.as_uri(), {"val.de.gz": sha}) == [root / "val.de.gz"]
    assert _names(root) == ["val.de.gz"]
