"""A write that the machine refuses (a full disk: ``ENOSPC`` raised at the point of writing)
ends in one error naming the file and what was kept, never leaves a partial file, and never
removes the previous good one: for every writer of ours (checkpoints, ``last.ckpt`` on a
stop, the tokenised cache, the SentencePiece model, hypotheses and scores, predict's and
translate's outputs, ``average`` and ``export``)."""

from __future__ import annotations

import errno
import io
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import multi30k_lines, multi30k_slice, run_main, tiny_config

from seq2seq.checkpoint import AtomicCheckpointIO, load_checkpoint
from seq2seq.files import WriteError, atomic_write, disk_error, write_error

NO_SPACE = os.strerror(errno.ENOSPC)


class FullDisk:
    """``os.fdopen`` (the opener of :func:`seq2seq.files.atomic_write`'s temporary files) whose
    files refuse every byte past ``room`` with ``OSError(ENOSPC)`` from their ``write``, as a
    full disk does, when ``refuses(path)`` holds for the file's path (read from
    ``/proc/self/fd``); other files are written as usual."""

    def __init__(self, monkeypatch, refuses=lambda path: True, room: int = 0) -> None:
        self.refuses = refuses
        self.room = room
        self.refused: list[Path] = []
        real = os.fdopen

        def fdopen(fd, *args, **kwargs):
            f = real(fd, *args, **kwargs)
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            return _Filling(f, self, path) if self.refuses(path) else f

        monkeypatch.setattr(os, "fdopen", fdopen)


class _Filling:
    """A file that takes ``disk.room`` bytes, then fails each write with ``ENOSPC``."""

    def __init__(self, f, disk: FullDisk, path: Path) -> None:
        self._f, self._disk, self._path, self._written = f, disk, path, 0

    def write(self, data):
        if self._written + len(data) > self._disk.room:
            self._disk.refused.append(self._path)
            raise OSError(errno.ENOSPC, NO_SPACE)
        self._written += len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def _leftovers(folder: Path) -> list[str]:
    """Temporary files or folders (``.name.*``) anywhere under ``folder``."""
    return sorted(str(p) for p in folder.rglob(".*"))


def _checkpoint(step: int) -> dict:
    return {"global_step": step, "state_dict": {"w": torch.arange(4096.0) + step}}


# ----------------------------------------------------------------------------- the writer
def test_atomic_write_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    path.write_text("the previous output\n")
    FullDisk(monkeypatch)
    with pytest.raises(WriteError) as info, atomic_write(path, "w") as f:
        f.write("new output\n")
    assert str(info.value).startswith(f"cannot write {path}: {NO_SPACE} (errno {errno.ENOSPC}")
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    assert "The previous" in str(info.value)
    assert path.read_text() == "the previous output\n"
    assert _leftovers(tmp_path) == []


def test_a_failed_fsync_or_a_new_file_leaves_nothing(tmp_path, monkeypatch):
    def fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "new.bin"
    with pytest.raises(WriteError, match=r"new\.bin: .*\(errno 5, EIO\)\. Nothing partial"):
        with atomic_write(path, "wb", fsync=True) as f:
            f.write(b"data")
    assert list(tmp_path.iterdir()) == []


def test_only_a_runtime_error_with_an_os_error_behind_it_is_a_disk_error():
    try:
        try:
            raise OSError(errno.ENOSPC, NO_SPACE)
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from None
    except RuntimeError as err:
        chained = err
    assert disk_error(chained).errno == errno.ENOSPC  # from its __context__
    assert disk_error(RuntimeError("a bug")) is None
    assert disk_error(ValueError("bad")) is None


def test_write_error_survives_pickling_and_keeps_its_kind():
    import pickle

    err = pickle.loads(pickle.dumps(WriteError("a/b.ckpt", errno.EDQUOT, None, "Kept.")))
    assert (err.path, err.errno, err.kept) == ("a/b.ckpt", errno.EDQUOT, "Kept.")
    assert os.strerror(errno.EDQUOT) in str(err)
    denied = write_error(PermissionError(errno.EACCES, "Permission denied"), "a/b", "Kept.")
    assert isinstance(denied, WriteError) and isinstance(denied, PermissionError)
    assert isinstance(pickle.loads(pickle.dumps(denied)), PermissionError)
    other = write_error(IsADirectoryError(errno.EISDIR, "Is a directory"), "a/b", "Kept.")
    assert isinstance(other, IsADirectoryError) and not isinstance(other, WriteError)


# --------------------------------------------------------------------------- checkpoints
def test_checkpoint_save_on_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """torch.save's zip writer turns the file's ENOSPC into a RuntimeError ("unexpected pos");
    the error is the disk's, naming the file and the step the previous file holds."""
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(_checkpoint(5), path)
    FullDisk(monkeypatch, room=1000)  # part of the archive goes in, as on a real disk
    with pytest.raises(WriteError) as info:
        AtomicCheckpointIO().save_checkpoint(_checkpoint(10), path)
    assert isinstance(info.value.__cause__, RuntimeError)  # what torch raised
    message = str(info.value)
    assert message.startswith(f"cannot write {path}: {NO_SPACE}")
    assert "(step 5) is unchanged" in message
    assert load_checkpoint(path)["global_step"] == 5
    assert _leftovers(tmp_path) == []


def test_an_unrelated_runtime_error_of_a_save_stays_itself(tmp_path, monkeypatch):
    def save(obj, f, *args, **kwargs):
        raise RuntimeError("not a disk fault")

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(RuntimeError, match="not a disk fault") as info:
        AtomicCheckpointIO().save_checkpoint(_checkpoint(1), tmp_path / "a.ckpt")
    assert not isinstance(info.value, OSError)
    assert list(tmp_path.iterdir()) == []


def _fit_argv(tmp_path: Path, train_spm) -> list[str]:
    """A tiny fit of 10 steps validated at steps 5 and 10, with its own checkpoint folder."""
    corpus = multi30k_slice(tmp_path / "corpus", {"train": 300, "val": 8, "test_2016_flickr": 8})
    spm = train_spm(multi30k_lines("train", "de", 300) + multi30k_lines("train", "en", 300), 200)
    config = tiny_config(
        tmp_path / "fit.yaml",
        trainer={"max_steps": 10, "val_check_interval": 5, "limit_val_batches": 1},
        data={
            "data_dir": str(corpus),
            "cache_dir": str(tmp_path / "cache"),
            "vocab_size": 200,
            "tokenizer_path": str(spm),
        },
    )
    return ["fit", "--config", str(config), "--checkpoint_dir", str(tmp_path / "run")]


def test_fit_on_a_disk_full_from_step_10_reports_once_and_keeps_step_5(
    tmp_path, monkeypatch, capsys, train_spm
):
    """The failed save at step 10 (LastCheckpoint's, then ModelCheckpoint's would follow) and
    the stop handler's retry of last.ckpt give one line, naming what last.ckpt still holds."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    run = tmp_path / "run"
    saving = {"step": 0}
    real_save = AtomicCheckpointIO.save_checkpoint

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        saving["step"] = checkpoint["global_step"]
        return real_save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save_checkpoint)
    disk = FullDisk(monkeypatch, lambda path: path.parent == run and saving["step"] >= 10)
    code, out, err = run_main(monkeypatch, capsys, *_fit_argv(tmp_path, train_spm))
    assert code == 1, err
    errors = [line for line in err if line.startswith("seq2seq: error:")]
    assert len(errors) == 1, err
    assert "Traceback" not in out + "\n".join(err)
    assert len(disk.refused) >= 2  # the validation's save and the stop handler's retry
    assert f"cannot write {run}/" in errors[0] and NO_SPACE in errors[0]
    step = load_checkpoint(run / "last.ckpt")["global_step"]
    assert 0 < step < 10
    assert (
        f"{run / 'last.ckpt'} still holds step {step}; free space and resume with " in (errors[0])
    )
    assert f"--ckpt_path last --checkpoint_dir {run}" in errors[0]
    assert _leftovers(run) == []


def test_last_checkpoint_saves_quietly_after_a_refused_write_when_it_can(tmp_path):
    """After another file's refused write, the stop handler's save of last.ckpt that succeeds
    is reported in the same one error."""
    from seq2seq.callbacks import LastCheckpoint

    callback = LastCheckpoint()
    callback.checkpoint_dir = str(tmp_path)
    path = tmp_path / "last.ckpt"

    def save_checkpoint(target, weights_only=False):
        torch.save(_checkpoint(7), target)

    trainer = SimpleNamespace(
        state=SimpleNamespace(fn="fit"),
        fast_dev_run=False,
        checkpoint_callback=SimpleNamespace(dirpath=str(tmp_path)),
        global_step=7,
        save_checkpoint=save_checkpoint,
        fit_loop=SimpleNamespace(
            epoch_loop=SimpleNamespace(
                batch_progress=SimpleNamespace(current=SimpleNamespace(ready=1, processed=1))
            )
        ),
    )
    callback._start_step = 0
    error = WriteError(tmp_path / "hypotheses.txt", errno.ENOSPC, None, "Nothing partial.")
    import seq2seq.compat as compat

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compat, "logged_step", lambda trainer: 7)
        mp.setattr(compat, "set_logged_step", lambda trainer, step: None)
        callback.on_exception(trainer, None, error)  # no exception of its own
    assert load_checkpoint(path)["global_step"] == 7
    assert f"The training state at step 7 was saved to {path}" in str(error)


# ------------------------------------------------------------ cache and SentencePiece model
def test_tokenised_cache_on_a_full_disk_keeps_nothing_of_it(tmp_path, monkeypatch, train_spm):
    import fsspec.implementations.local as local

    from seq2seq.data.corpus import locate_split
    from seq2seq.data.token_cache import tokenized_split
    from seq2seq.data.tokenizer import Tokenizer

    corpus_dir = multi30k_slice(tmp_path / "corpus", {"train": 50})
    before = {p.name: p.read_bytes() for p in corpus_dir.iterdir()}
    spm = Tokenizer.load(train_spm(multi30k_lines("train", "de", 300), 200))
    split = locate_split(corpus_dir, "train", "de", "en")

    def write(self, data):
        raise OSError(errno.ENOSPC, NO_SPACE)

    monkeypatch.setattr(local.LocalFileOpener, "write", write)
    cache = tmp_path / "cache" / "tokenized"
    with pytest.raises(WriteError) as info:
        tokenized_split(split, spm, cache, "deen", "fingerprint")
    assert str(info.value).startswith(f"cannot write {cache}/train_deen_")
    assert "Nothing of the cache was kept (the corpus files are untouched)" in str(info.value)
    assert list(cache.iterdir()) == []
    assert {p.name: p.read_bytes() for p in corpus_dir.iterdir()} == before


def test_sentencepiece_model_on_a_full_disk_leaves_no_model(tmp_path, monkeypatch):
    from seq2seq.data.tokenizer import Tokenizer

    FullDisk(monkeypatch, lambda path: path.name.startswith(".spm.model."))
    with pytest.raises(WriteError, match=r"spm\.model: .*No SentencePiece model was kept"):
        Tokenizer.train(multi30k_lines("train", "de", 300), tmp_path / "spm.model", 200)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------- outputs of commands
def test_hypotheses_and_scores_on_a_full_disk(tmp_path, monkeypatch):
    """The writer of validate/test's hypotheses and .scores files (write_lines)."""
    from seq2seq.evaluation import write_lines

    path = tmp_path / "hypotheses" / "val.step10.txt"
    write_lines(path, ["an earlier hypothesis"])
    FullDisk(monkeypatch)
    for target in (path, path.with_suffix(".scores")):
        with pytest.raises(WriteError, match=f"cannot write {target}: {NO_SPACE}"):
            write_lines(target, ["a hypothesis"])
    assert path.read_text() == "an earlier hypothesis\n"
    assert _leftovers(tmp_path) == []
    assert not path.with_suffix(".scores").exists()


def test_predict_output_on_a_full_disk_keeps_the_previous_file(tmp_path, monkeypatch):
    from seq2seq.callbacks import TranslationWriter

    output = tmp_path / "predictions.txt"
    output.write_text("earlier translations\n")
    writer = TranslationWriter(str(output))
    trainer = SimpleNamespace(global_rank=0)
    predictions = [[(0, [("a translation", 0.0)]), (1, [("another", 0.0)])]]
    FullDisk(monkeypatch)
    with pytest.raises(WriteError, match=f"cannot write {output}: {NO_SPACE}"):
        writer.write_on_epoch_end(trainer, None, predictions, None)
    assert output.read_text() == "earlier translations\n"
    assert _leftovers(tmp_path) == []


def _one_error(code, err) -> str:
    assert code == 1, err
    assert len([line for line in err if line.strip()]) == 1, err
    assert err[0].startswith("seq2seq: error: cannot write "), err
    return err[0]


def test_translate_output_on_a_full_disk(tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    source = tmp_path / "source.de"
    source.write_text("ein Hund läuft .\n")
    output = tmp_path / "out.en"
    output.write_text("earlier output\n")
    FullDisk(monkeypatch, lambda path: path.parent == tmp_path)
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    argv = ["translate", "--ckpt_path", ckpt, "--input", str(source), "--output", str(output)]
    line = _one_error(*run_main(monkeypatch, capsys, *argv)[::2])
    assert f"cannot write {output}: {NO_SPACE}" in line
    assert output.read_text() == "earlier output\n"
    assert _leftovers(tmp_path) == []


class _FullStdout(io.TextIOBase):
    """A standard output redirected to a full disk."""

    def write(self, text):
        raise OSError(errno.ENOSPC, NO_SPACE)


def test_translate_to_a_full_standard_output(tiny_run, tmp_path, monkeypatch, capsys):
    from seq2seq.cli import main

    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    source = tmp_path / "source.de"
    source.write_text("ein Hund läuft .\n")
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    monkeypatch.setattr(
        "sys.argv", ["seq2seq", "translate", "--ckpt_path", ckpt, "--input", str(source)]
    )
    monkeypatch.setattr(sys, "stdout", _FullStdout())
    code = main()
    line = _one_error(code, capsys.readouterr().err.strip().splitlines())
    assert f"cannot write standard output: {NO_SPACE}" in line
    assert "the output is incomplete" in line


def test_average_output_on_a_full_disk(tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    output = tmp_path / "avg.ckpt"
    inputs = sorted(str(p) for p in (tiny_run / "checkpoints/tiny").glob("*.ckpt"))
    assert len(inputs) >= 2
    argv = ["average", "--inputs", *inputs, "--output", str(output)]
    assert run_main(monkeypatch, capsys, *argv)[0] == 0
    before = output.read_bytes()
    FullDisk(monkeypatch, lambda path: path.parent == tmp_path, room=1000)
    line = _one_error(*run_main(monkeypatch, capsys, *argv)[::2])
    assert f"cannot write {output}: {NO_SPACE}" in line and "The previous" in line
    assert output.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_export_folder_on_a_full_disk_keeps_the_earlier_export(tmp_path):
    from seq2seq.export.common import MARKER, write_folder

    output = tmp_path / "exported"
    write_folder(output, lambda folder: (folder / "model.bin").write_bytes(b"v1"), {})

    def build(folder: Path) -> None:
        with open(folder / "model.bin", "wb") as f:
            f.write(b"half")
            raise OSError(errno.ENOSPC, NO_SPACE)  # as the file's write on a full disk

    with pytest.raises(WriteError) as info:
        write_folder(output, build, {})
    assert str(info.value).startswith(f"cannot write {output}: {NO_SPACE}")
    assert f"The previous export in {output} is unchanged" in str(info.value)
    assert (output / "model.bin").read_bytes() == b"v1" and (output / MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]


def test_run_lock_pid_file_on_a_full_disk(tmp_path, monkeypatch):
    from seq2seq.cli.run_folder import FolderLock

    def write_text(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, NO_SPACE)

    lock = FolderLock(tmp_path)
    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(WriteError, match="Nothing was trained"):
        lock.acquire()
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ the report line
def test_main_reports_a_write_error_in_one_line_and_a_traceback_on_request(monkeypatch, capsys):
    import seq2seq.cli.entry as entry

    def cli_main(args=None):
        raise WriteError("run/x.ckpt", errno.EROFS, None, "run/last.ckpt still holds step 3.")

    monkeypatch.setattr(entry, "cli_main", cli_main)
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    code, _, err = run_main(monkeypatch, capsys, "fit")
    assert code == 1
    assert err == [
        f"seq2seq: error: cannot write run/x.ckpt: {os.strerror(errno.EROFS)} (errno "
        f"{errno.EROFS}, EROFS). run/last.ckpt still holds step 3."
    ]
    monkeypatch.setenv("SEQ2SEQ_TRACEBACK", "1")
    with pytest.raises(WriteError):
        run_main(monkeypatch, capsys, "fit")
