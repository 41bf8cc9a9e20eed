"""Catalogue of bad inputs: each case is a small input and what the user sees.

Every test drives the user-facing path (the data module, the command line or the Python
API) and matches on the message that names the file, line or setting at fault, or checks
the documented handling (dropped and counted, kept, truncated with a warning).
"""

from __future__ import annotations

import errno
import io
import logging
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import multi30k_lines, tiny_config, write_corpus, write_lines

from seq2seq.checkpoint import load_checkpoint
from seq2seq.cli import cli_main
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.module import TranslationModule
from seq2seq.translator import Translator

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
VOCAB = 200


# ---------------------------------------------------------------------- helpers
def _write(folder: Path, name: str, lines: list[str]) -> Path:
    return write_lines(folder / name, lines)


@pytest.fixture(scope="module")
def pairs(multi30k_dir) -> dict[str, tuple[list[str], list[str]]]:
    """Real Multi30k lines: 300 training pairs, 10 validation and 10 test pairs."""
    sizes = {"train": 300, "val": 10, "test_2016_flickr": 10}
    return {
        split: (
            multi30k_lines(split, "de", n, multi30k_dir),
            multi30k_lines(split, "en", n, multi30k_dir),
        )
        for split, n in sizes.items()
    }


@pytest.fixture(scope="module")
def spm_file(pairs, train_spm) -> Path:
    """A SentencePiece model of VOCAB pieces trained on the 300 training pairs."""
    return train_spm(pairs["train"][0] + pairs["train"][1], VOCAB)


def _corpus(folder: Path, pairs, **replace: tuple[list[str], list[str]]) -> Path:
    """Writes train/val/test_2016_flickr text files, with some splits replaced."""
    return write_corpus(folder, {**pairs, **replace})


def _datamodule(data_dir: Path, spm_file: Path | None, **kwargs) -> TranslationDataModule:
    settings = dict(
        data_dir=str(data_dir),
        cache_dir=str(data_dir / "cache"),
        tokenizer_path=None if spm_file is None else str(spm_file),
        vocab_size=VOCAB,
        max_positions=256,
        max_tokens=1024,
        download=False,
    )
    return TranslationDataModule(**{**settings, **kwargs})


def _fit_config(tmp_path: Path, data_dir: Path, **trainer) -> Path:
    """A tiny fit config in ``tmp_path`` (few steps, checkpoints every 2 steps)."""
    settings = dict(
        max_steps=4,
        limit_val_batches=0,
        callbacks=[
            {
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {
                    "dirpath": str(tmp_path / "checkpoints"),
                    "every_n_train_steps": 2,
                    "save_top_k": 0,
                    "save_last": True,
                },
            }
        ],
        logger={
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(tmp_path / "logs")},
        },
    )
    data = dict(
        data_dir=str(data_dir),
        cache_dir=str(tmp_path / "cache"),
        vocab_size=VOCAB,
        max_tokens=400,
        download=False,
    )
    return tiny_config(tmp_path / "fit.yaml", trainer={**settings, **trainer}, data=data)


@pytest.fixture(scope="module")
def trained(pairs, tmp_path_factory) -> Path:
    """Folder of a 2-step tiny run: ``fit.yaml``, ``checkpoints/last.ckpt``, the corpus."""
    folder = tmp_path_factory.mktemp("trained")
    data = _corpus(folder / "data", pairs)
    config = _fit_config(folder, data, max_steps=2)
    cli_main(["fit", "--config", str(config)])
    assert (folder / "checkpoints" / "last.ckpt").is_file()
    return folder


# ---------------------------------------------------------------------- corpus files
def test_misaligned_line_counts(tmp_path, pairs, spm_file):
    """ValueError: 'Parallel files are misaligned: .../train.de has 300 lines but
    .../train.en has 299 lines'."""
    src, tgt = pairs["train"]
    data = _corpus(tmp_path, pairs, train=(src, tgt[:-1]))
    with pytest.raises(ValueError, match=r"misaligned: .*train\.de has 300 lines but .*train\.en"):
        _datamodule(data, spm_file).prepare_data()


@pytest.mark.parametrize("short", ["src", "tgt"])
def test_misaligned_corpus_is_reported_before_sentencepiece_training_is_announced(
    tmp_path, pairs, caplog, monkeypatch, short
):
    """Without a SentencePiece model, the misalignment (at the very end of files longer than
    one chunk of reading) is the error, and no "Training a unigram SentencePiece model ..."
    line comes before it."""
    from seq2seq.data import datamodule

    monkeypatch.setattr(datamodule, "ENCODE_CHUNK", 50)  # the 300 pairs are 6 chunks
    src, tgt = pairs["train"]
    train = (src[:-1], tgt) if short == "src" else (src, tgt[:-1])
    data = _corpus(tmp_path / "data", pairs, train=train)
    caplog.set_level(logging.INFO)
    with pytest.raises(
        ValueError, match=r"misaligned: .*train\.de has \d+ lines but .*train\.en has \d+ lines"
    ):
        _datamodule(data, None, cache_dir=str(tmp_path / "cache")).prepare_data()
    assert "SentencePiece" not in caplog.text
    assert not list((tmp_path / "cache").glob("*.model"))


def _fit_with_first_target(tmp_path, pairs, spm_file, caplog, first_target: str):
    """Set up a fit whose first training target is replaced, logging at INFO."""
    src, tgt = pairs["train"]
    data = _corpus(tmp_path, pairs, train=(src, [first_target] + tgt[1:]))
    dm = _datamodule(data, spm_file)
    caplog.set_level(logging.INFO)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_empty_line_in_training_pair_is_dropped_and_counted(tmp_path, pairs, spm_file, caplog):
    """The pair is dropped; the log says 'kept 299 of 300; dropped 1 with an empty side'."""
    assert len(_fit_with_first_target(tmp_path, pairs, spm_file, caplog, "").train_set) == 299
    assert "kept 299 of 300; dropped 1 with an empty side" in caplog.text


def test_empty_line_in_heldout_pair_is_kept(tmp_path, pairs, spm_file):
    """Held-out sets are never filtered: the pair with an empty side is translated and scored,
    with a warning naming it (UserWarning: "1 reference sentence of 'val' is empty (number 4);
    it is scored with the others: are the files aligned?"), the plural for more."""
    src, tgt = pairs["val"]
    data = _corpus(tmp_path, pairs, val=(src, tgt[:3] + [""] + tgt[4:]))
    dm = _datamodule(data, spm_file)
    dm.prepare_data()
    with pytest.warns(UserWarning, match=r"1 reference sentence of 'val' is empty \(number 4\);"):
        dm.setup("validate")
    assert len(dm.val_set) == 10
    assert dm.val_set[3]["ref_text"] == ""
    data = _corpus(tmp_path / "b", pairs, val=(["", src[1], "", *src[3:6], "", "", "", ""], tgt))
    dm = _datamodule(data, spm_file)
    dm.prepare_data()
    many = r"6 source sentences of 'val' are empty \(numbers 1, 3, 7, 8, 9 and 1 more\)"
    with pytest.warns(UserWarning, match=many):
        dm.setup("validate")


def test_invalid_utf8(tmp_path, pairs, spm_file):
    """ValueError: '.../train.en, line 3: invalid UTF-8 (invalid start byte at byte 5 ...)'."""
    data = _corpus(tmp_path, pairs)
    lines = (data / "train.en").read_bytes().split(b"\n")
    lines[2] = lines[2][:4] + b"\xff" + lines[2][4:]
    (data / "train.en").write_bytes(b"\n".join(lines))
    with pytest.raises(
        ValueError,
        match=r"train\.en, line 3: invalid UTF-8 \(.* at byte 5 of the line, counting from 1\)",
    ):
        _datamodule(data, spm_file).prepare_data()


def test_missing_file(tmp_path, pairs, spm_file):
    """FileNotFoundError: "No 'en' file for split 'train': looked for .../train.en and
    .../train.en.gz"."""
    data = _corpus(tmp_path, pairs)
    (data / "train.en").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"'en' file for split 'train': looked for .*train\.en"
    ):
        _datamodule(data, spm_file).prepare_data()


@pytest.mark.parametrize(
    ("lang", "hint"), [("ge", ""), ("DE", r" \(did you mean 'de'\?\)"), ("Fr", "")]
)
def test_a_misspelt_language_is_named_with_the_languages_of_the_split(
    tmp_path, pairs, spm_file, lang, hint
):
    """The error lists the split's languages, and names the lower-case code when only the
    case is wrong."""
    data = _corpus(tmp_path, pairs)
    dm = _datamodule(data, spm_file, src_lang=lang)
    dm.trainer = SimpleNamespace(state=SimpleNamespace(fn=SimpleNamespace(value="fit")))
    with pytest.raises(  # the training split's, before the held-out splits of fit
        FileNotFoundError,
        match=rf"No '{lang}' file for split 'train': looked for .*; the folder has 'train' in: "
        rf"de, en{hint}$",
    ):
        dm.prepare_data()


@pytest.mark.parametrize(
    ("split", "stage"), [("val", "fit"), ("val", "validate"), ("test_2016_flickr", "test")]
)
def test_missing_heldout_split_is_named_before_sentencepiece_is_trained(
    tmp_path, pairs, split, stage
):
    """FileNotFoundError: "No 'de' file for split 'val': looked for .../val.de and
    .../val.de.gz", raised for the split the stage reads before SentencePiece is trained on the
    training split (nothing is written to the cache)."""
    data = _corpus(tmp_path / "data", pairs)
    (data / f"{split}.de").unlink()
    dm = _datamodule(data, None, cache_dir=str(tmp_path / "cache"))
    dm.trainer = SimpleNamespace(state=SimpleNamespace(fn=SimpleNamespace(value=stage)))
    with pytest.raises(FileNotFoundError, match=rf"'de' file for split '{split}': looked for"):
        dm.prepare_data()
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("split", ["val", "test_2016_flickr"])
def test_misaligned_heldout_files_are_named_before_sentencepiece_is_trained(
    tmp_path, pairs, caplog, split
):
    """A fit's validation and test files are read through before SentencePiece training is
    announced: misaligned ones end it at once, not after the vocabulary is built."""
    src, tgt = pairs[split]
    data = _corpus(tmp_path / "data", pairs, **{split: (src, tgt[:-1])})
    dm = _datamodule(data, None, cache_dir=str(tmp_path / "cache"))
    dm.trainer = SimpleNamespace(state=SimpleNamespace(fn=SimpleNamespace(value="fit")))
    caplog.set_level(logging.INFO)
    with pytest.raises(ValueError, match=rf"misaligned: .*{split}\.de has \d+ lines but"):
        dm.prepare_data()
    assert "SentencePiece" not in caplog.text
    assert not list((tmp_path / "cache").glob("*.model"))


def test_missing_split_of_another_stage_is_skipped(tmp_path, pairs):
    """``validate`` without test files tokenises what it reads."""
    data = _corpus(tmp_path / "data", pairs)
    (data / "test_2016_flickr.de").unlink()
    dm = _datamodule(data, None, cache_dir=str(tmp_path / "cache"))
    dm.trainer = SimpleNamespace(state=SimpleNamespace(fn=SimpleNamespace(value="validate")))
    dm.prepare_data()
    assert sorted(dm.tokenized_splits) == ["train", "val"]


def _fit_stage(dm: TranslationDataModule) -> TranslationDataModule:
    dm.trainer = SimpleNamespace(state=SimpleNamespace(fn=SimpleNamespace(value="fit")))
    return dm


def test_fit_names_a_missing_test_split_before_sentencepiece_is_trained(tmp_path, pairs):
    """``fit`` checks the test sets it does not read too: a typo in ``data.test_splits``
    fails before any training, with the paths looked for, rather than in the ``test`` after it."""
    data = _corpus(tmp_path / "data", pairs)
    dm = _datamodule(data, None, cache_dir=str(tmp_path / "cache"))
    dm.test_set_names = ["test_2016_flickr", "test_2018_flikr"]
    with pytest.raises(
        FileNotFoundError,
        match=r"No de-en data for split 'test_2018_flikr' in .*; looked for: .*test_2018_flikr\.de",
    ):
        _fit_stage(dm).prepare_data()
    assert not (tmp_path / "cache").exists()


def test_fit_names_a_missing_predict_file(tmp_path, pairs):
    data = _corpus(tmp_path / "data", pairs)
    missing = tmp_path / "in.de"
    dm = _datamodule(data, None, cache_dir=str(tmp_path / "cache"), predict_file=str(missing))
    with pytest.raises(FileNotFoundError, match=rf"data.predict_file {missing} does not exist"):
        _fit_stage(dm).prepare_data()
    assert not (tmp_path / "cache").exists()


def test_fit_accepts_a_missing_test_split_the_download_fetches(tmp_path, multi30k_dir, monkeypatch):
    """A Multi30k folder without its test files trains (``test`` downloads them); a test set
    that Multi30k lacks is still an error there."""
    import shutil

    from seq2seq.data import multi30k

    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        for lang in ("de", "en"):
            shutil.copy(multi30k_dir / f"{split}.{lang}.gz", data)
    fetched = []
    monkeypatch.setattr(multi30k, "download_multi30k", lambda *a, **k: fetched.append(k))

    class AtSentencePiece(Exception):
        pass

    def train_spm():
        raise AtSentencePiece

    dm = _datamodule(data, None, download=True)
    monkeypatch.setattr(dm, "_prepare_tokenizer", train_spm)
    with pytest.raises(AtSentencePiece):  # past the checks
        _fit_stage(dm).prepare_data()
    assert fetched == []  # fit downloads no test set
    dm.test_set_names = ["test_2016_flickr", "test_2017_mscoco"]
    with pytest.raises(FileNotFoundError, match="split 'test_2017_mscoco'"):
        _fit_stage(dm).prepare_data()
    dm.download = False
    dm.test_set_names = ["test_2016_flickr"]
    with pytest.raises(FileNotFoundError, match="split 'test_2016_flickr'"):
        _fit_stage(dm).prepare_data()


@pytest.mark.parametrize("lines", [0, 50], ids=["no lines", "blank lines"])
def test_empty_training_split(tmp_path, pairs, lines):
    """ValueError: "The training split 'train' is empty: .../train.de + .../train.en has no
    sentence pairs with text (no lines, or blank ones only), so no SentencePiece model can be
    trained."."""
    blank = [" " * (i % 3) for i in range(lines)]
    data = _corpus(tmp_path, pairs, train=(blank, blank))
    with pytest.raises(ValueError, match=r"training split 'train' is empty: .*train\.de"):
        _datamodule(data, None).prepare_data()


def test_empty_heldout_set(tmp_path, pairs, spm_file):
    """ValueError: "The held-out split 'val' is empty: .../val.de + .../val.en."."""
    data = _corpus(tmp_path, pairs, val=([], []))
    with pytest.raises(ValueError, match=r"held-out split 'val' is empty: .*val\.de"):
        _datamodule(data, spm_file).prepare_data()


def test_long_training_sentence_is_dropped(tmp_path, pairs, spm_file, caplog):
    """The pair is dropped; the log says '1 longer than max_positions=256'."""
    tgt = pairs["train"][1]
    dm = _fit_with_first_target(tmp_path, pairs, spm_file, caplog, " ".join(tgt[:40]))
    assert len(dm.train_set) == 299
    assert "1 longer than max_positions=256" in caplog.text


def test_long_heldout_sentence_is_truncated_with_warning(tmp_path, pairs, spm_file):
    """UserWarning: "1 source sentence of 'val' is longer than max_positions=256 tokens and is
    truncated (never dropped).", the plural for more."""
    src, tgt = pairs["val"]
    data = _corpus(tmp_path, pairs, val=([" ".join(src + src)] + src[1:], tgt))
    dm = _datamodule(data, spm_file)
    dm.prepare_data()
    with pytest.warns(UserWarning, match=r"1 source sentence of 'val' is longer than max_pos"):
        dm.setup("validate")
    assert len(dm.val_set) == 10
    assert len(dm.val_set[0]["src"]) == 256


def test_model_forward_rejects_sequence_longer_than_max_positions():
    """ValueError: 'sequence length 17 exceeds max_positions=16; truncate the input or ...'."""
    module = TranslationModule(
        vocab_size=50, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
        d_ff=32, max_positions=16,
    )  # fmt: skip
    src = torch.full((1, 17), 5)
    with pytest.raises(ValueError, match="sequence length 17 exceeds max_positions=16"):
        module(src, torch.full((1, 3), 5))


def test_line_separators_inside_a_line_keep_alignment(tmp_path, pairs, spm_file):
    """U+2028 / U+2029 stay inside their sentence: no misalignment error, no pair lost."""
    src, tgt = pairs["train"]
    src = ["Ein Mann\u2028fährt Fahrrad."] + src[1:]
    tgt = ["A man\u2029rides a bike."] + tgt[1:]
    data = _corpus(tmp_path, pairs, train=(src, tgt))
    dm = _datamodule(data, spm_file)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) == 300
    texts = dict(zip(dm.train_set.data["index"], dm.train_set.data["src_text"], strict=True))
    assert texts[0] == "Ein Mann\u2028fährt Fahrrad."


# ---------------------------------------------------------------------- settings
def test_unknown_config_key(tmp_path, capsys):
    """The command exits with an error naming the key: "... unexpected ... 'd_modle'"."""
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  d_modle: 64\n")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(CONFIGS / "tiny.yaml"), "--config", str(config)])
    assert exit_info.value.code != 0
    assert "d_modle" in capsys.readouterr().err


def test_config_value_of_wrong_type(capsys):
    """The command exits with an error naming the key and the value: "model.d_model ... 'big'"."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(CONFIGS / "tiny.yaml"), "--model.d_model", "big"])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "d_model" in err and "big" in err


def test_d_model_not_divisible_by_n_heads():
    """ValueError: 'd_model (30) must be divisible by n_heads (4)', before any data is read."""
    with pytest.raises(ValueError, match=r"d_model \(30\) must be divisible by n_heads \(4\)"):
        cli_main(
            ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--model.d_model", "30",
             "--model.n_heads", "4"]
        )  # fmt: skip


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("model.decoding.max_len_a", "-1", r"^model\.decoding\.max_len_a must be >= 0, got -1\.0$"),
        ("model.decoding.max_len_b", "-50", r"^model\.decoding\.max_len_b must be >= 0, got -50$"),
        ("model.decoding.min_len", "-1", r"^model\.decoding\.min_len must be >= 0, got -1$"),
        ("data.bucket_size", "0", r"data\.bucket_size must be >= 1 or null, got 0\."),
        ("data.vocab_size", "3", r"data\.vocab_size must be > 4, got 3: the vocabulary holds"),
        ("data.vocab_size", "0", r"^vocab_size must be >= 1, got 0$"),
        ("model.d_ff", "0", r"^d_ff must be >= 1, got 0$"),
        (
            "model.lr_scheduler.init_args.warmup_steps",
            "-1",
            r"^lr_scheduler warmup_steps must be >= 0, got -1$",
        ),
        ("model.optimizer.init_args.lr", "-1", r"^Invalid learning rate: -1\.0$"),
    ],
)
def test_out_of_range_setting_is_refused_before_any_data_is_read(
    tmp_path, pairs, option, value, message
):
    """ValueError naming the setting ('data.bucket_size must be >= 1 or null, got 0.'), before
    SentencePiece is trained or any split tokenised (nothing is written to the cache)."""
    data = _corpus(tmp_path / "data", pairs)
    config = _fit_config(tmp_path, data)
    with pytest.raises(ValueError, match=message):
        cli_main(["fit", "--config", str(config), f"--{option}", value])
    assert not (tmp_path / "cache").exists()


def test_vocab_size_out_of_reach(tmp_path, pairs):
    """ValueError: 'SentencePiece could not build a unigram vocabulary of exactly
    vocab_size=5000 pieces ...: Vocabulary size is too high (5000). Please set it to a value
    <= ...'."""
    data = _corpus(tmp_path, pairs)
    with pytest.raises(ValueError, match=r"vocab_size=5000 .*data\.vocab_size"):
        _datamodule(data, None, vocab_size=5000).prepare_data()


def test_tokenizer_file_is_not_a_sentencepiece_model(tmp_path, pairs):
    """ValueError: '.../notes.model is not a valid SentencePiece model (...)'."""
    data = _corpus(tmp_path, pairs)
    bogus = _write(tmp_path, "notes.model", ["this is not a model"])
    with pytest.raises(ValueError, match=r"notes\.model is not a valid SentencePiece model"):
        _datamodule(data, bogus).prepare_data()


# ---------------------------------------------------------------------- checkpoints
def test_resume_with_other_model_sizes(trained, tmp_path):
    """ValueError: '.../last.ckpt was trained with other model settings than the config:
    model.d_model 32 (config 48), model.d_ff 64 (config 96); training resumes only with the
    checkpoint's ...', before any data is prepared, not a tensor size mismatch."""
    config = _fit_config(tmp_path, trained / "data")
    ckpt = str(trained / "checkpoints" / "last.ckpt")
    message = r"than the config: model\.d_model 32 \(config 48\), model\.d_ff 64 \(config 96\)"
    with pytest.raises(ValueError, match=message):
        cli_main(
            ["fit", "--config", str(config), "--ckpt_path", ckpt, "--model.d_model", "48",
             "--model.d_ff", "96"]
        )  # fmt: skip


def test_resume_with_another_schedule_is_refused(trained, tmp_path):
    """ValueError: 'the checkpoint was trained with lr_scheduler seq2seq.optim.InverseSqrtLR,
    this run's is null (a constant rate): ...', not a run whose schedule starts again or takes
    another schedule's state."""
    config = _fit_config(tmp_path, trained / "data")
    ckpt = str(trained / "checkpoints" / "last.ckpt")
    assert load_checkpoint(ckpt)["seq2seq"]["lr_scheduler"] == "seq2seq.optim.InverseSqrtLR"
    message = r"trained with lr_scheduler seq2seq\.optim\.InverseSqrtLR, this run's is null"
    with pytest.raises(ValueError, match=message):
        cli_main(
            ["fit", "--config", str(config), "--ckpt_path", ckpt, "--model.lr_scheduler", "null"]
        )
    plateau = "torch.optim.lr_scheduler.ReduceLROnPlateau"
    with pytest.raises(ValueError, match=f"this run's is {plateau}"):
        cli_main(
            ["fit", "--config", str(config), "--ckpt_path", ckpt, "--model.lr_scheduler", plateau]
        )
    assert not (tmp_path / "cache").exists()  # refused before any data is prepared
    with pytest.raises(ValueError, match=r"optimizer torch\.optim\.adamw\.AdamW, this run's is "):
        cli_main(
            ["fit", "--config", str(config), "--ckpt_path", ckpt, "--model.optimizer",
             "torch.optim.SGD", "--model.optimizer.init_args.lr", "0.1"]
        )  # fmt: skip


def test_resume_with_other_optimizer_settings_says_which_it_keeps(trained, tmp_path):
    """Lightning restores the optimizer's and the schedule's settings with their state: a
    resume configured with others is told, in one warning, which values it trains with."""
    config = _fit_config(tmp_path, trained / "data", max_steps=3)
    ckpt = str(trained / "checkpoints" / "last.ckpt")
    warning = "resuming keeps the checkpoint's optimizer and schedule settings"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli_main(["fit", "--config", str(config), "--ckpt_path", ckpt])
    assert not [w for w in caught if warning in str(w.message)]
    (tmp_path / "other").mkdir()
    config = _fit_config(tmp_path / "other", trained / "data", max_steps=3)
    with pytest.warns(UserWarning, match=warning) as caught:
        cli = cli_main(
            ["fit", "--config", str(config), "--ckpt_path", ckpt, "--trainer.max_steps", "4",
             "--model.optimizer.init_args.lr", "0.01",
             "--model.lr_scheduler.init_args.warmup_steps", "2"]
        )  # fmt: skip
    (message,) = [str(w.message) for w in caught if warning in str(w.message)]
    assert "lr 0.003 (configured 0.01)" in message and "warmup_steps 5 (configured 2)" in message
    assert cli.trainer.optimizers[0].param_groups[0]["initial_lr"] == 0.003


def test_resume_in_the_other_direction_is_refused(trained, tmp_path):
    """ValueError: '.../last.ckpt was trained de->en (data.src_lang de, data.tgt_lang en), not
    en->de as configured; training resumes only in the checkpoint's direction ...', before any
    data is read, instead of training the de->en model on en->de pairs."""
    config = _fit_config(tmp_path, trained / "data")
    ckpt = str(trained / "checkpoints" / "last.ckpt")
    with pytest.raises(ValueError, match=r"trained de->en \(data\.src_lang de, .* not en->de"):
        cli_main(
            ["fit", "--config", str(config), "--ckpt_path", ckpt, "--data.src_lang", "en",
             "--data.tgt_lang", "de"]
        )  # fmt: skip
    assert not (tmp_path / "cache").exists()


def test_evaluating_in_the_other_direction_uses_the_checkpoints(trained, tmp_path, capsys):
    """'seq2seq: warning: .../last.ckpt was trained de->en (...), not en->de as configured; test
    uses the checkpoint's languages': the test set is read and scored de->en."""
    config = _fit_config(tmp_path, trained / "data", limit_test_batches=1)
    ckpt = str(trained / "checkpoints" / "last.ckpt")
    cli = cli_main(
        ["test", "--config", str(config), "--ckpt_path", ckpt, "--data.src_lang", "en",
         "--data.tgt_lang", "de"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "seq2seq: warning: " in err and "not en->de as configured; test uses the" in err
    assert (cli.datamodule.src_lang, cli.datamodule.tgt_lang) == ("de", "en")
    assert cli.model.hparams.tgt_lang == "en"


def test_resume_with_other_vocabulary_size(trained, tmp_path):
    """ValueError: '.../last.ckpt was trained with other model settings than the config:
    data.vocab_size 200 (config 150); ...'."""
    config = _fit_config(tmp_path, trained / "data")
    ckpt = str(trained / "checkpoints" / "last.ckpt")
    with pytest.raises(ValueError, match=r"than the config: data\.vocab_size 200 \(config 150\)"):
        cli_main(["fit", "--config", str(config), "--ckpt_path", ckpt, "--data.vocab_size", "150"])


def test_resume_with_other_sentencepiece_model_of_same_size(trained, tmp_path, pairs):
    """ValueError: "the checkpoint's SentencePiece model differs from the data module's (...)
    although both have 200 pieces: ...", instead of training on wrongly encoded text. A resumed
    run uses the checkpoint's model unless --data.tokenizer_path names another one."""
    from seq2seq.data.tokenizer import Tokenizer

    src, tgt = pairs["train"]
    data = _corpus(tmp_path / "data", pairs, train=(src[:250], tgt[:250]))
    config = _fit_config(tmp_path, data)
    ckpt = str(trained / "checkpoints" / "last.ckpt")
    other = tmp_path / "other.model"
    Tokenizer.train(src[:250] + tgt[:250], other, VOCAB)
    with pytest.raises(ValueError, match="SentencePiece model differs .* both have 200 pieces"):
        cli_main(
            [
                "fit",
                "--config",
                str(config),
                "--ckpt_path",
                ckpt,
                "--data.tokenizer_path",
                str(other),
            ]
        )
    # a path that does not exist: refused before a SentencePiece model is trained there
    typo = tmp_path / "otehr.model"
    with pytest.raises(ValueError, match=r"--data\.tokenizer_path .*otehr\.model does not exi"):
        cli_main(["fit", "--config", str(config), "--ckpt_path", ckpt, "--data.tokenizer_path",
                  str(typo)])  # fmt: skip
    assert not typo.exists()


def test_manual_load_with_other_model_sizes(trained):
    """ValueError naming the setting ('n_heads: checkpoint 2 vs config 4') from
    TranslationModule.load_from_checkpoint with other sizes."""
    with pytest.raises(ValueError, match="n_heads: checkpoint 2 vs config 4"):
        TranslationModule.load_from_checkpoint(
            trained / "checkpoints" / "last.ckpt", n_heads=4, weights_only=True
        )


def test_checkpoint_carries_config_and_tokenizer(trained, spm_file):
    """A checkpoint holds the model configuration and the SentencePiece model it was trained
    with (and loads with weights_only=True)."""
    checkpoint = load_checkpoint(trained / "checkpoints" / "last.ckpt")
    extra = checkpoint["seq2seq"]
    assert extra["model_config"]["d_model"] == 32 and extra["model_config"]["vocab_size"] == VOCAB
    tokenizer = Tokenizer.from_bytes(extra["tokenizer"].numpy().tobytes())
    assert tokenizer.vocab_size == VOCAB
    assert tokenizer.encode(["Ein Hund läuft."]) == Tokenizer.load(spm_file).encode(
        ["Ein Hund läuft."]
    )


# ---------------------------------------------------------------------- Python API
@pytest.mark.parametrize(
    ("name", "value"), [("max_len_a", -1.0), ("max_len_b", -50), ("min_len", -1)]
)
def test_translator_refuses_negative_length_limits(trained, name, value):
    """ValueError: 'max_len_a must be >= 0, got -1.0', not translations cut short."""
    ckpt = trained / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match=rf"^{name} must be >= 0, got {value}$"):
        Translator.from_checkpoint(ckpt, device="cpu", **{name: value})


def test_translator_with_other_model_sizes_names_the_request(trained):
    """ValueError: 'checkpoint was built with other model settings: d_model: checkpoint 32 vs
    requested 64 (d_model=64 given to from_checkpoint); ...', without a config to speak of."""
    ckpt = trained / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError) as info:
        Translator.from_checkpoint(ckpt, device="cpu", d_model=64)
    message = str(info.value)
    assert "d_model: checkpoint 32 vs requested 64 (d_model=64 given to from_checkpoint)" in message
    assert "config" not in message
    assert (
        Translator.from_checkpoint(ckpt, device="cpu", d_model=32).module.model_config["d_model"]
        == 32
    )  # the checkpoint's own value is accepted


@pytest.mark.parametrize("separator", ["\n", "\r\n"], ids=["LF", "CRLF"])
def test_translator_refuses_a_line_break_inside_an_entry(trained, separator):
    """ValueError: 'sentences[1] holds a line break (\\n): pass one sentence per entry, ...',
    not one merged translation of both lines (a bare CR is not a line break in seq2seq's text
    files, which split on LF only)."""
    translator = Translator.from_checkpoint(trained / "checkpoints" / "last.ckpt", device="cpu")
    sentences = ["Ein Hund.", f"Zeile eins{separator}Zeile zwei", "Eine Katze."]
    with pytest.raises(ValueError, match=r"^sentences\[1\] holds a line break"):
        translator.translate(sentences)
    with pytest.raises(ValueError, match=r"^sentences\[0\] \(and 1 more entry\) holds"):
        translator.encode([sentences[1], sentences[1]])
    assert len(translator.translate(["Zeile eins", "Zeile zwei"])) == 2
    with pytest.raises(TypeError, match=r"^sentences\[1\] is NoneType, not a string"):
        translator.translate(["Ein Mann.", None])


# ---------------------------------------------------------------------- during training
def test_non_finite_loss_stops_training(tmp_path, pairs, monkeypatch):
    """FloatingPointError: 'non-finite training loss at step 3: batch 3 of epoch 0 (sentences
    at 0-based lines [13, 98, ...] of the training split). The optimizer step was not taken,
    ...'; the weights stay finite and the last checkpoint (step 2) is intact."""
    data = _corpus(tmp_path / "data", pairs)
    config = _fit_config(tmp_path, data)
    real = TranslationModule._loss_sums
    seen: dict = {"calls": 0}

    def poisoned(self, batch):
        loss_sum, nll_sum, n_tokens = real(self, batch)
        if self.training:
            seen["calls"] += 1
            seen["module"] = self
            if seen["calls"] == 4:
                seen["index"] = batch["index"].tolist()
                loss_sum = loss_sum * float("inf")
        return loss_sum, nll_sum, n_tokens

    monkeypatch.setattr(TranslationModule, "_loss_sums", poisoned)
    with pytest.raises(FloatingPointError, match=r"non-finite training loss at step 3") as info:
        cli_main(["fit", "--config", str(config)])
    assert str(seen["index"][:8]) in str(info.value)
    assert all(torch.isfinite(p).all() for p in seen["module"].parameters())
    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values())


def test_log_directory_not_writable(tmp_path, pairs):
    """OSError before any data is prepared: "[Errno 20] cannot write to .../afile/logs (the
    logger's save_dir): Not a directory; choose a writable folder before training"."""
    data = _corpus(tmp_path / "data", pairs)
    config = _fit_config(tmp_path, data)
    blocker = _write(tmp_path, "afile", ["a regular file"])
    with pytest.raises(OSError, match=r"cannot write to .*afile/logs \(the logger's save_dir\)"):
        cli_main(["fit", "--config", str(config), "--trainer.logger.save_dir", f"{blocker}/logs"])
    assert not (tmp_path / "cache").exists()


def test_disk_full_while_saving(tmp_path, pairs, monkeypatch):
    """WriteError (an OSError): 'cannot write .../last.ckpt: No space left on device (errno 28,
    ENOSPC). The previous .../last.ckpt (step 2) is unchanged.'; last.ckpt still loads."""
    data = _corpus(tmp_path / "data", pairs)
    config = _fit_config(tmp_path, data)
    real_save = torch.save
    calls = {"n": 0}

    def save_until_disk_full(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        f.write(buffer.getvalue()[:1000])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save_until_disk_full)
    with pytest.raises(
        OSError, match=r"cannot write .*last\.ckpt: No space left on device"
    ) as info:
        cli_main(["fit", "--config", str(config)])
    monkeypatch.setattr(torch, "save", real_save)
    assert info.value.errno == errno.ENOSPC
    folder = tmp_path / "checkpoints"
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == 2
    assert [p.name for p in folder.iterdir()] == ["last.ckpt"]


def test_an_optimizer_that_refuses_the_stand_in_parameter_is_left_to_training():
    """Only the settings' own ValueErrors are reported when the module is built: an optimizer
    that cannot take a CPU parameter (a GPU-only one, say) is built as before, by
    configure_optimizers."""
    from seq2seq.module import TranslationModule

    def gpu_only(params):
        raise RuntimeError("this optimizer needs CUDA parameters")

    module = TranslationModule(vocab_size=40, d_model=16, n_heads=2, d_ff=32, optimizer=gpu_only)
    with pytest.raises(RuntimeError, match="needs CUDA parameters"):
        module.configure_optimizers()
