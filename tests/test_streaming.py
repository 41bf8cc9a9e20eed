"""Tests of streamed training data: seq2seq.data.streaming through TranslationDataModule."""

from __future__ import annotations

import json
import logging
import re
import signal
import warnings
from pathlib import Path
from types import SimpleNamespace

import datasets
import lightning as L
import numpy as np
import pytest
import torch
from conftest import (
    multi30k_lines,
    other_batching_warning,
    quiet_cpu_trainer,
    run_ddp_cli,
    write_corpus,
)
from test_datamodule import _Recorder

from seq2seq.checkpoint import load_checkpoint
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


@pytest.fixture(scope="module")
def pairs(multi30k_dir) -> dict[str, tuple[list[str], list[str]]]:
    """2,000 Multi30k training pairs plus three to be filtered; 40 validation pairs."""
    src, tgt = (multi30k_lines("train", lang, 2000, multi30k_dir) for lang in ("de", "en"))
    # Inserted early, in pool 0: an empty side, a too long pair, a skewed pair.
    src[5:5] = ["", LONG, "Ja."]
    tgt[5:5] = ["Something.", LONG, "Yes, " + " ".join(["and so on"] * 10)]
    val = tuple(multi30k_lines("val", lang, 40, multi30k_dir) for lang in ("de", "en"))
    return {"train": (src, tgt), "val": val}


def _write_text(folder: Path, split: str, src: list[str], tgt: list[str]) -> None:
    write_corpus(folder, {split: (src, tgt)})


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
def spm_file(pairs, train_spm) -> Path:
    return train_spm(pairs["train"][0] + pairs["train"][1], VOCAB)


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


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pairs_above_max_tokens_are_warned_about_once(
    corpora, cache, spm_file, pairs, kept, caplog, num_workers
):
    """Streamed pairs that need more than max_tokens on their own form batches of their own,
    over the budget: warned about once, the first time (the pairs of the pools read so far),
    naming the option, its value, the split and what to do; the counts logged after every
    epoch give the epoch's number."""
    budget = 30
    tokenizer = Tokenizer.load(spm_file)
    s, t = (np.array([len(ids) + 1 for ids in tokenizer.encode(side)]) for side in pairs["train"])
    index = np.array(kept["indices"])
    cost = np.maximum(s, t)[index]
    first_pool = cost[index < POOL]
    dm = _dm(corpora["text"], cache, spm_file, max_tokens=budget, num_workers=num_workers)
    loader = dm.train_dataloader()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        epochs = 2 if num_workers == 0 else 1  # once per epoch is checked without workers
        batches = [b for _ in range(epochs) for b in _indices(loader)]
    messages = [str(w.message) for w in caught if " is below what " in str(w.message)]
    assert len(messages) == 1, messages
    match = re.fullmatch(
        rf"--data\.max_tokens={budget} is below what (\d+) sentence pairs of 'train' read so "
        r"far \(epoch 0\) need on their own \(the longest: (\d+) tokens, counted as the longer "
        r"of source \+ EOS and target \+ BOS\); each of them forms a batch of its own, over the "
        rf"token budget\. Raise --data\.max_tokens to at least \2, or lower "
        r"--data\.max_positions \(longer training pairs are dropped\) or filter such pairs out "
        r"of the corpus\. Warned once; the counts logged after every epoch give their number\.",
        messages[0],
    )
    assert match, messages[0]
    count, longest = int(match[1]), int(match[2])
    over = int((cost > budget).sum())
    assert 0 < (first_pool > budget).sum() < over
    if num_workers == 0:  # warned as pool 0 is batched
        assert (count, longest) == (int((first_pool > budget).sum()), int(first_pool.max()))
    else:  # warned as the first batch arrives, pool 0 and perhaps others read
        assert (first_pool > budget).sum() <= count <= over
    logged = f"; {over} kept pairs above max_tokens={budget} on their own."
    assert caplog.text.count(logged) == epochs
    by_index = dict(zip(index.tolist(), cost.tolist(), strict=True))
    alone = [b for b in batches if max(by_index[i] for i in b) * len(b) > budget]
    assert len(alone) == epochs * over and all(len(b) == 1 for b in alone)


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


class _BatchLog(L.Callback):
    """Records ``(global step, example indices)`` of every training batch begun and
    ``(global step, loss)`` of every one trained; with ``interrupt_at``, raises
    KeyboardInterrupt (as Ctrl-C does) inside that step's batch, before its backward pass."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.interrupt_at = interrupt_at
        self.seen: list[tuple[int, list[int]]] = []
        self.losses: list[tuple[int, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.append((trainer.global_step, batch["index"].tolist()))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append((trainer.global_step, float(outputs["loss"])))

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if trainer.global_step == self.interrupt_at:
            raise KeyboardInterrupt


def _fit_translation(
    folder: Path,
    cache: Path,
    spm_file: Path,
    checkpoints: Path,
    max_steps: int,
    ckpt_path: Path | None = None,
    interrupt_at: int | None = None,
    exits: bool = False,
    **data,
) -> _BatchLog:
    """Trains a tiny TranslationModule (dropout on) on the streamed corpus without validation,
    with ``LastCheckpoint`` writing ``checkpoints/last.ckpt``; a Ctrl-C (``interrupt_at``, or
    one the test raises elsewhere: ``exits``) ends it as Lightning does, with SystemExit."""
    from seq2seq.callbacks import LastCheckpoint
    from seq2seq.module import TranslationModule

    L.seed_everything(1)
    model = TranslationModule(
        vocab_size=VOCAB,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        max_positions=MAX_POSITIONS,
        dropout=0.1,
    )
    log = _BatchLog(interrupt_at)
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=checkpoints), LastCheckpoint(), log]
    trainer = quiet_cpu_trainer(checkpoints.parent, max_steps=max_steps, callbacks=callbacks)
    dm = _dm(folder, cache, spm_file, **data)
    handler = signal.getsignal(signal.SIGINT)  # Lightning ignores SIGINT after a Ctrl-C
    try:
        if interrupt_at is None and not exits:
            trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        else:
            with pytest.raises(SystemExit):
                trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    finally:
        signal.signal(signal.SIGINT, handler)
    return log


@pytest.fixture(scope="module")
def uninterrupted(corpora, cache, spm_file, tmp_path_factory) -> dict[int, _BatchLog]:
    """12 steps of the tiny model, per number of DataLoader workers (0 and 2)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    return {
        workers: _fit_translation(
            corpora["text"], cache, spm_file, root / str(workers), 12, num_workers=workers
        )
        for workers in (0, 2)
    }


@pytest.mark.parametrize("num_workers", [0, 2])
def test_last_ckpt_of_a_max_steps_stop_continues_the_stream(
    corpora, cache, spm_file, uninterrupted, tmp_path, num_workers
):
    """last.ckpt written when max_steps ends training between validations (Lightning has
    counted the cut epoch complete by then) holds the stream position after the last trained
    batch: resumed with a higher max_steps, the run trains the uninterrupted run's batches
    with its losses."""
    settings = dict(num_workers=num_workers)
    checkpoints = tmp_path / "checkpoints"
    _fit_translation(corpora["text"], cache, spm_file, checkpoints, 5, **settings)
    saved = load_checkpoint(checkpoints / "last.ckpt")
    assert saved["global_step"] == 5
    assert saved["TranslationDataModule"]["train_stream"]["epoch"] == 0
    assert saved["TranslationDataModule"]["train_stream"]["batches"] == 5
    resumed = _fit_translation(
        corpora["text"], cache, spm_file, checkpoints, 12, checkpoints / "last.ckpt", **settings
    )
    reference = uninterrupted[num_workers]
    assert resumed.seen == reference.seen[5:]
    assert resumed.losses == reference.losses[5:]


def _assert_resumes_after_7_batches(corpora, cache, spm_file, checkpoints, reference, settings):
    """last.ckpt of a run stopped after 7 trained batches holds the stream position after
    them, and the run resumed from it trains the uninterrupted run's batches from the 8th on,
    with its losses."""
    saved = load_checkpoint(checkpoints / "last.ckpt")
    assert saved["global_step"] == 7
    assert saved["TranslationDataModule"]["train_stream"]["batches"] == 7
    resumed = _fit_translation(
        corpora["text"], cache, spm_file, checkpoints, 12, checkpoints / "last.ckpt", **settings
    )
    assert resumed.seen == reference.seen[7:]
    assert resumed.losses == reference.losses[7:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_cut_short_by_ctrl_c_is_trained_again(
    corpora, cache, spm_file, uninterrupted, tmp_path, num_workers
):
    """Ctrl-C inside batch 7: last.ckpt holds the position before it, so the resumed run
    trains it again, as without streaming, and then the uninterrupted run's batches."""
    settings = dict(num_workers=num_workers)
    checkpoints = tmp_path / "checkpoints"
    reference = uninterrupted[num_workers]
    stopped = _fit_translation(
        corpora["text"], cache, spm_file, checkpoints, 12, interrupt_at=7, **settings
    )
    assert stopped.seen == reference.seen[:8] and stopped.losses == reference.losses[:7]
    _assert_resumes_after_7_batches(corpora, cache, spm_file, checkpoints, reference, settings)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("noted", [False, True], ids=["waiting", "received"])
def test_ctrl_c_while_the_next_batch_is_fetched_loses_no_batch(
    corpora, cache, spm_file, uninterrupted, tmp_path, monkeypatch, num_workers, noted
):
    """Ctrl-C between two batches, while the loader fetches the one after next (Lightning
    takes batch 8 from its prefetch buffer, then fetches batch 9): whether the stream had
    handed batch 9 over yet (``received``) or not (``waiting``), last.ckpt holds the position
    after the 7 trained batches, and the resumed run trains the uninterrupted run's batches
    from the 8th on."""
    from seq2seq.data import streaming

    record = streaming.Pass.record
    calls = []

    def interrupted_record(plan, tag):
        calls.append(tag)
        if len(calls) == 9 and not noted:
            raise KeyboardInterrupt
        record(plan, tag)
        if len(calls) == 9:
            raise KeyboardInterrupt

    settings = dict(num_workers=num_workers)
    checkpoints = tmp_path / "checkpoints"
    reference = uninterrupted[num_workers]
    with monkeypatch.context() as patch:
        patch.setattr(streaming.Pass, "record", interrupted_record)
        stopped = _fit_translation(
            corpora["text"], cache, spm_file, checkpoints, 12, exits=True, **settings
        )
    assert stopped.seen == reference.seen[:7] and stopped.losses == reference.losses[:7]
    _assert_resumes_after_7_batches(corpora, cache, spm_file, checkpoints, reference, settings)


@pytest.mark.filterwarnings("error:Resuming with:UserWarning")
def test_resume_with_other_batching_settings_warns_or_refuses(corpora, cache, spm_file):
    """Settings that decide the batches are saved with the position: resuming with another
    max_tokens, bucket_size, max_positions or max_length_ratio warns in one line naming the
    option and both values; another seed or pool size cannot continue the epoch and is
    refused, naming the option and both values. Unchanged settings resume exactly, silently."""
    dm = _dm(corpora["text"], cache, spm_file)
    loader = dm.train_dataloader()
    full = _indices(loader)
    loader.set_epoch(0)
    iterator = iter(loader)
    seen = [next(iterator)["index"].tolist() for _ in range(4)]
    state = dm.state_dict()
    assert state["batching"] == {
        "streaming": True,
        "max_tokens": MAX_TOKENS,
        "bucket_size": None,
        "max_positions": MAX_POSITIONS,
        "max_length_ratio": 3.0,
        "seed": 1,
        "stream_pool_size": POOL,
        "pairs": None,
        "pair_temperature": 1.0,
    }
    same = _dm(corpora["text"], cache, spm_file)
    same.load_state_dict(state)
    assert seen + _indices(same.train_dataloader()) == full

    changes = {"max_tokens": 800, "bucket_size": 50, "max_positions": 20, "max_length_ratio": 1.5}
    for name, value in changes.items():
        other = _dm(corpora["text"], cache, spm_file, **{name: value})
        message = other_batching_warning(name, value, state["batching"][name])
        with pytest.warns(UserWarning, match=message):
            other.load_state_dict(state)
        assert seen + _indices(other.train_dataloader()) != full, name
    for name, option, value in (("seed", "seed", 7), ("stream_pool_size", "pool_size", 300)):
        other = _dm(corpora["text"], cache, spm_file, **{name: value})
        saved = state["train_stream"][option]
        message = rf"--data\.{name}={saved}, but this run has --data\.{name}={value}"
        with pytest.raises(ValueError, match=message):
            other.load_state_dict(state)
    # The position is kept per DataLoader worker: the command line is checked before any
    # data is read (0 workers count as 1).
    settings = {**state["batching"], "num_workers": 2}
    refusal = TranslationDataModule.resume_refusal(state, settings)
    assert refusal == (
        "The checkpoint was written with --data.num_workers=0 (or 1), but this run has "
        "--data.num_workers=2: the stream position is kept per worker, so the batches that "
        "follow cannot be reproduced; resume with --data.num_workers=0 (or 1)."
    )
    assert TranslationDataModule.resume_refusal(state, {**settings, "num_workers": 0}) is None
    assert TranslationDataModule.resume_refusal(state, {**settings, "num_workers": 1}) is None


def test_cli_fit_with_streaming(corpora, in_tmp):
    # Lightning's default check_val_every_n_epoch=1 counts val_check_interval within epochs.
    with pytest.warns(UserWarning, match="add --trainer.check_val_every_n_epoch null to vali"):
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


def test_streaming_validation_advice_only_where_validations_may_never_come():
    from types import SimpleNamespace

    from seq2seq.cli.environment import streaming_validation_advice

    def advice(streaming, interval, every):
        trainer = SimpleNamespace(val_check_interval=interval, check_val_every_n_epoch=every)
        return streaming_validation_advice(trainer, SimpleNamespace(streaming=streaming))

    assert "val_check_interval 5000 and --trainer.check_val_every_n_epoch 1" in advice(
        True, 5000, 1
    )
    assert advice(True, 5000, None) is None  # steps counted across epochs
    assert advice(True, 1.0, 1) is None  # a validation at the end of each pass
    assert advice(False, 5000, 1) is None  # a cached split: epochs of known length


class StreamRecorder(L.Callback):
    """Writes the example indices of every training batch, per rank and epoch (loaded by the
    DDP run below from this file)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[int]]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.append((trainer.current_epoch, batch["index"].tolist()))

    def on_train_end(self, trainer, pl_module) -> None:
        Path(f"seen{trainer.global_rank}.json").write_text(json.dumps(self.seen))


def assert_ddp_epochs_shared(args: list[str], tmp_path: Path, epochs: list[list[int]]) -> None:
    """Runs ``seq2seq fit ARGS`` streaming ``len(epochs)`` epochs on two CPU processes (gloo)
    and checks that each epoch's shares are disjoint and together the indices ``epochs[e]``
    (sorted), and that the processes took as many batches (none waits for the other)."""
    run_ddp_cli(
        [
            "fit", *args, "--data.streaming", "true", "--data.test_splits", "[]",
            "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.max_steps", "-1",
            "--trainer.max_epochs", str(len(epochs)), "--trainer.limit_val_batches", "0",
            "--trainer.callbacks+=test_streaming.StreamRecorder",
        ],
        tmp_path,
    )  # fmt: skip
    seen = [json.loads((tmp_path / f"seen{rank}.json").read_text()) for rank in range(2)]
    assert len(seen[0]) == len(seen[1])
    for epoch, expected in enumerate(epochs):
        shares = [[i for e, batch in ranks if e == epoch for i in batch] for ranks in seen]
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == expected, epoch


@pytest.mark.slow
def test_ddp_ranks_share_each_epoch_and_finish_together(corpora, spm_file, kept, tmp_path):
    """Two CPU processes (gloo) stream two whole epochs: no hang, disjoint complete shares."""
    args = [
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(corpora["text"]),
        "--data.tokenizer_path", str(spm_file),
        "--data.vocab_size", str(VOCAB),
        "--data.max_positions", str(MAX_POSITIONS),
        "--data.max_tokens", "2000",
        "--data.stream_pool_size", "700",
    ]  # fmt: skip
    assert_ddp_epochs_shared(args, tmp_path, [kept["indices"]] * 2)


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
