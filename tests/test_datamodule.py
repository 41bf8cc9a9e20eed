"""Tests of seq2seq.data.datamodule.TranslationDataModule on a slice of Multi30k."""

from __future__ import annotations

import gzip
import logging
import warnings
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from conftest import (  # MULTI30K: SEQ2SEQ_MULTI30K or ../shared
    MULTI30K,
    other_batching_warning,
    quiet_cpu_trainer,
)

from seq2seq.data import datamodule, multi30k
from seq2seq.data import token_cache as arrow_cache
from seq2seq.data.corpus import read_lines
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.tokenizer import EOS_ID, Tokenizer

VOCAB = 600
MAX_POSITIONS = 128
LONG = " ".join(["Hund"] * 200)  # far beyond MAX_POSITIONS tokens


def _write(path: Path, lines: list[str]) -> None:
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """2,000 training pairs plus three that must be filtered, 200 val pairs, two test sets."""
    root = tmp_path_factory.mktemp("m30k")
    train = {lang: read_lines(MULTI30K / f"train.{lang}.gz")[:2000] for lang in ("de", "en")}
    train["de"] += ["", LONG, "Ja."]
    train["en"] += ["Something.", LONG, "Yes, " + " ".join(["and so on"] * 10)]
    val = {lang: read_lines(MULTI30K / f"val.{lang}.gz")[:200] for lang in ("de", "en")}
    val["de"].append(LONG)
    val["en"].append("A long one.")
    for lang in ("de", "en"):
        _write(root / f"train.{lang}.gz", train[lang])
        _write(root / f"val.{lang}.gz", val[lang])
        _write(
            root / f"test_2016_flickr.{lang}.gz", read_lines(MULTI30K / f"val.{lang}.gz")[300:400]
        )
        (root / f"extra.{lang}").write_text("\n".join(val[lang][:20]) + "\n")
    return root


def _dm(corpus: Path, cache: Path, **kwargs) -> TranslationDataModule:
    settings = dict(
        data_dir=str(corpus),
        cache_dir=str(cache),
        vocab_size=VOCAB,
        max_positions=MAX_POSITIONS,
        max_tokens=1024,
        download=False,
    )
    return TranslationDataModule(**{**settings, **kwargs})


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def dm(corpus, cache) -> TranslationDataModule:
    dm = _dm(corpus, cache)
    dm.prepare_data()
    with pytest.warns(UserWarning, match="truncated"):
        dm.setup()
    return dm


def test_vocab_size_known_before_setup(corpus, cache):
    dm = _dm(corpus, cache)
    assert dm.vocab_size == VOCAB and dm.tokenizer is None
    assert dm.test_set_names == ["test_2016_flickr"]


def test_training_filter_counts_are_logged(corpus, tmp_path, caplog):
    dm = _dm(corpus, tmp_path)
    with caplog.at_level(logging.INFO):
        dm.setup("fit")
    assert "kept 2000 of 2003; dropped 1 with an empty side, 1 longer than" in caplog.text
    assert "1 with a length ratio above max_length_ratio=3.0" in caplog.text
    assert dm.tokenizer.vocab_size == VOCAB
    assert len(dm.train_set) == 2000
    assert dm.tokenized_splits == ["train", "val"]


def test_train_batches(dm):
    loader = dm.train_dataloader()
    batches = list(loader)
    assert len(batches) == len(loader)
    indices = torch.cat([b["index"] for b in batches]).tolist()
    assert sorted(indices) == list(range(2000))
    batch = batches[0]
    assert batch["src"].shape[0] * max(batch["src"].shape[1], batch["tgt_in"].shape[1]) <= 1024
    assert (
        batch["src"].gather(1, batch["src_mask"][:, 0, 0].sum(1, keepdim=True) - 1) == EOS_ID
    ).all()
    assert "src_text" not in batch


def test_train_set_stays_memory_mapped(dm, corpus, tmp_path, monkeypatch):
    # Training indexes the Arrow cache on disk; only lengths live in memory, as numpy arrays.
    assert dm.train_set.data.cache_files
    assert all(isinstance(a, np.ndarray) for a in dm._lengths["train"])
    # Tokenising in chunks (here 7 pairs) gives the ids of one call over the whole split.
    monkeypatch.setattr(arrow_cache, "ENCODE_CHUNK", 7)
    chunked = _dm(corpus, tmp_path)
    table = chunked._tokenized(chunked._locate("val"), dm.tokenizer)
    assert table["src"] == dm.tokenizer.encode(read_lines(corpus / "val.de.gz"))
    assert table["tgt"] == dm.tokenizer.encode(read_lines(corpus / "val.en.gz"))


def test_cache_holds_uint16_ids_and_training_reads_no_text(dm):
    # Ids below 65,536 take two bytes; a training batch reads only the index and id columns
    # of the memory-mapped table, held-out batches also the raw lines.
    assert {dm.train_set.data.features[side].feature.dtype for side in ("src", "tgt")} == {"uint16"}
    assert dm.train_set._ids.column_names == ["index", "src", "tgt"]
    assert dm.train_set._text is None
    assert dm.val_set._text.column_names == ["src_text", "tgt_text"]
    example = dm.train_set[0]
    assert set(example) == {"index", "src", "tgt"}
    assert all(type(i) is int for i in example["src"] + example["tgt"])


def test_heldout_is_complete_raw_and_truncated(dm, corpus):
    raw_src = read_lines(corpus / "val.de.gz")
    raw_ref = read_lines(corpus / "val.en.gz")
    batches = list(dm.val_dataloader())
    seen = {}
    for batch in batches:
        assert batch["src"].shape[1] <= MAX_POSITIONS
        for i, src_text, ref_text in zip(
            batch["index"].tolist(), batch["src_text"], batch["ref_text"], strict=True
        ):
            seen[i] = (src_text, ref_text)
    assert sorted(seen) == list(range(len(raw_ref)))  # nothing dropped, LONG included
    assert all(seen[i] == (raw_src[i], raw_ref[i]) for i in seen)


def test_test_dataloaders_follow_test_set_names(corpus, cache):
    dm = _dm(corpus, cache, test_splits=["extra", "test_2016_flickr"])
    dm.setup("test")
    loaders = dm.test_dataloader()
    sizes = [sum(len(b["index"]) for b in loader) for loader in loaders]
    assert dm.test_set_names == ["extra", "test_2016_flickr"] and sizes == [20, 100]


def _costs(dataset) -> np.ndarray:
    """(N,) padded positions each example of ``dataset`` needs, as the batches count them: the
    longer of source + EOS and target + BOS (source + EOS without targets)."""
    examples = dataset.__getitems__(list(range(len(dataset))))
    return np.array([max(len(e["src"]), len(e.get("tgt", [])) + 1) for e in examples])


def _budget_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if " is below what " in str(w.message)]


def test_pairs_above_max_tokens_are_warned_about_once_per_split(corpus, cache, dm):
    """A token budget below what a pair needs on its own puts that pair in a batch of its own,
    over the budget. One warning per split says so: the option and its value, how many pairs
    of which split, the longest one's tokens, and what to do. Building the loaders again (the
    next epoch, fit then validate) warns no more."""
    budget = 30
    costs = {"train": _costs(dm.train_set), "val": _costs(dm.val_set)}
    small = _dm(corpus, cache, max_tokens=budget)
    with pytest.warns(UserWarning, match="truncated"):
        small.setup("fit")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = small.train_dataloader()
        train = list(loader)
        list(loader)  # the next epoch
        list(small.train_dataloader())
        for _ in range(2):
            list(small.val_dataloader())
    messages = _budget_warnings(caught)
    assert len(messages) == 2, messages
    counted = "counted as the longer of source + EOS and target + BOS"
    advice = {
        "train": "Raise --data.max_tokens to at least {}, or lower --data.max_positions "
        "(longer training pairs are dropped) or filter such pairs out of the corpus.",
        "val": "Raise --data.eval_max_tokens (unset, it follows max_tokens) to at least {} "
        "(held-out sentences are never dropped).",
    }
    for message, split in zip(messages, ("train", "val"), strict=True):
        over = costs[split][costs[split] > budget]
        assert over.size > 0
        longest = int(over.max())
        assert message == (
            f"--data.max_tokens={budget} is below what {over.size} sentence pairs of "
            f"{split!r} need on their own (the longest: {longest} tokens, {counted}); each of "
            "them forms a batch of its own, over the token budget. " + advice[split].format(longest)
        )
    # What the warning says happens: each such pair alone in a batch above the budget.
    cost = costs["train"]
    alone = [
        b["index"].tolist() for b in train if cost[b["index"]].max() * len(b["index"]) > budget
    ]
    assert all(len(b) == 1 for b in alone) and len(alone) == int((cost > budget).sum())
    # The held-out budget of its own names its option; a training budget that fits says nothing.
    lines = read_lines(corpus / "extra.de")
    held_out = _dm(
        corpus,
        cache,
        eval_max_tokens=budget,
        test_splits=["extra"],
        predict_file=str(corpus / "extra.de"),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        held_out.setup()
        list(held_out.train_dataloader())
        list(held_out.test_dataloader()[0])
        list(held_out.predict_dataloader())
    messages = _budget_warnings(caught)
    assert len(messages) == 2, messages
    extra = _costs(held_out.test_sets["extra"])
    assert messages[0].startswith(
        f"--data.eval_max_tokens={budget} is below what {int((extra > budget).sum())} sentence "
        f"pairs of 'extra' need on their own (the longest: {int(extra.max())} tokens, {counted})"
    )
    assert messages[0].endswith(
        f"Raise --data.eval_max_tokens to at least {int(extra.max())} "
        "(held-out sentences are never dropped)."
    )
    predict = _costs(held_out.predict_set)
    assert len(predict) == len(lines)
    assert messages[1].startswith(
        f"--data.eval_max_tokens={budget} is below what {int((predict > budget).sum())} "
        f"sentences of {str(corpus / 'extra.de')!r} need on their own (the longest: "
        f"{int(predict.max())} tokens, counted as source + EOS)"
    )


def test_second_run_reuses_cache(corpus, cache, dm, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("re-tokenised although the cache holds this split")

    monkeypatch.setattr(Tokenizer, "encode", fail)
    monkeypatch.setattr(Tokenizer, "train", fail)
    again = _dm(corpus, cache)
    again.prepare_data()
    with pytest.warns(UserWarning, match="truncated"):
        again.setup()
    assert again.tokenized_splits == []
    assert len(again.train_set) == len(dm.train_set)


def _sharded(dm, world_size: int, make) -> list[list[list[int]]]:
    shards = []
    for rank in range(world_size):
        dm.trainer = SimpleNamespace(world_size=world_size, global_rank=rank, training=False)
        shards.append([b["index"].tolist() for b in make()])
    dm.trainer = None
    return shards


def test_ddp_sharding(dm):
    train = _sharded(dm, 2, dm.train_dataloader)
    assert len(train[0]) == len(train[1])
    flat = [i for shard in train for batch in shard for i in batch]
    assert sorted(flat) == list(range(2000))
    val = _sharded(dm, 2, dm.val_dataloader)
    flat = [i for shard in val for batch in shard for i in batch]
    assert sorted(flat) == list(range(201))


def test_state_dict_resumes_mid_epoch(corpus, cache, dm):
    full = [b["index"].tolist() for b in dm.train_dataloader()]
    loader = dm.train_dataloader()
    iterator = iter(loader)
    seen = [next(iterator)["index"].tolist() for _ in range(3)]
    state = dm.state_dict()
    assert state["train_sampler"]["batches_yielded"] == 3

    resumed = _dm(corpus, cache)
    resumed.setup("fit")
    resumed.load_state_dict(state)
    rest = [b["index"].tolist() for b in resumed.train_dataloader()]
    assert seen + rest == full


def test_num_workers(corpus, cache, dm):
    workers = _dm(corpus, cache, num_workers=1)
    with pytest.warns(UserWarning, match="truncated"):
        workers.setup("validate")
    got = [b["src"].tolist() for b in workers.val_dataloader()]
    assert got == [b["src"].tolist() for b in dm.val_dataloader()]


def test_predict_file_keeps_every_line(corpus, cache, tmp_path):
    lines = ["Ein Hund läuft.", "", "   ", "Zwei Männer."]
    path = tmp_path / "input.de"
    path.write_text("\n".join(lines) + "\n")
    dm = _dm(corpus, cache, predict_file=str(path))
    dm.setup("predict")
    batches = list(dm.predict_dataloader())
    got = {
        i: text for b in batches for i, text in zip(b["index"].tolist(), b["src_text"], strict=True)
    }
    assert got == dict(enumerate(lines))
    assert all("tgt_in" not in b for b in batches)


def test_errors_name_files_and_settings(corpus, cache, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for lang in ("de", "en"):
        (empty / f"train.{lang}").write_text("")
        (empty / f"val.{lang}").write_text("")
    with pytest.raises(
        ValueError, match=r"training split 'train' is empty: .*train\.de \+ .*train\.en"
    ):
        _dm(empty, tmp_path / "c1").prepare_data()

    dm = _dm(empty, tmp_path / "c2", tokenizer_path=str(cache / "missing.model"))
    dm.tokenizer = Tokenizer.load(next(cache.glob("spm_*.model")))
    with pytest.raises(ValueError, match=r"held-out split 'val' is empty: .*val\.de"):
        dm.setup("validate")

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.de").write_text("a\nb\n")
    (bad / "train.en").write_text("a\n")
    with pytest.raises(ValueError, match=r"train\.de has 2 lines but .*train\.en has 1 lines"):
        _dm(bad, tmp_path / "c3").prepare_data()

    junk = tmp_path / "junk.model"
    junk.write_bytes(b"\x00\x01 not a model")
    with pytest.raises(ValueError, match=r"junk\.model is not a valid SentencePiece model"):
        _dm(corpus, cache, tokenizer_path=str(junk)).setup("fit")

    model = next(cache.glob("spm_*.model"))
    with pytest.raises(ValueError, match=r"has 600 pieces but data\.vocab_size is 500"):
        _dm(corpus, cache, tokenizer_path=str(model), vocab_size=500).setup("fit")

    with pytest.raises(FileNotFoundError, match=r"split 'nosuch'"):
        _dm(corpus, cache, test_splits=["nosuch"]).setup("test")


class _Recorder(L.LightningModule):
    """A one-parameter model that records the example indices of each training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["index"].tolist())
        return (self.weight * batch["n_tokens"]).square().sum() * 1e-9

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_trainer_resume_mid_epoch(corpus, cache, tmp_path):
    def trainer(**kwargs) -> L.Trainer:
        return quiet_cpu_trainer(tmp_path, **kwargs)

    checkpoint = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1, filename="{step}"
    )
    first = _Recorder()
    trainer(callbacks=[checkpoint]).fit(first, datamodule=_dm(corpus, cache))
    resumed = _Recorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer().fit(
            resumed, datamodule=_dm(corpus, cache), ckpt_path=tmp_path / "ckpt/step=3.ckpt"
        )
    assert resumed.seen == first.seen[3:]
    # The data module restores the position, so Lightning's "not resumable" warning is silenced.
    assert not [w for w in caught if "not resumable" in str(w.message)]
    assert not [w for w in caught if "Resuming with" in str(w.message)]
    # Resumed with another token budget: other batches, and a warning naming both budgets.
    other = _Recorder()
    with pytest.warns(UserWarning, match=r"--data\.max_tokens=2048, .*--data\.max_tokens=1024"):
        trainer(max_steps=6).fit(
            other,
            datamodule=_dm(corpus, cache, max_tokens=2048),
            ckpt_path=tmp_path / "ckpt/step=3.ckpt",
        )
    assert other.seen != first.seen[3:6]


@pytest.mark.parametrize("overfit", [2, 0.05])
def test_overfit_batches_trains_on_the_same_batches_in_every_epoch(
    corpus, cache, tmp_path, overfit
):
    """Lightning's overfit_batches (a count or a fraction of the epoch's batches): Lightning
    turns off the shuffling of its own samplers only, so the data module repeats the first
    batches of its shuffled plan itself."""
    recorder = _Recorder()
    dm = _dm(corpus, cache)
    trainer = quiet_cpu_trainer(tmp_path, overfit_batches=overfit)  # 2 epochs
    trainer.fit(recorder, datamodule=dm)
    plan = [b["index"].tolist() for b in dm._loader(dm.train_set, dm._sampler("train", True))]
    per_epoch = overfit if overfit == 2 else int(overfit * len(plan))
    assert per_epoch > 1
    assert recorder.seen == plan[:per_epoch] * 2


@pytest.mark.filterwarnings("error:Resuming with:UserWarning")
def test_resume_with_other_batching_settings_warns_or_refuses(corpus, cache, dm):
    """The settings that decide the batches are saved with the sampler's position: resuming
    with another max_tokens, bucket_size, max_positions or max_length_ratio warns in one line
    naming the option and both values; another seed cannot continue the epoch and is refused,
    naming --data.seed and both values. Unchanged settings resume exactly, silently."""
    full = [b["index"].tolist() for b in dm.train_dataloader()]
    iterator = iter(dm.train_dataloader())
    seen = [next(iterator)["index"].tolist() for _ in range(3)]
    state = dm.state_dict()
    assert state["batching"] == {
        "streaming": False,
        "max_tokens": 1024,
        "bucket_size": None,
        "max_positions": MAX_POSITIONS,
        "max_length_ratio": 3.0,
        "seed": 1,
        "pairs": None,
        "pair_temperature": 1.0,
    }

    def resumed(**kwargs) -> TranslationDataModule:
        module = _dm(corpus, cache, **kwargs)
        module.setup("fit")
        return module

    same = resumed()
    same.load_state_dict(state)
    assert seen + [b["index"].tolist() for b in same.train_dataloader()] == full
    changes = {"max_tokens": 2048, "bucket_size": 50, "max_positions": 20, "max_length_ratio": 1.5}
    for name, value in changes.items():
        other = resumed(**{name: value})
        message = other_batching_warning(name, value, state["batching"][name])
        with pytest.warns(UserWarning, match=message):
            other.load_state_dict(state)
        rest = [b["index"].tolist() for b in other.train_dataloader()]
        assert seen + rest != full, name
    with pytest.raises(ValueError, match=r"--data\.seed=1, but this run has --data\.seed=7"):
        resumed(seed=7).load_state_dict(state)


@pytest.mark.parametrize(("option", "value"), [("max_tokens", 0), ("eval_max_tokens", -1)])
def test_token_budgets_below_one_are_refused_at_once(tmp_path, option, value):
    """Refused when the data module is built, before any corpus is read."""
    with pytest.raises(ValueError, match=f"data.{option} must be >= 1"):
        datamodule.TranslationDataModule(data_dir=str(tmp_path / "nothing"), **{option: value})


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("bucket_size", 0, r"data\.bucket_size must be >= 1 or null, got 0\."),
        ("vocab_size", 3, r"data\.vocab_size must be > 4, got 3: the vocabulary holds the 4 "),
        ("max_positions", 1, r"data\.max_positions must be >= 2, got 1"),
        ("max_length_ratio", 0.5, r"data\.max_length_ratio must be >= 1, got 0\.5\."),
        ("num_workers", -1, r"data\.num_workers must be >= 0, got -1\."),
        ("seed", -1, r"data\.seed must be >= 0, got -1\."),
        ("character_coverage", 0.5, r"data\.character_coverage must be in \[0\.98, 1\.0\]"),
    ],
)
def test_numeric_settings_out_of_range_are_refused_at_once(tmp_path, option, value, message):
    """Refused when the data module is built, not after SentencePiece training, tokenisation
    or the first loader (where the sampler, DataLoader or SentencePiece would refuse them)."""
    with pytest.raises(ValueError, match=f"^{message}"):
        datamodule.TranslationDataModule(data_dir=str(tmp_path / "nothing"), **{option: value})


def test_same_source_and_target_language_is_warned_about(tmp_path):
    """UserWarning: "--data.src_lang and --data.tgt_lang are both 'en': source and target are
    read from the same files ..."; the data module is still built."""
    with pytest.warns(UserWarning, match=r"--data\.src_lang and --data\.tgt_lang are both 'en'"):
        dm = datamodule.TranslationDataModule(
            data_dir=str(tmp_path / "nothing"), src_lang="en", tgt_lang="en"
        )
    assert dm.src_lang == dm.tgt_lang == "en"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        datamodule.TranslationDataModule(data_dir=str(tmp_path / "nothing"))  # de -> en


@pytest.mark.parametrize(
    ("own", "stage", "wanted"),
    [
        (False, "fit", []),  # train and val are there; the missing test set is not fit's
        (False, "test", ["test_2016_flickr.de.gz", "test_2016_flickr.en.gz"]),
        (False, None, ["test_2016_flickr.de.gz", "test_2016_flickr.en.gz"]),
        (True, "test", []),  # a corpus of one's own is never completed with Multi30k files
        (True, None, []),
    ],
)
def test_downloads_only_the_multi30k_splits_the_stage_reads(
    corpus, tmp_path, monkeypatch, own, stage, wanted
):
    """With download=True, a Multi30k folder (its own train files) lacking the test set gets
    the test files for ``test`` (or without a stage), not for ``fit``; a folder of one's own
    (other train files under the same names) gets nothing: the missing split is reported."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz"):
        source = corpus if own or name.startswith("val") else MULTI30K
        (folder / name).write_bytes((source / name).read_bytes())
    asked = []
    monkeypatch.setattr(multi30k, "download_multi30k", lambda d, files: asked.extend(files))
    dm = _dm(folder, tmp_path / "cache", download=True, tokenizer_path=None)
    if stage is not None:
        dm.trainer = SimpleNamespace(state=SimpleNamespace(fn=SimpleNamespace(value=stage)))
    dm._download_missing(training=stage != "test", stage=stage)
    assert asked == wanted


def test_both_directions_share_one_sentencepiece_model(corpus, tmp_path, caplog):
    """An en->de run reuses the joint model a de->en run trained on the same corpus (cached under
    the name and digest of the de-en reading), and the other way round."""
    cache = tmp_path / "cache"
    with caplog.at_level(logging.INFO):
        forward = _dm(corpus, cache, src_lang="en", tgt_lang="de")
        forward.prepare_data()
        assert caplog.text.count("Training a unigram SentencePiece model") == 1
        backward = _dm(corpus, cache)  # de -> en
        backward.prepare_data()
        assert caplog.text.count("Training a unigram SentencePiece model") == 1
    models = sorted(p.name for p in cache.glob("*.model"))
    assert len(models) == 1 and models[0].startswith("spm_deen_unigram_600_")
    forward.setup("fit")
    backward.setup("fit")
    assert forward.tokenizer.to_bytes() == backward.tokenizer.to_bytes()
    # The tokenised splits are per direction: source and target swapped.
    assert forward.train_set[0]["src"][:-1] == backward.train_set[0]["tgt"]


@pytest.mark.parametrize(("src_lang", "wanted"), [("fr", ["train.fr.gz", "val.fr.gz"]), ("it", [])])
def test_no_download_is_announced_for_files_that_are_there(tmp_path, monkeypatch, src_lang, wanted):
    """--data.src_lang fr on a de-en Multi30k folder: the English files are there (gzipped),
    so only the French ones are fetched; Italian has no Multi30k files: nothing to fetch, so no
    "Downloading" line (setup then names the missing file)."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz"):
        (folder / name).write_bytes((MULTI30K / name).read_bytes())
    asked = []
    monkeypatch.setattr(multi30k, "download_multi30k", lambda d, files: asked.extend(files))
    dm = _dm(folder, tmp_path / "cache", download=True, tokenizer_path=None, src_lang=src_lang)
    dm._download_missing(training=True, stage="fit")
    assert asked == wanted


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            {"vocab_size": VOCAB + 100},
            f"model's vocab_size is {VOCAB + 100} but the data module's ",
        ),
        ({"vocab_size": VOCAB, "max_positions": 64}, "model's max_positions is 64 but the data "),
    ],
)
def test_fit_of_a_model_that_the_data_does_not_fit_fails_before_sentencepiece(
    corpus, tmp_path, model, message
):
    """From Python the model's and the data module's vocab_size and max_positions are set
    apart: a mismatch is refused before SentencePiece is trained, naming both values."""
    from conftest import quiet_cpu_trainer, tiny_model

    trainer = quiet_cpu_trainer(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match=message):
        trainer.fit(tiny_model(**model), datamodule=_dm(corpus, tmp_path / "cache"))
    assert not list((tmp_path / "cache").glob("**/*.model"))
