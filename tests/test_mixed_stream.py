"""Tests of several pairs streamed as one (seq2seq.data.mixed_stream): the draws, each pair's
cycle across epochs, positions found again from the seed, and the data module's batches,
tags, workers, ranks and resume."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import write_lines
from test_multilingual_data import LANGS, _dm, _slice, _tag

from seq2seq.data import mixed_stream
from seq2seq.data.batching import temperature_probs
from seq2seq.data.corpus import locate_split
from seq2seq.data.mixed_stream import MixedStream

pytestmark = pytest.mark.filterwarnings("ignore:.*truncated \\(never dropped\\):UserWarning")


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 16 items, so that a few dozen items cross block boundaries."""
    monkeypatch.setattr(mixed_stream, "BLOCK", 16)


def _numbered(tmp_path: Path, sizes: dict[str, int]) -> list:
    """A pair ``xx-yy`` per entry, ``size`` lines whose text names the pair and the line."""
    corpora = []
    for name, size in sizes.items():
        src, tgt = name.split("-")
        folder = tmp_path / name
        write_lines(folder / f"train.{src}", [f"{name} {i}" for i in range(size)])
        write_lines(folder / f"train.{tgt}", [f"{name} {i} target" for i in range(size)])
        corpora.append(locate_split(folder, "train", src, tgt))
    return corpora


def _stream(tmp_path: Path, sizes: dict[str, int], temperature=1.0, seed=1) -> MixedStream:
    corpora = _numbered(tmp_path, sizes)
    counts = [corpus.count() for corpus in corpora]
    assert counts == list(sizes.values())
    return MixedStream(corpora, list(sizes), counts, temperature_probs(counts, temperature), seed)


def _items(stream: MixedStream, epoch: int, start: int = 0, size: int = 7) -> list[str]:
    items = []
    for src, tgt, pairs in stream.iter_chunks(size, start, epoch):
        assert len(src) == len(tgt) == len(pairs) <= size
        for s, t, k in zip(src, tgt, pairs.tolist(), strict=True):
            assert s.startswith(stream.names[k] + " ") and t == s + " target"
            items.append(s)
    return items


def test_each_pair_is_read_in_order_as_a_cycle_across_epochs(tmp_path, small_blocks):
    stream = _stream(tmp_path, {"ab-cd": 50, "ef-gh": 10, "ij-kl": 3})
    assert len(stream) == 63
    epochs = [_items(stream, epoch) for epoch in range(4)]
    assert all(len(items) == 63 for items in epochs)
    for name, size in (("ab-cd", 50), ("ef-gh", 10), ("ij-kl", 3)):
        mine = [int(s.split()[1]) for items in epochs for s in items if s.startswith(name)]
        # lines 0, 1, ... of the pair, starting over after its last, never restarted per epoch
        assert mine == [i % size for i in range(len(mine))], name
        per_epoch = [sum(s.startswith(name) for s in items) for items in epochs]
        assert per_epoch == [
            int(c[stream.names.index(name)]) for c in map(stream.epoch_counts, range(4))
        ]
    assert epochs[0] != epochs[1]  # other draws every epoch
    assert _items(stream, 2) == epochs[2]  # and the same again for an epoch and seed
    other_seed = _stream(tmp_path / "again", {"ab-cd": 50, "ef-gh": 10, "ij-kl": 3}, seed=2)
    assert [s.split()[0] for s in _items(other_seed, 0)] != [s.split()[0] for s in epochs[0]]


@pytest.mark.parametrize("start", [1, 15, 16, 17, 40, 62, 63])
def test_any_position_is_found_again_without_reading_earlier_items(tmp_path, small_blocks, start):
    stream = _stream(tmp_path, {"ab-cd": 50, "ef-gh": 13})
    for epoch in (0, 3):
        whole = _items(stream, epoch)
        assert _items(stream, epoch, start, size=5) == whole[start:]


def test_temperature_sets_the_shares(tmp_path):
    sizes = {"ab-cd": 3000, "ef-gh": 1000}
    for temperature, share in ((1.0, 0.75), (float("inf"), 0.5)):
        stream = _stream(tmp_path / str(temperature), sizes, temperature)
        counts = sum(stream.epoch_counts(epoch) for epoch in range(5))
        assert counts.sum() == 5 * 4000
        assert abs(counts[0] / counts.sum() - share) < 0.02, temperature


def test_an_empty_pair_is_refused_naming_it(tmp_path):
    corpora = _numbered(tmp_path, {"ab-cd": 5, "ef-gh": 0})
    with pytest.raises(ValueError, match=r"training split of ef-gh is empty"):
        MixedStream(corpora, ["ab-cd", "ef-gh"], [5, 0], [0.5, 0.5], 1)


# ---------------------------------------------------------------------- the data module
@pytest.fixture(scope="module")
def parallel(tmp_path_factory) -> Path:
    """Multi-parallel de/en/fr files: 300 training lines, 20 validation lines."""
    return _slice(tmp_path_factory.mktemp("parallel"), LANGS, {"train": 300, "val": 20})


def _streamed(parallel: Path, cache: Path, **kwargs):
    settings = dict(pairs=["en-de", "en-fr"], streaming=True, stream_pool_size=100, test_splits=[])
    dm = _dm(parallel, cache, **{**settings, **kwargs})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _batches(dm) -> list[dict]:
    return list(dm.train_dataloader())


def test_streamed_batches_hold_both_pairs_with_their_tags(parallel, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        dm = _streamed(parallel, tmp_path)
    assert (
        "en-de 300 pairs (p=0.500), en-fr 300 pairs (p=0.500); 600 drawn per epoch" in caplog.text
    )
    tags = torch.tensor([_tag(dm.tokenizer, "de"), _tag(dm.tokenizer, "fr")])
    batches = _batches(dm)
    pairs = torch.cat([b["pair"] for b in batches])
    assert dm.train_set.last_counts["pairs"] == 600
    assert len(pairs) == dm.train_set.last_counts["kept"] > 500
    assert (pairs == 0).sum() > 200 and (pairs == 1).sum() > 200
    for batch in batches:
        assert torch.equal(batch["src"][:, 0], tags[batch["pair"]])
        assert batch["src"].numel() <= 400 or len(batch["index"]) == 1
    # a source is its tag, then the pieces of its English line, as the tokenizer encodes it
    english = (parallel / "train.en").read_text().splitlines()
    stream = dm.train_set.corpus
    first = batches[0]
    for row in range(len(first["index"])):
        pair = int(first["pair"][row])
        lang = ("de", "fr")[pair]
        src = first["src"][row][first["src_mask"][row, 0, 0]].tolist()
        position = int(first["index"][row])
        line = _line_of(stream, 0, position)
        expected = dm.tokenizer.encode([english[line]], tgt_lang=lang)[0]
        assert src[:-1] == expected[: len(src) - 1], (row, lang)
    # subword regularisation re-segments each item with its own pair's tag
    sampled = _streamed(parallel, tmp_path, subword_alpha=0.5)
    batch = next(iter(sampled.train_dataloader()))
    assert torch.equal(batch["src"][:, 0], tags[batch["pair"]])


def test_a_pair_that_keeps_nothing_is_named_and_warned_about(parallel, tmp_path, caplog):
    """Per-pair counts after every epoch; a pair whose every line is filtered out is warned
    about (the epoch trained on the other pairs alone)."""
    folder = tmp_path / "data"
    for split, n in (("train", 300), ("val", 20)):
        for lang in LANGS:
            lines = (parallel / f"{split}.{lang}").read_text().splitlines()[:n]
            if lang == "fr" and split == "train":
                lines = [" ".join(["lang"] * 80) for _ in lines]  # above max_positions=64
            write_lines(folder / f"{split}.{lang}", lines)
    dm = _streamed(folder, tmp_path / "cache")
    with caplog.at_level(logging.INFO), pytest.warns(UserWarning) as record:
        pairs = torch.cat([b["pair"] for b in _batches(dm)])
    assert set(pairs.tolist()) == {0}
    de = dm.train_set.current_pass.total_counts(0)
    assert re.search(rf"; per pair: en-de kept {de['kept']} of {de['pairs']}, en-fr kept 0 of "
                     rf"{600 - de['pairs']}\.", caplog.text), caplog.text  # fmt: skip
    assert [str(w.message) for w in record if "kept none" in str(w.message)] == [
        f"en-fr kept none of its training pairs in epoch 0 (kept 0 of {600 - de['pairs']}; "
        f"dropped 0 with an empty side, {600 - de['pairs']} longer than max_positions=64, 0 with "
        "a length ratio above max_length_ratio=3.0): the model trained on the other pairs alone"
    ]


def _line_of(stream: MixedStream, epoch: int, position: int) -> int:
    """The line of its pair's split that item ``position`` of ``epoch`` reads."""
    start = stream.line_positions(epoch, position)
    block, offset = divmod(position, mixed_stream.BLOCK)
    pair = int(stream.block_pairs(epoch, block)[offset])
    return int(start[pair]) % int(stream.sizes[pair])


@pytest.mark.parametrize(("num_workers", "taken"), [(0, 5), (2, 1), (2, 9)])
def test_resume_mid_epoch_is_exact(parallel, tmp_path, num_workers, taken):
    dm = _streamed(parallel, tmp_path, num_workers=num_workers)
    loader = dm.train_dataloader()
    full = [b["index"].tolist() for b in loader]
    loader.set_epoch(0)
    iterator = iter(loader)
    seen = [next(iterator)["index"].tolist() for _ in range(taken)]
    state = dm.state_dict()
    del iterator
    assert state["train_stream"]["mixture"]["pairs"] == ["en-de", "en-fr"]
    resumed = _streamed(parallel, tmp_path, num_workers=num_workers)
    resumed.load_state_dict(state)
    resumed_loader = resumed.train_dataloader()
    assert seen + [b["index"].tolist() for b in resumed_loader] == full
    loader.set_epoch(1)
    assert [b["index"].tolist() for b in resumed_loader] == [b["index"].tolist() for b in loader]


def test_ranks_get_disjoint_shares_of_the_same_draws(parallel, tmp_path):
    whole = _streamed(parallel, tmp_path)
    kept = sorted(i for b in _batches(whole) for i in b["index"].tolist())
    shares = []
    for rank in range(2):
        dm = _streamed(parallel, tmp_path)
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        shares.append([i for b in _batches(dm) for i in b["index"].tolist()])
        dm.trainer = None
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == kept


def test_other_training_files_on_resume_are_warned_about(parallel, tmp_path):
    dm = _streamed(parallel, tmp_path)
    iterator = iter(dm.train_dataloader())
    next(iterator)
    state = dm.state_dict()
    del iterator
    state["train_stream"]["mixture"]["sizes"] = [300, 250]
    resumed = _streamed(parallel, tmp_path)
    with pytest.warns(UserWarning, match=r"held \[300, 250\] sentence pairs .* hold \[300, 300\]"):
        resumed.load_state_dict(state)


def test_counting_reads_metadata_where_there_is_some(tmp_path):
    import datasets

    folder = tmp_path / "parquet"
    folder.mkdir()
    datasets.Dataset.from_dict({"de": ["a", "b", "c"], "en": ["x", "y", "z"]}).to_parquet(
        str(folder / "train.parquet")
    )
    assert locate_split(folder, "train", "de", "en").count() == 3
    text = tmp_path / "text"
    write_lines(text / "train.de", ["a", "b"])
    write_lines(text / "train.en", ["x", "y"])
    assert locate_split(text, "train", "de", "en").count(chunk_size=1) == 2


@pytest.mark.slow  # two processes (gloo) of a tiny model over two epochs: ~30 s
def test_ddp_ranks_share_the_mixed_epochs_and_finish_together(parallel, tmp_path):
    """Every rank draws the same items and keeps a disjoint share; the shares cover the
    epoch that one process streams, in both epochs (each drawn anew)."""
    from test_streaming import CONFIGS, assert_ddp_epochs_shared

    whole = _streamed(parallel, tmp_path / "cache", num_workers=0)
    epochs = [sorted(i for b in _batches(whole) for i in b["index"].tolist()) for _ in range(2)]
    assert epochs[0] != epochs[1]
    args = [
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(parallel),
        "--data.cache_dir", str(tmp_path / "cache"),
        "--data.vocab_size", str(whole.vocab_size),
        "--data.max_positions", "64",
        "--data.max_tokens", "400",
        "--data.pairs", "[en-de, en-fr]",
        "--data.stream_pool_size", "100",
    ]  # fmt: skip
    assert_ddp_epochs_shared(args, tmp_path, epochs)
