"""data.user_symbols: strings a SentencePiece model keeps as one piece (a back-translation tag
``<BT>``), checked when the data module is built and against a model it is given."""

from __future__ import annotations

import logging

import pytest
from conftest import MULTI30K, write_corpus  # SEQ2SEQ_MULTI30K, else ../shared/data/multi30k

from seq2seq.data.corpus import read_lines
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.user_symbols import check_model_symbols, check_user_symbols

LINES = 300


def _data(tmp_path, **settings) -> TranslationDataModule:
    """A data module over 300 Multi30k pairs, every other source tagged ``<BT>`` as
    back-translated pairs are, and 20 validation pairs."""
    src = read_lines(MULTI30K / "train.de.gz")[:LINES]
    tgt = read_lines(MULTI30K / "train.en.gz")[:LINES]
    src = [f"<BT> {line}" if i % 2 else line for i, line in enumerate(src)]
    val = tuple(read_lines(MULTI30K / f"val.{lang}.gz")[:20] for lang in ("de", "en"))
    folder = write_corpus(tmp_path / "corpus", {"train": (src, tgt), "val": val})
    return TranslationDataModule(
        data_dir=str(folder), cache_dir=str(tmp_path / "cache"), vocab_size=300,
        download=False, test_splits=[], **settings,
    )  # fmt: skip


def test_a_user_symbol_is_one_piece_wherever_it_stands(tmp_path, caplog):
    """Trained with ``user_symbols=["<BT>"]``, the model keeps the tag whole (before a word,
    inside one); without it SentencePiece splits it. The model files differ in name, so
    neither run reuses the other's."""
    caplog.set_level(logging.INFO)
    tagged = _data(tmp_path, user_symbols=["<BT>"])
    tagged.prepare_data()
    assert "SentencePiece model with 300 pieces (user symbols <BT>) on" in caplog.text
    tagged.setup("fit")
    tokenizer = tagged.tokenizer
    for text in ("<BT> Ein Hund läuft.", "Hund<BT>läuft"):
        assert "<BT>" in tokenizer.id_to_piece(tokenizer.encode([text])[0])
    assert tokenizer.decode(tokenizer.encode(["<BT> Ein Hund."]))[0] == "<BT> Ein Hund."
    plain = _data(tmp_path)
    plain.prepare_data()
    plain.setup("fit")
    assert "<BT>" not in plain.tokenizer.id_to_piece(plain.tokenizer.encode(["<BT> Hund"])[0])
    models = sorted(p.name for p in (tmp_path / "cache").glob("spm_*.model"))
    assert len(models) == 2
    with pytest.raises(ValueError) as error:
        check_model_symbols(plain.tokenizer, ["<FT>", "<BT>"], "the checkpoint's tokenizer")
    assert str(error.value) == (
        "data.user_symbols <FT> <BT>: the checkpoint's tokenizer does not keep them as one "
        "piece (its SentencePiece model was trained without); a model's vocabulary cannot "
        "grow; train a new model with them (a new run, without --init_from), or leave them "
        "out of data.user_symbols."
    )
    check_model_symbols(tokenizer, ["<BT>"], "the checkpoint's tokenizer")


def test_a_named_model_without_the_symbol_is_refused_before_any_tokenising(tmp_path):
    plain = _data(tmp_path)
    plain.prepare_data()
    (model,) = (tmp_path / "cache").glob("spm_*.model")
    tokenized = sorted((tmp_path / "cache" / "tokenized").iterdir())
    named = _data(tmp_path, user_symbols=["<BT>"], tokenizer_path=str(model))
    with pytest.raises(ValueError) as error:
        named.prepare_data()
    assert str(error.value) == (
        f"data.user_symbols <BT>: data.tokenizer_path {model} does not keep it as one piece "
        "(its SentencePiece model was trained without); unset data.tokenizer_path to train a "
        "model with it, or leave it out of data.user_symbols."
    )
    assert sorted((tmp_path / "cache" / "tokenized").iterdir()) == tokenized


@pytest.mark.parametrize(
    ("symbols", "why"),
    [
        ([""], "an empty one"),
        (["<B T>"], "'<B T>', which holds whitespace"),
        (["\u2581"], "'\u2581', which holds \u2581, SentencePiece's mark of a word boundary"),
        (["<unk>"], "'<unk>', a special piece of every model"),
        ([">>fr<<"], "'>>fr<<', a target-language tag, which data.pairs adds"),
        (["<BT>", "<BT>"], "'<BT>' twice"),
    ],
)
def test_user_symbols_that_cannot_be_one_piece_are_refused_when_built(tmp_path, symbols, why):
    with pytest.raises(ValueError, match="^data.user_symbols must be strings SentencePiece keeps "
                       rf"as one piece \(such as <BT>\), got {why}"):  # fmt: skip
        TranslationDataModule(data_dir=str(tmp_path), user_symbols=symbols)
    check_user_symbols(["<BT>", "<FT>", "__tag__"])
