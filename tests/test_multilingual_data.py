"""Tests of multilingual runs in the data module (``data.pairs``): pairs, pair folders, tags,
the training set over every pair, held-out keys, resume; a bilingual run is unchanged."""

from __future__ import annotations

import hashlib
import logging
import re
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from conftest import MULTI30K, multi30k_lines, write_lines  # MULTI30K: the shared copy
from torch.utils.data import DataLoader

from seq2seq.data.batching import temperature_probs
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.pairs import parse_pairs
from seq2seq.data.token_cache import CACHE_VERSION
from seq2seq.data.tokenizer import EOS_ID

# Held-out sentences above max_positions are truncated with a warning; none is tested here.
pytestmark = pytest.mark.filterwarnings("ignore:.*truncated \\(never dropped\\):UserWarning")

VOCAB = 300
LANGS = ("de", "en", "fr")
SIZES = {"train": 300, "val": 20, "test_2016_flickr": 20}


def _slice(folder: Path, langs, sizes: dict[str, int], start: int = 0) -> Path:
    """Lines ``start .. start + n`` of each Multi30k split ``{split: n}`` in ``langs``."""
    for split, n in sizes.items():
        source = "val" if split == "test_b" else split
        for lang in langs:
            lines = multi30k_lines(source, lang, start + n, MULTI30K)[start:]
            write_lines(folder / f"{split}.{lang}", lines)
    return folder


@pytest.fixture(scope="module")
def parallel(tmp_path_factory) -> Path:
    """One folder of multi-parallel files: ``train.{de,en,fr}`` ..., and a test set ``test_b``."""
    return _slice(tmp_path_factory.mktemp("parallel"), LANGS, {**SIZES, "test_b": 10})


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    """A folder per pair, of other lines each: ``de-en/`` (300 training pairs) and ``fr-en/``
    (100), the latter read for the pair en-fr too."""
    root = tmp_path_factory.mktemp("folders")
    _slice(root / "de-en", ("de", "en"), SIZES)
    _slice(root / "fr-en", ("fr", "en"), {**SIZES, "train": 100}, start=400)
    return root


def _dm(data: Path, cache: Path, **kwargs) -> TranslationDataModule:
    settings = dict(
        data_dir=str(data), cache_dir=str(cache), vocab_size=VOCAB, max_positions=64,
        max_tokens=400, download=False,
    )  # fmt: skip
    return TranslationDataModule(**{**settings, **kwargs})


def _ready(dm: TranslationDataModule, stage: str | None = None) -> TranslationDataModule:
    dm.prepare_data()
    dm.setup(stage)
    return dm


@pytest.fixture(scope="module")
def one_to_many(parallel, tmp_path_factory) -> TranslationDataModule:
    """en-de and en-fr from the multi-parallel folder: two target languages, so tags."""
    cache = tmp_path_factory.mktemp("cache")
    dm = _dm(parallel, cache, pairs=["en-de", "en-fr"], test_splits=["test_2016_flickr", "test_b"])
    return _ready(dm)


def _tag(tokenizer, lang: str) -> int:
    (tag,), target = tokenizer.language_prefix(tgt_lang=lang)
    assert target == []
    return tag


# ---------------------------------------------------------------------- settings
def test_pairs_are_parsed_and_bad_ones_refused_naming_the_setting(tmp_path):
    assert parse_pairs(["de-en", "fr-en", "en-de"]) == [("de", "en"), ("fr", "en"), ("en", "de")]
    assert parse_pairs(None) == []
    bad = {
        "de_en": "is not a pair",
        "de-en-fr": "is not a pair",
        "-en": "is not a pair",
        "de -en": "is not a pair",
        "en-en": "has the same language on both sides",
    }
    for entry, message in bad.items():
        with pytest.raises(ValueError, match=rf"^data\.pairs entry '{re.escape(entry)}' {message}"):
            _dm(tmp_path, tmp_path, pairs=["de-en", entry])
    with pytest.raises(ValueError, match=r"^data\.pairs lists 'de-en' twice\.$"):
        _dm(tmp_path, tmp_path, pairs=["de-en", "fr-en", "de-en"])
    with pytest.raises(ValueError, match=r"^data\.pairs is empty"):
        _dm(tmp_path, tmp_path, pairs=[])
    with pytest.raises(ValueError, match=r"^data\.pairs must be a list"):
        _dm(tmp_path, tmp_path, pairs="de-en")
    for temperature in (0, -1.0):
        with pytest.raises(
            ValueError, match=rf"^data\.pair_temperature must be > 0, got {temperature}"
        ):
            _dm(tmp_path, tmp_path, pairs=["de-en", "fr-en"], pair_temperature=temperature)
    with pytest.raises(ValueError, match=r"^data\.hf_config 'de-en' holds one language pair"):
        _dm(tmp_path, tmp_path, pairs=["de-en", "fr-en"], hf_dataset="x", hf_config="de-en")
    # One pair is a bilingual run, its languages taken from the pair; streaming allowed.
    one = _dm(tmp_path, tmp_path, pairs=["en-fr"], streaming=True)
    assert (one.src_lang, one.tgt_lang, one.pairs, one.multilingual) == ("en", "fr", None, False)
    assert one.pair_names == ["en-fr"] and one.language_pairs == [("en", "fr")]
    several = _dm(tmp_path, tmp_path, pairs=["de-en", "fr-en"], pair_temperature=5.0)
    assert several.pairs == ["de-en", "fr-en"] and several.pair_temperature == 5.0
    assert several.language_pairs == [("de", "en"), ("fr", "en")]


def test_heldout_keys_and_target_languages(tmp_path):
    dm = _dm(tmp_path, tmp_path, pairs=["en-de", "en-fr"], test_splits=["t1", "t2"])
    assert dm.heldout_keys("validate") == dm.heldout_keys("fit") == ["val/en-de", "val/en-fr"]
    assert dm.heldout_keys("test") == [
        "test/en-de/t1",
        "test/en-de/t2",
        "test/en-fr/t1",
        "test/en-fr/t2",
    ]
    assert [dm.heldout_tgt_lang(k) for k in dm.heldout_keys("test")] == ["de", "de", "fr", "fr"]
    assert dm.heldout_tgt_lang("val/en-fr") == "fr"
    with pytest.raises(KeyError, match="val/de-en"):
        dm.heldout_tgt_lang("val/de-en")
    bilingual = _dm(tmp_path, tmp_path, src_lang="de", tgt_lang="fr", test_splits=["t1", "t2"])
    assert bilingual.heldout_keys("validate") == ["val"]
    assert bilingual.heldout_keys("test") == ["test/t1", "test/t2"]
    assert bilingual.heldout_tgt_lang("val") == bilingual.heldout_tgt_lang("test/t2") == "fr"
    assert bilingual.pair_names == ["de-fr"]


# ---------------------------------------------------------------------- tags and pairs
def test_sources_start_with_the_target_tag_with_two_target_languages(one_to_many, parallel):
    dm = one_to_many
    tokenizer = dm.tokenizer
    assert tuple(tokenizer.languages) == ("de", "fr")
    tags = {"de": _tag(tokenizer, "de"), "fr": _tag(tokenizer, "fr")}
    english = multi30k_lines("val", "en", SIZES["val"])
    for key, lang in (("val/en-de", "de"), ("val/en-fr", "fr")):
        dataset = dm.heldout_dataset(key)
        assert dataset is dm.val_sets[key] and len(dataset) == SIZES["val"]
        for i in range(len(dataset)):
            example = dataset[i]
            assert example["src"][0] == tags[lang], key
            assert not set(example["tgt"]) & set(tags.values())  # targets carry no tag
            assert example["src_text"] == english[example["index"]]
        # the tag comes first, then the pieces of the text, as the tokenizer encodes it
        first = dataset[0]
        plain = tokenizer.encode([first["src_text"]], tgt_lang=lang)[0]
        assert first["src"][:-1] == plain[: len(first["src"]) - 1]
    # one loader per pair, each batch naming its pair
    loaders = dm.val_dataloader()
    assert isinstance(loaders, list) and len(loaders) == 2
    for index, loader in enumerate(loaders):
        batches = list(loader)
        assert all((b["pair"] == index).all() for b in batches)
        assert sum(len(b["index"]) for b in batches) == SIZES["val"]
    # test loaders pair-major: en-de x (test_2016_flickr, test_b), then en-fr
    sizes = [sum(len(b["index"]) for b in loader) for loader in dm.test_dataloader()]
    assert sizes == [20, 10, 20, 10]
    assert sorted(dm.test_sets) == sorted(k.removeprefix("test/") for k in dm.heldout_keys("test"))


def test_training_batches_hold_both_pairs_with_their_tags(one_to_many, parallel):
    dm = one_to_many
    tags = [_tag(dm.tokenizer, "de"), _tag(dm.tokenizer, "fr")]
    batches = list(dm.train_dataloader())
    pairs = torch.cat([b["pair"] for b in batches])
    assert set(pairs.tolist()) == {0, 1}
    assert len(pairs) == len(dm.train_set)  # an epoch draws as many examples as there are
    for batch in batches:
        assert torch.equal(batch["src"][:, 0], torch.tensor(tags)[batch["pair"]])
    assert (pairs == 0).sum() > 0.3 * len(pairs) and (pairs == 1).sum() > 0.3 * len(pairs)
    # re-segmented on every access (subword regularisation), sources keep their tag
    sampled = _dm(parallel, dm.cache_dir, pairs=["en-de", "en-fr"], subword_alpha=0.5)
    sampled.setup("fit")
    batch = next(iter(sampled.train_dataloader()))
    assert torch.equal(batch["src"][:, 0], torch.tensor(tags)[batch["pair"]])


def test_many_to_one_has_no_tags_and_one_joint_model(parallel, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        dm = _ready(_dm(parallel, tmp_path, pairs=["de-en", "fr-en"]), "fit")
    assert tuple(dm.tokenizer.languages) == ()
    (model,) = tmp_path.glob("spm_*.model")
    assert re.fullmatch(rf"spm_deenfr_unigram_{VOCAB}_[0-9a-f]+\.model", model.name)
    for key, lang in (("val/de-en", "de"), ("val/fr-en", "fr")):
        dataset = dm.val_sets[key]
        text = multi30k_lines("val", lang, SIZES["val"])
        assert [dataset[i]["src"][:-1] for i in range(3)] == dm.tokenizer.encode(text[:3])
    # each pair's filtered training set, one log line of the pairs and their probabilities
    counts = [len(d) for d in dm.train_set.datasets]
    probs = temperature_probs(counts, 1.0)
    assert f"de-en {counts[0]} pairs (p={probs[0]:.3f}), fr-en {counts[1]} pairs" in caplog.text
    names = sorted(p.name.rsplit("_", 1)[0] for p in (tmp_path / "tokenized").iterdir())
    splits = ("test_2016_flickr", "train", "val")
    assert names == [f"{split}_{pair}" for split in splits for pair in ("deen", "fren")]


def test_a_folder_per_pair_is_read_in_either_orientation(folders, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        dm = _ready(_dm(folders, tmp_path, pairs=["de-en", "en-fr"], pair_temperature=2.0), "fit")
    assert tuple(dm.tokenizer.languages) == ("en", "fr")  # targets en and fr: tagged
    for key, src, ref, start in (
        ("val/de-en", "de", "en", 0),
        ("val/en-fr", "en", "fr", 400),
    ):
        dataset = dm.val_sets[key]
        assert dataset[0]["src_text"] == multi30k_lines("val", src, start + 1)[start]
        assert dataset[0]["ref_text"] == multi30k_lines("val", ref, start + 1)[start]
    counts = [len(d) for d in dm.train_set.datasets]
    assert counts[1] <= 100 < counts[0]
    probs = temperature_probs(counts, 2.0)
    assert np.allclose(dm.train_set.probs, probs) and probs[0] > 0.5
    assert f"de-en {counts[0]} pairs (p={probs[0]:.3f})" in caplog.text
    assert "data.pair_temperature=2.0" in caplog.text


def test_a_missing_pair_is_named_before_tokenising(folders, tmp_path):
    dm = _dm(folders, tmp_path, pairs=["de-en", "cs-en"])
    dm.trainer = SimpleNamespace(state=SimpleNamespace(fn=SimpleNamespace(value="fit")))
    with pytest.raises(FileNotFoundError, match="No cs-en data for split 'train'") as info:
        dm.prepare_data()
    assert not list(tmp_path.glob("spm_*.model"))
    assert str(info.value).endswith(f"Nor is there a pair folder {folders / 'cs-en'} or en-cs.")
    # a pair folder spelt otherwise is named
    dm = _dm(folders, tmp_path, pairs=["de-en", "fr-em"])
    dm.trainer = SimpleNamespace(state=SimpleNamespace(fn=SimpleNamespace(value="fit")))
    with pytest.raises(FileNotFoundError, match=r"\(did you mean .*fr-en\?\)\.$"):
        dm.prepare_data()


def test_predict_translates_into_data_tgt_lang(one_to_many, parallel, tmp_path):
    lines = multi30k_lines("val", "en", 5, MULTI30K)
    predict_file = write_lines(tmp_path / "input.en", lines)
    settings = dict(pairs=["en-de", "en-fr"], predict_file=str(predict_file), src_lang="en")
    dm = _dm(parallel, one_to_many.cache_dir, tgt_lang="fr", **settings)
    # data.tgt_lang has a default ("en"): the direction taken is said
    with pytest.warns(UserWarning, match=r"into de, fr; predict translates en->fr \(data\.src"):
        dm.setup("predict")
    fr = _tag(dm.tokenizer, "fr")
    assert [dm.predict_set[i]["src"] for i in range(5)] == [
        [fr, *ids, EOS_ID] for ids in dm.tokenizer.encode(lines)
    ]
    # a language without a tag is refused, naming the model's languages
    with pytest.raises(ValueError, match="de, fr"):
        _dm(parallel, one_to_many.cache_dir, tgt_lang="en", **settings).setup("predict")


def test_multi30k_download_fetches_every_language_of_the_pairs(tmp_path, monkeypatch):
    """A Multi30k folder holding German and English gets the French files a fr-en pair needs
    (and a test set for ``test``), each file asked for once."""
    from seq2seq.data import multi30k

    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz"):
        (folder / name).write_bytes((MULTI30K / name).read_bytes())
    asked = []

    def download(data_dir: Path, files: list[str]) -> None:  # the shared copy, no network
        asked.extend(files)
        for name in files:
            (Path(data_dir) / name).write_bytes((MULTI30K / name).read_bytes())

    monkeypatch.setattr(multi30k, "download_multi30k", download)
    dm = _dm(folder, tmp_path / "cache", download=True, pairs=["de-en", "fr-en"])
    dm._download_missing(training=True, stage="fit")
    assert asked == ["train.fr.gz", "val.fr.gz"]
    asked.clear()
    dm._download_missing(training=False, stage="test")
    assert asked == [f"test_2016_flickr.{lang}.gz" for lang in ("de", "en", "fr")]
    # an empty folder: one download asks for every pair's files, so that a failure (no
    # network) names them all at once
    calls = []
    monkeypatch.setattr(multi30k, "download_multi30k", lambda _, files: calls.append(files))
    (tmp_path / "empty").mkdir()
    dm = _dm(tmp_path / "empty", tmp_path / "cache2", download=True, pairs=["de-en", "fr-en"])
    dm._download_missing(training=True, stage="fit")
    assert len(calls) == 1 and sorted(calls[0]) == [
        f"{split}.{lang}.gz" for split in ("train", "val") for lang in LANGS
    ], calls


def test_a_saved_dataset_serves_every_pair_with_its_fields(tmp_path):
    """With data.hf_dataset every pair reads the same dataset, its languages as fields."""
    import datasets

    def split(name: str, n: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {lang: multi30k_lines(name, lang, n, MULTI30K) for lang in LANGS}
        )

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": split("train", 200), "val": split("val", 10)}).save_to_disk(
        str(saved)
    )
    settings = dict(hf_dataset=str(saved), test_splits=[], pairs=["de-en", "fr-en"])
    dm = _ready(_dm(tmp_path, tmp_path / "cache", **settings), "fit")
    for key, src in (("val/de-en", "de"), ("val/fr-en", "fr")):
        example = dm.val_sets[key][3]
        assert example["src_text"] == multi30k_lines("val", src, 4, MULTI30K)[3]
        assert example["ref_text"] == multi30k_lines("val", "en", 4, MULTI30K)[3]
    sizes = [len(d) for d in dm.train_set.datasets]
    assert len(dm.train_set) == sum(sizes) and all(150 < n <= 200 for n in sizes)


def test_a_given_model_without_the_target_tags_is_refused(parallel, tmp_path):
    untagged = _ready(_dm(parallel, tmp_path, pairs=["de-en", "fr-en"]), "validate")
    (model,) = tmp_path.glob("spm_*.model")
    dm = _dm(parallel, tmp_path, pairs=["en-de", "en-fr"], tokenizer_path=str(model))
    message = rf"^data\.pairs translate into de, fr, but data\.tokenizer_path {model} has no tag"
    with pytest.raises(ValueError, match=message):
        dm.prepare_data()
    dm.tokenizer = untagged.tokenizer  # as a checkpoint's tokenizer is given
    with pytest.raises(ValueError, match="but the checkpoint's tokenizer has no tag for de, fr"):
        dm.setup("fit")


# ---------------------------------------------------------------------- bilingual
def _first_batches(dm: TranslationDataModule, n: int = 3) -> list[dict]:
    return [b for _, b in zip(range(n), dm.train_dataloader(), strict=False)]


def test_a_bilingual_run_is_unchanged_and_one_pair_is_bilingual(parallel, tmp_path):
    plain = _ready(_dm(parallel, tmp_path / "plain"), "fit")
    one = _ready(_dm(parallel, tmp_path / "one", pairs=["de-en"]), "fit")
    # the same SentencePiece model, under the bilingual name
    (a,), (b,) = (tmp_path / "plain").glob("spm_*.model"), (tmp_path / "one").glob("spm_*.model")
    assert a.name == b.name and re.fullmatch(
        rf"spm_deen_unigram_{VOCAB}_[0-9a-f]{{12}}\.model", a.name
    )
    assert a.read_bytes() == b.read_bytes()
    # cache folders keyed as they always were: version, corpus fingerprint, model bytes
    model = hashlib.sha256(plain.tokenizer.to_bytes()).digest()
    expected = set()
    for split in ("train", "val", "test_2016_flickr"):
        fingerprint = plain._locate(split).fingerprint()
        key = hashlib.sha256(f"{CACHE_VERSION}|{fingerprint}|".encode() + model).hexdigest()[:16]
        expected.add(f"{split}_deen_{key}")
    for run in ("plain", "one"):
        assert {p.name for p in (tmp_path / run / "tokenized").iterdir()} == expected
    # the same batches, without a pair index; one validation loader; bilingual keys
    for x, y in zip(_first_batches(plain), _first_batches(one), strict=True):
        assert "pair" not in x and x.keys() == y.keys()
        assert all(torch.equal(x[k], y[k]) for k in ("index", "src", "tgt_in", "tgt_out"))
    assert isinstance(one.val_dataloader(), DataLoader)
    assert one.heldout_keys("validate") == ["val"] and one.heldout_tgt_lang("val") == "en"
    assert "pair" not in one.val_set[0] and one.hparams.pairs == ["de-en"]
    assert one.state_dict()["batching"] == plain.state_dict()["batching"]


# ---------------------------------------------------------------------- resume
def test_state_dict_mid_epoch_resumes_the_remaining_batches(one_to_many, parallel):
    dm = one_to_many
    full = [(b["pair"].tolist(), b["index"].tolist()) for b in dm.train_dataloader()]
    iterator = iter(dm.train_dataloader())
    seen = [next(iterator) for _ in range(3)]
    seen = [(b["pair"].tolist(), b["index"].tolist()) for b in seen]
    state = dm.state_dict()
    assert state["train_sampler"]["batches_yielded"] == 3
    assert state["batching"]["pairs"] == ["en-de", "en-fr"]
    assert state["batching"]["pair_temperature"] == 1.0

    cache = Path(dm.cache_dir)
    resumed = _dm(
        parallel, cache, pairs=["en-de", "en-fr"], test_splits=["test_2016_flickr", "test_b"]
    )
    resumed.setup("fit")
    resumed.load_state_dict(state)
    loader = resumed.train_dataloader()
    rest = [(b["pair"].tolist(), b["index"].tolist()) for b in loader]
    assert seen + rest == full
    # the next pass is the next epoch: other draws of each pair's examples
    again = [(b["pair"].tolist(), b["index"].tolist()) for b in loader]
    assert sorted(again) != sorted(full)
    # other pairs (their order too) are refused, another temperature is warned about
    with pytest.raises(ValueError, match=r"--data\.pairs=\[en-de, en-fr\]"):
        _dm(parallel, cache, pairs=["en-fr", "en-de"]).load_state_dict(state)
    with pytest.warns(UserWarning, match=r"--data\.pair_temperature=5\.0, but the checkpoint"):
        _dm(parallel, cache, pairs=["en-de", "en-fr"], pair_temperature=5.0).load_state_dict(state)


# ---------------------------------------------------------------------- training
@pytest.mark.slow  # three runs of a tiny model, one killed: ~20 s each on one core
@pytest.mark.parametrize(
    ("pairs", "validate", "streaming"),
    # All validate every pair: a tagged model (one-to-many), an untagged one (many-to-one),
    # and a tagged one whose pairs are streamed.
    [
        (["en-de", "en-fr"], True, False),
        (["de-en", "fr-en"], True, False),
        (["en-de", "en-fr"], True, True),
    ],  # fmt: skip
    ids=["one-to-many", "many-to-one", "streamed"],
)
def test_sigkill_mid_epoch_then_resume_matches_uninterrupted_multilingual_run(
    tmp_path, pairs, validate, streaming
):
    from test_resume import CKPT_EVERY, KILL_AT, MAX_STEPS, _config, _fit, _logged

    from seq2seq.checkpoint import load_checkpoint

    data = _slice(tmp_path / "data", LANGS, {"train": 600, "val": 20})

    def config(name: str, kill_at: int | None = None) -> Path:
        path = _config(tmp_path, data, name, kill_at=kill_at)
        settings = yaml.safe_load(path.read_text())
        settings["data"].update(pairs=pairs, pair_temperature=2.0, streaming=streaming)
        if streaming:  # pools of 100: several pools per epoch, resumed mid-pool
            settings["data"]["stream_pool_size"] = 100
        settings["trainer"]["limit_val_batches"] = 1 if validate else 0
        path.write_text(yaml.safe_dump(settings))
        return path

    reference = _fit(config("reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    killed = _fit(config("resumed", kill_at=KILL_AT))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    start = load_checkpoint(last)["global_step"]
    assert start == KILL_AT // CKPT_EVERY * CKPT_EVERY
    resumed = _fit(config("resumed"), "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    expected = _logged(tmp_path / "reference", "train/loss")
    got = _logged(tmp_path / "resumed", "train/loss")
    assert sorted(expected) == list(range(MAX_STEPS))
    assert {s: got[s] for s in range(start, MAX_STEPS)} == {
        s: expected[s] for s in range(start, MAX_STEPS)
    }
    final = load_checkpoint(last)
    reference_final = load_checkpoint(tmp_path / "reference" / "checkpoints" / "last.ckpt")
    assert final["global_step"] == reference_final["global_step"] == MAX_STEPS
    for key, value in reference_final["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key
    if validate:  # every pair scored at steps 5 and 10; the resumed run's step 10 the same
        for name in [*(f"val/{pair}/loss" for pair in pairs), "val/loss", "val/bleu"]:
            scores = _logged(tmp_path / "reference", name)
            assert sorted(scores) == [4, 9], name
            assert _logged(tmp_path / "resumed", name, last_version=True) == {9: scores[9]}


def test_validation_sets_of_other_sizes_are_each_read_whole(tmp_path):
    """Each pair's validation loader batches its own set: 30 de-en and 10 fr-en pairs give 30
    and 10 examples (with one set of lengths for both, the first loader drew 10 of its 30)."""
    _slice(tmp_path / "de-en", ("de", "en"), {"train": 300, "val": 30})
    _slice(tmp_path / "fr-en", ("fr", "en"), {"train": 100, "val": 10}, start=400)
    dm = _ready(_dm(tmp_path, tmp_path / "cache", pairs=["de-en", "fr-en"], test_splits=[]), "fit")
    drawn = [sorted(i for batch in loader for i in batch["index"].tolist())
             for loader in dm.val_dataloader()]  # fmt: skip
    assert drawn == [list(range(30)), list(range(10))]
