"""Tests of seq2seq.data.tokenizer on real Multi30k lines."""

from __future__ import annotations

import pickle
import re
import unicodedata

import pytest
import sentencepiece as spm
from conftest import MULTI30K  # SEQ2SEQ_MULTI30K, else ../shared/data/multi30k

from seq2seq.data.corpus import read_lines
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

VOCAB = 800


@pytest.fixture(scope="module")
def lines() -> list[str]:
    """2,000 German and 2,000 English training lines."""
    return read_lines(MULTI30K / "train.de.gz")[:2000] + read_lines(MULTI30K / "train.en.gz")[:2000]


@pytest.fixture(scope="module")
def tokenizer(lines, tmp_path_factory) -> Tokenizer:
    return Tokenizer.train(lines, tmp_path_factory.mktemp("spm") / "joint.model", VOCAB)


def test_exact_vocab_size_and_special_ids(tokenizer):
    assert tokenizer.vocab_size == VOCAB
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tokenizer.id_to_piece([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]


def test_round_trip_on_held_out_lines(tokenizer):
    """decode(encode(x)) == x for every validation line the nmt_nfkc rule leaves unchanged."""
    val = read_lines(MULTI30K / "val.de.gz") + read_lines(MULTI30K / "val.en.gz")
    normal = [x for x in val if unicodedata.normalize("NFKC", x) == x and " ".join(x.split()) == x]
    assert len(normal) > 0.95 * len(val)
    ids = tokenizer.encode(normal)
    assert all(BOS_ID not in seq and EOS_ID not in seq and PAD_ID not in seq for seq in ids)
    assert tokenizer.decode(ids) == normal  # one batched call
    assert tokenizer.decode(ids[:5]) == normal[:5]  # one call per sentence
    assert tokenizer.decode([]) == []


def test_nmt_nfkc_normalisation_of_inputs(tokenizer):
    assert tokenizer.decode(tokenizer.encode(["  Ein   Hund\u00a0läuft. "])) == ["Ein Hund läuft."]
    assert tokenizer.encode([""]) == [[]]


def test_decode_ignores_pad_bos_eos(tokenizer):
    ids = tokenizer.encode(["Ein Mann schläft.", "Two dogs run."])
    padded = [[BOS_ID, *ids[0], EOS_ID, PAD_ID, PAD_ID], [*ids[1], EOS_ID]]
    assert tokenizer.decode(padded) == ["Ein Mann schläft.", "Two dogs run."]


def test_sampling_varies_segmentation_not_text(tokenizer):
    text = ["Mehrere Männer mit Schutzhelmen bedienen ein Antriebsradsystem."]
    best = tokenizer.encode(text)
    samples = [tokenizer.encode(text, sample=True, alpha=0.1)[0] for _ in range(20)]
    assert any(s != best[0] for s in samples)
    assert all(tokenizer.decode([s]) == text for s in samples)


def test_bytes_and_pickle_round_trip(tokenizer, lines):
    clone = Tokenizer.from_bytes(tokenizer.to_bytes())
    assert clone.encode(lines[:100]) == tokenizer.encode(lines[:100])
    assert pickle.loads(pickle.dumps(tokenizer)).encode(lines[:100]) == tokenizer.encode(
        lines[:100]
    )


def test_load_errors_name_the_file(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.model"):
        Tokenizer.load(tmp_path / "missing.model")
    junk = tmp_path / "junk.model"
    junk.write_text("this is not a model\n")
    with pytest.raises(ValueError, match=r"junk\.model is not a valid SentencePiece model"):
        Tokenizer.load(junk)
    with pytest.raises(ValueError, match="not a valid SentencePiece model"):
        Tokenizer.from_bytes(b"")
    path = tmp_path / "copy.model"
    path.write_bytes(tokenizer.to_bytes())
    assert Tokenizer.load(path).vocab_size == VOCAB


def test_foreign_special_ids_are_rejected(lines, tmp_path):
    prefix = tmp_path / "default_ids"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines[:500]), model_prefix=str(prefix), vocab_size=200, minloglevel=2
    )
    with pytest.raises(ValueError, match=r"default_ids\.model has special ids"):
        Tokenizer.load(f"{prefix}.model")


@pytest.mark.parametrize(
    ("vocab_size", "advice"),
    [(100_000, r"Set vocab_size to at most \d+ "), (20, r"Set vocab_size to \d+ or more ")],
)
def test_unreachable_vocab_size(lines, tmp_path, vocab_size, advice):
    """The message names vocab_size, the bound SentencePiece reported and the setting."""
    path = tmp_path / "too.model"
    with pytest.raises(ValueError, match=rf"vocab_size={vocab_size}.*data\.vocab_size") as info:
        Tokenizer.train(lines[:300], path, vocab_size)
    assert re.search(advice, str(info.value))
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_vocab_size_below_the_special_pieces_is_refused_before_reading(tmp_path):
    """ValueError: 'vocab_size must be > 4, got 3 (...): the vocabulary holds the 4 special
    pieces (pad, unk, bos, eos) and ...', not SentencePiece's 'insert_id(...eos_id()...)'."""

    def unread():
        raise AssertionError("the corpus was read")
        yield

    with pytest.raises(ValueError, match=r"^vocab_size must be > 4, got 3 .*4 special pieces"):
        Tokenizer.train(unread(), tmp_path / "tiny.model", 3)
    assert not (tmp_path / "tiny.model").exists()


@pytest.mark.parametrize(
    ("byte_fallback", "needed"), [(False, 13), (True, 256 + 13)], ids=["chars", "bytes"]
)
def test_vocab_size_below_the_corpus_characters_says_how_many_are_needed(
    tmp_path, byte_fallback, needed
):
    """'hello world' + 'hold the door': 4 special pieces, 8 letters and the word boundary
    (and 256 byte pieces with byte_fallback). The message gives that number, not a claim that
    SentencePiece reported a range, nor its internal check."""
    sentences = ["hello world", "hold the door"]
    with pytest.raises(ValueError) as info:
        Tokenizer.train(sentences, tmp_path / "x.model", 10, byte_fallback=byte_fallback)
    message = str(info.value)
    assert f"needs at least {needed} pieces" in message
    assert f"Set vocab_size to {needed} or more (set `data.vocab_size`" in message
    assert "range SentencePiece reports" not in message and "INTERNAL" not in message
    assert Tokenizer.train(sentences, tmp_path / "x.model", needed, byte_fallback=byte_fallback)


def test_character_coverage_outside_sentencepiece_range_is_named(lines, tmp_path):
    with pytest.raises(ValueError, match=r"character_coverage=0\.5 is outside \[0\.98, 1\.0\]"):
        Tokenizer.train(lines[:300], tmp_path / "x.model", 200, character_coverage=0.5)


def test_bpe_and_byte_fallback(lines, tmp_path):
    tok = Tokenizer.train(
        lines[:1000],
        tmp_path / "bpe.model",
        600,
        model_type="bpe",
        character_coverage=0.98,
        byte_fallback=True,
    )
    assert tok.vocab_size == 600
    text = ["Ein Hund 🐕 läuft."]
    ids = tok.encode(text)
    assert UNK_ID not in ids[0]
    assert tok.decode(ids) == text


def test_sampled_training_gives_the_same_model_in_every_process(tmp_path):
    """With input_sentence_size, two processes train byte-identical models (the sample is
    drawn with a seeded reservoir, not by SentencePiece, whose sampling varies by process)."""
    import subprocess
    import sys

    script = (
        "import sys; from seq2seq.data.corpus import read_lines; "
        "from seq2seq.data.tokenizer import Tokenizer; "
        "lines = read_lines(sys.argv[1])[:4000]; "
        "t = Tokenizer.train(lines, sys.argv[2], 500, input_sentence_size=1500, seed=3); "
        "sys.stdout.buffer.write(t.to_bytes())"
    )
    outputs = [
        subprocess.run(
            [sys.executable, "-c", script, str(MULTI30K / "train.de.gz"), str(tmp_path / f"{i}")],
            check=True,
            capture_output=True,
        ).stdout
        for i in range(2)
    ]
    assert outputs[0] == outputs[1] and len(outputs[0]) > 1000


def test_an_error_while_reading_the_corpus_is_raised_as_itself(tmp_path):
    """A failure of the sentence source (e.g. misaligned files) is not reported as a
    vocabulary-size problem."""

    def sentences():
        yield from ["ein Haus", "a house"] * 50
        raise ValueError("Parallel files are misaligned: a has 100 lines but b has 99")

    with pytest.raises(ValueError, match="misaligned") as info:
        Tokenizer.train(sentences(), tmp_path / "m.model", vocab_size=30)
    assert "vocab_size" not in str(info.value)


def test_one_sentence_instead_of_a_list_is_a_type_error(tokenizer):
    """``encode`` takes a list of texts and ``decode`` a list of id lists: one text (which
    SentencePiece would split character by character) or one id list is refused."""
    with pytest.raises(TypeError, match=r"^texts must be a list with one str per sentence, got"):
        tokenizer.encode("A man rides a bike.")
    with pytest.raises(TypeError, match=r"^ids must be a list with one list of ids per sentence"):
        tokenizer.decode(tokenizer.encode(["A man."])[0])
    assert tokenizer.decode(tokenizer.encode(["A man."])) == ["A man."]
