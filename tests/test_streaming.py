"""Tests of streamed training data: seq2seq.data.streaming through TranslationDataModule."""

from __future__ import annotations

import gzip
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import datasets
import lightning as L
import numpy as np
import pytest
import torch
from conftest import quiet_cpu_trainer
from test_datamodule import _Recorder

from seq2seq.cli import cli_main
from seq2seq.data.batching import filter_training_pairs
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.streaming import StreamingLoader, StreamingPairs
from seq2seq.data.tokenizer import Tokenizer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
VOCAB = 500
MAX_POSITIONS = 128
MAX_TOKENS = 600
POOL = 400  # 2,003 pairs: five full pools and one of 3 pairs
LONG = " ".join(["Hund"] * 200)  # beyond MAX_POSITIONS tokens


def _lines(multi30k_dir: Path, split: str, lang: str, n: int) -> list[str]:
    with gzip.open(multi30k_dir / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


@pytest.fixture(scope="module")
def pairs(multi30k_dir) -> dict[str, tuple[list[str], list[str]]]:
    """2,000 Multi30k training pairs plus three to be filtered; 40 validation pairs."""
    src, tgt = (_lines(multi30k_dir, "train", lang, 2000) for lang in ("de", "en"))
    # Inserted early, in pool 0: an empty side, a too long pair, a skewed pair.
    src[5:5] = ["", LONG, "Ja."]
    tgt[5:5] = ["Something.", LONG, "Yes, " + " ".join(["and so on"] * 10)]
    val = tuple(_lines(multi30k_dir, "val", lang, 40) for lang in ("de", "en"))
    return {"train": (src, tgt), "val": val}


def _write_text(folder: Path, split: str, src: list[str], tgt: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, lines in (("de", src), ("en", tgt)):
        (folder / f"{split}.{lang}").write_text("".join(f"{line}\n" for line in lines))


@pytest.fixture(scope="module")
def corpora(pairs, tmp_path_factory) -> dict[str, Path]:
    """The same pairs as aligned text files, JSONL, Parquet and a save_to_disk folder."""
    root = tmp_path_factory.mktemp("corpora")
    (src, tgt), val = pairs["train"], pairs["val"]
    folders = {fmt: root / fmt for fmt in ("text", "jsonl", "parquet", "disk")}
    _write_text(folders["text"], "train", src, tgt)
    folders["jsonl"].mkdir()
    with open(folders["jsonl"] / "train.jsonl", "w") as f:
        for s, t in zip(src, tgt, strict=True):
            f.write(json.dumps({"translation": {"de": s, "en": t}}) + "\n")
    folders["parquet"].mkdir()
    for split, (s, t) in (("train", (src, tgt)), ("val", val)):
        datasets.Dataset.from_dict({"de": s, "en": t}).to_parquet(
            str(folders["parquet"] / f"{split}.parquet"), batch_size=300
        )
    nested = [{"de": s, "en": t} for s, t in zip(src, tgt, strict=True)]
    datasets.Dataset.from_dict({"translation": nested}).save_to_disk(str(folders["disk"] / "train"))
    for fmt in ("text", "jsonl", "disk"):
        _write_text(folders[fmt], "val", *val)
    return folders


@pytest.fixture(scope="module")
def spm_file(pairs, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spm") / "spm.model"
    Tokenizer.train(pairs["train"][0] + pairs["train"][1], path, VOCAB)
    return path


@pytest.fixture(scope="module")
def kept(pairs, spm_file) -> dict:
    """Indices of the pairs the non-streaming filter keeps, and its counts."""
    tokenizer = Tokenizer.load(spm_file)
    src, tgt = pairs["train"]
    s = np.array([len(ids) for ids in tokenizer.encode(src)])
    t = np.array([len(ids) for ids in tokenizer.encode(tgt)])
    keep, counts = filter_training_pairs(s, t, MAX_POSITIONS, 3.0)
    return {"indices": np.flatnonzero(keep).tolist(), "counts": counts}


def _dm(folder: Path, cache: Path, spm_file: Path | None, **kwargs) -> TranslationDataModule:
    settings = dict(
        data_dir=str(folder),
        cache_dir=str(cache),
        tokenizer_path=str(spm_file) if spm_file else None,
        vocab_size=VOCAB,
        max_positions=MAX_POSITIONS,
        max_tokens=MAX_TOKENS,
        test_splits=[],
        download=False,
        streaming=True,
        stream_pool_size=POOL,
    )
    dm = TranslationDataModule(**{**settings, **kwargs})
    dm.setup("fit")
    return dm


def _indices(loader) -> list[list[int]]:
    return [batch["index"].tolist() for batch in loader]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def two_epochs(corpora, cache, spm_file) -> list[list[list[int]]]:
    """Batch indices of epochs 0 and 1 from the text files, no workers."""
    loader = _dm(corpora["text"], cache, spm_file).train_dataloader()
    return [_indices(loader), _indices(loader)]


# ---------------------------------------------------------------------- one pass
def test_every_kept_pair_once_per_epoch_within_budget(corpora, cache, spm_file, kept, caplog):
    dm = _dm(corpora["text"], cache, spm_file)
    loader = dm.train_dataloader()
    assert isinstance(loader, StreamingLoader) and isinstance(dm.train_set, StreamingPairs)
    with pytest.raises(TypeError):
        len(loader)  # an epoch ends when the stream does
    with caplog.at_level(logging.INFO):
        batches = list(loader)
    flat = [i for batch in batches for i in batch["index"].tolist()]
    assert sorted(flat) == kept["indices"]
    for batch in batches:
        width = max(batch["src"].shape[1], batch["tgt_in"].shape[1])
        assert batch["src"].shape[0] * width <= MAX_TOKENS
        assert "stream_position" not in batch
    assert dm.train_set.last_counts == kept["counts"]
    assert kept["counts"] == {"pairs": 2003, "kept": 2000, "empty": 1, "too_long": 1, "skewed": 1}
    assert "epoch 0: kept 2000 of 2003; dropped 1 with an empty side, 1 longer than" in caplog.text


def test_batches_hold_the_tokenised_pairs(corpora, cache, spm_file, pairs):
    batch = next(iter(_dm(corpora["text"], cache, spm_file).train_dataloader()))
    tokenizer = Tokenizer.load(spm_file)
    src, tgt = pairs["train"]
    for row, i in enumerate(batch["index"].tolist()):
        n_src = int(batch["src_mask"][row].sum())
        assert batch["src"][row, : n_src - 1].tolist() == tokenizer.encode([src[i]])[0]
        n_tgt = int((batch["tgt_out"][row] != 0).sum())
        assert batch["tgt_out"][row, : n_tgt - 1].tolist() == tokenizer.encode([tgt[i]])[0]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "disk"])
def test_every_format_streams_the_same_batches(corpora, cache, spm_file, two_epochs, fmt):
    loader = _dm(corpora[fmt], cache, spm_file).train_dataloader()
    assert _indices(loader) == two_epochs[0]


def test_hub_datasets_stream(corpora, cache, spm_file, two_epochs, monkeypatch):
    """A Hub name goes through load_dataset(streaming=True); here backed by local Parquet."""
    calls = []
    load_dataset = datasets.load_dataset

    def local(name, config, split, streaming=False):
        calls.append((name, config, split, streaming))
        files = {name: str(corpora["parquet"] / f"{name}.parquet") for name in ("train", "val")}
        return load_dataset("parquet", data_files=files, split=split, streaming=streaming)

    monkeypatch.setattr(datasets, "load_dataset", local)
    dm = _dm(corpora["text"], cache, spm_file, hf_dataset="someone/wmt-like", hf_config="de-en")
    loader = dm.train_dataloader()
    assert _indices(loader) == two_epochs[0]
    assert ("someone/wmt-like", "de-en", "train", True) in calls
    assert all(streaming for *_, streaming in calls)  # held-out splits too: no download
    # Resuming skips the stream's first pools without tokenising them.
    iterator = iter(loader)
    seen = [next(iterator)["index"].tolist() for _ in range(7)]
    state = dm.state_dict()
    resumed = _dm(corpora["text"], cache, spm_file, hf_dataset="someone/wmt-like")
    resumed.load_state_dict(state)
    assert seen + _indices(resumed.train_dataloader()) == two_epochs[1]


# ---------------------------------------------------------------------- epochs
def test_order_changes_between_epochs_and_follows_the_seed(corpora, cache, spm_file, two_epochs):
    first, second = two_epochs
    assert first != second
    assert sorted(map(sorted, first)) != sorted(map(sorted, second))  # other batches too
    assert sorted(i for b in first for i in b) == sorted(i for b in second for i in b)
    again = _dm(corpora["text"], cache, spm_file).train_dataloader()
    again.set_epoch(1)
    assert _indices(again) == second
    other_seed = _dm(corpora["text"], cache, spm_file, seed=7).train_dataloader()
    assert _indices(other_seed) != first


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_get_disjoint_complete_equal_shares(corpora, cache, spm_file, kept, num_workers):
    shares = []
    for rank in range(2):
        dm = _dm(corpora["text"], cache, spm_file, num_workers=num_workers)
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        shares.append(_indices(dm.train_dataloader()))
        dm.trainer = None
    assert len(shares[0]) == len(shares[1]) > 0
    flat = [sorted(i for batch in share for i in batch) for share in shares]
    assert not set(flat[0]) & set(flat[1])
    assert sorted(flat[0] + flat[1]) == kept["indices"]


def test_workers_split_pools_and_count_everything(corpora, cache, spm_file, kept):
    dm = _dm(corpora["text"], cache, spm_file, num_workers=2)
    batches = _indices(dm.train_dataloader())
    assert sorted(i for batch in batches for i in batch) == kept["indices"]
    assert dm.train_set.last_counts == kept["counts"]
    # Workers take turns: the first batch comes from pool 0, the second from pool 1.
    assert max(batches[0]) < POOL <= min(batches[1]) and max(batches[1]) < 2 * POOL


# ---------------------------------------------------------------------- resume
@pytest.mark.parametrize(("num_workers", "taken"), [(0, 1), (0, 13), (2, 1), (2, 14), (2, 59)])
def test_resume_mid_epoch_is_exact(corpora, cache, spm_file, num_workers, taken):
    dm = _dm(corpora["text"], cache, spm_file, num_workers=num_workers)
    loader = dm.train_dataloader()
    full = _indices(loader)
    assert taken < len(full)
    loader.set_epoch(0)
    iterator = iter(loader)
    seen = [next(iterator)["index"].tolist() for _ in range(taken)]
    state = dm.state_dict()
    del iterator
    assert state["train_stream"]["batches"] == taken
    resumed = _dm(corpora["text"], cache, spm_file, num_workers=num_workers)
    resumed.load_state_dict(state)
    resumed_loader = resumed.train_dataloader()
    assert seen + _indices(resumed_loader) == full
    assert resumed.train_set.epoch == 1  # the next pass is a whole epoch 1
    loader.set_epoch(1)
    assert _indices(resumed_loader) == _indices(loader)


def test_resume_needs_the_same_workers(corpora, cache, spm_file):
    dm = _dm(corpora["text"], cache, spm_file)
    next(iter(dm.train_dataloader()))
    state = dm.state_dict()
    resumed = _dm(corpora["text"], cache, spm_file, num_workers=2)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match=r"saved with 1 DataLoader worker.*uses 2"):
        next(iter(resumed.train_dataloader()))


@pytest.mark.filterwarnings("error:The stream position:UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_trainer_epochs_and_resume(corpora, cache, spm_file, two_epochs, tmp_path, num_workers):
    def fit(ckpt_path=None, callbacks=()) -> _Recorder:
        trainer = quiet_cpu_trainer(tmp_path, callbacks=list(callbacks))
        model = _Recorder()
        dm = _dm(corpora["text"], cache, spm_file, num_workers=num_workers)
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return model

    checkpoint = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1, filename="{step}"
    )
    first = fit(callbacks=[checkpoint])
    if num_workers == 0:
        assert first.seen == two_epochs[0] + two_epochs[1]
    n = len(two_epochs[0])
    assert len(first.seen) == 2 * n
    # Mid-epoch, after the last batch of epoch 0 (the loader has already seen the stream
    # end), and mid-epoch 1.
    for step in (5, n + 3):
        resumed = fit(ckpt_path=tmp_path / f"ckpt/step={step}.ckpt")
        assert resumed.seen == first.seen[step:], step
    again = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "again", every_n_train_steps=1, save_top_k=-1, filename="{step}"
    )
    resumed = fit(ckpt_path=tmp_path / f"ckpt/step={n}.ckpt", callbacks=[again])
    assert resumed.seen == first.seen[n:]
    # A checkpoint of that resumed run, mid-epoch 1, resumes exactly too.
    resumed = fit(ckpt_path=tmp_path / f"again/step={n + 3}.ckpt")
    assert resumed.seen == first.seen[n + 3 :]


def test_cli_fit_with_streaming(corpora, in_tmp):
    cli = cli_main(
        [
            "fit",
            "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(corpora["text"]),
            "--data.streaming", "true",
            "--data.stream_pool_size", "500",
            "--data.spm_input_sentence_size", "1500",
            "--data.test_splits", "[]",
            "--trainer.max_steps", "4",
            "--trainer.val_check_interval", "2",
            "--trainer.limit_val_batches", "1",
        ]
    )  # fmt: skip
    assert cli.trainer.global_step == 4
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    assert isinstance(cli.datamodule.train_set, StreamingPairs)
    assert len(list((in_tmp / "data/cache").glob("spm_*.model"))) == 1


class StreamRecorder(L.Callback):
    """Writes the example indices of every training batch, per rank and epoch (loaded by the
    DDP run below from this file)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[int]]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.append((trainer.current_epoch, batch["index"].tolist()))

    def on_train_end(self, trainer, pl_module) -> None:
        Path(f"seen{trainer.global_rank}.json").write_text(json.dumps(self.seen))


@pytest.mark.slow
def test_ddp_ranks_share_each_epoch_and_finish_together(corpora, spm_file, kept, tmp_path):
    """Two CPU processes (gloo) stream two whole epochs: no hang, disjoint complete shares."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    args = [
        sys.executable, "-m", "seq2seq.cli", "fit",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(corpora["text"]),
        "--data.tokenizer_path", str(spm_file),
        "--data.vocab_size", str(VOCAB),
        "--data.max_positions", str(MAX_POSITIONS),
        "--data.max_tokens", "2000",
        "--data.test_splits", "[]",
        "--data.streaming", "true",
        "--data.stream_pool_size", "700",
        "--trainer.strategy", "ddp",
        "--trainer.devices", "2",
        "--trainer.max_steps", "-1",
        "--trainer.max_epochs", "2",
        "--trainer.limit_val_batches", "0",
        "--trainer.callbacks+=test_streaming.StreamRecorder",
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the DDP run hung:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-4000:]
    seen = [json.loads((tmp_path / f"seen{rank}.json").read_text()) for rank in range(2)]
    assert len(seen[0]) == len(seen[1])
    for epoch in (0, 1):
        shares = [[i for e, batch in ranks if e == epoch for i in batch] for ranks in seen]
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == kept["indices"]


# ---------------------------------------------------------------------- errors
def test_empty_or_fully_filtered_stream_is_an_error(tmp_path, spm_file, pairs):
    for name, src, tgt in (("empty", [], []), ("long", [LONG, ""], [LONG, "x"])):
        _write_text(tmp_path / name, "train", src, tgt)
        _write_text(tmp_path / name, "val", *pairs["val"])
    dm = _dm(tmp_path / "empty", tmp_path / "c1", spm_file)
    with pytest.raises(ValueError, match=r"training split 'train' is empty"):
        list(dm.train_dataloader())
    dm = _dm(tmp_path / "long", tmp_path / "c2", spm_file)
    with pytest.raises(ValueError, match=r"Every training pair .* was filtered out"):
        list(dm.train_dataloader())
    with pytest.raises(ValueError, match=r"training split 'train' is empty"):
        _dm(tmp_path / "empty", tmp_path / "c3", None)  # no SentencePiece model to train
