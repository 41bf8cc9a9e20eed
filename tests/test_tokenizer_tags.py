"""Tests of the target-language tags of a joint SentencePiece model (seq2seq.data.tokenizer,
seq2seq.data.language_tags) and of its balanced training over several pairs
(seq2seq.data.spm_files), on tiny models of a few hundred Multi30k lines."""

from __future__ import annotations

import logging
import pickle
import re
from pathlib import Path

import pytest
import sentencepiece as spm
from conftest import MULTI30K  # SEQ2SEQ_MULTI30K, else ../shared/data/multi30k

from seq2seq.data.corpus import locate_split, read_lines
from seq2seq.data.language_tags import target_tags
from seq2seq.data.spm_files import (
    SentencePieceSettings,
    balanced_sentences,
    load_or_train,
    load_or_train_pairs,
    model_file,
)
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, unknown_rate
from seq2seq.text_decoding import language_prefixes

LINES = 300
TAGS = [">>de<<", ">>fr<<"]
VOCAB = 200  # the characters of 300 lines of de, en and fr, the 2 tags and some pieces


@pytest.fixture(scope="module")
def lines() -> dict[str, list[str]]:
    """The first 300 training lines of each language (multi-parallel)."""
    return {lang: read_lines(MULTI30K / f"train.{lang}.gz")[:LINES] for lang in ("de", "en", "fr")}


@pytest.fixture(scope="module")
def tagged(lines, tmp_path_factory) -> Tokenizer:
    """A joint de, en, fr model with the tags of de and fr."""
    text = lines["de"] + lines["en"] + lines["fr"]
    path = tmp_path_factory.mktemp("spm") / "tagged.model"
    return Tokenizer.train(text, path, VOCAB, user_defined_symbols=TAGS)


@pytest.fixture(scope="module")
def plain(lines, tmp_path_factory) -> Tokenizer:
    """A de-en model without tags."""
    path = tmp_path_factory.mktemp("spm") / "plain.model"
    return Tokenizer.train(lines["de"] + lines["en"], path, 150)


def test_tags_are_single_pieces_right_after_the_special_ids(tagged):
    assert tagged.languages == ("de", "fr") and tagged.language_ids == frozenset({4, 5})
    assert tagged.id_to_piece([0, 1, 2, 3, 4, 5]) == ["<pad>", "<unk>", "<s>", "</s>", *TAGS]
    assert tagged.vocab_size == VOCAB
    # one piece wherever it is typed, even inside a word (a user-defined symbol)
    assert tagged.id_to_piece(tagged.encode(["Ein>>fr<<Hund"])[0]).count(">>fr<<") == 1
    assert "Tokenizer(" in repr(tagged) and "('de', 'fr')" in repr(tagged)


def test_target_tags_exist_for_several_target_languages_only():
    assert target_tags([("en", "fr"), ("en", "de"), ("fr", "de")]) == TAGS
    assert target_tags([("de", "en"), ("fr", "en")]) == [] == target_tags([("de", "en")])


def test_only_user_defined_pieces_are_tags(lines, tmp_path):
    """A control piece spelled like a tag is no language of the model."""
    prefix = tmp_path / "control"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines["de"]), model_prefix=str(prefix), vocab_size=120,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, minloglevel=2,
        control_symbols=[">>es<<"], user_defined_symbols=[">>it<<"],
    )  # fmt: skip
    tok = Tokenizer.load(f"{prefix}.model")
    assert tok.id_to_piece([4, 5]) == [">>es<<", ">>it<<"]
    assert tok.languages == ("it",) and tok.language_ids == frozenset({5})


def test_encode_tags_sources_with_a_target_language_only(tagged, lines):
    texts = lines["en"][:20]
    ids = tagged.encode(texts)
    assert all(4 not in seq and 5 not in seq for seq in ids)
    assert tagged.encode(texts, tgt_lang="fr") == [[5, *seq] for seq in ids]
    assert tagged.encode(texts, side="source", src_lang="en", tgt_lang="de") == [
        [4, *seq] for seq in ids
    ]
    assert tagged.encode(texts, side="target", src_lang="en", tgt_lang="fr") == ids
    sampled = tagged.encode(texts, sample=True, alpha=0.3, tgt_lang="fr")
    assert all(seq[0] == 5 and 5 not in seq[1:] for seq in sampled)
    assert tagged.decode(sampled) == tagged.decode(ids)
    assert tagged.encode([""], tgt_lang="de") == [[4]]
    with pytest.raises(ValueError, match=r"^tgt_lang='es' is not a target language .*de, fr$"):
        tagged.encode(texts, tgt_lang="es")
    with pytest.raises(ValueError, match="side must be 'source' or 'target', got 'src'"):
        tagged.encode(texts, side="src", tgt_lang="fr")


def test_decode_drops_tags(tagged, lines):
    texts = lines["fr"][:10]
    ids = tagged.encode(texts, tgt_lang="fr")
    assert tagged.decode(ids) == texts
    noisy = [[BOS_ID, 4, *seq, 5, EOS_ID, PAD_ID] for seq in tagged.encode(texts)]
    assert tagged.decode(noisy) == texts
    assert tagged.decode([[4, 5, EOS_ID]]) == [""]
    assert all(">>" not in text for text in tagged.decode(tagged.encode([">>de<< Ein Hund."])))


def test_language_prefix(tagged, plain):
    assert tagged.language_prefix("fr") == ([5], []) == language_prefixes(tagged, "fr")
    assert tagged.language_prefix("de", src_lang="en") == ([4], [])
    message = (
        "this model translates into de, fr: choose the target language (tgt_lang / --tgt_lang)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        tagged.language_prefix()
    with pytest.raises(ValueError, match=re.escape(message)):
        language_prefixes(tagged)
    # a language by any of its codes, as an imported model's
    assert tagged.language_prefix("fra") == tagged.language_prefix("FR") == ([5], [])
    with pytest.raises(ValueError, match=r"^tgt_lang='fr_CA' is not a target language of this "):
        tagged.language_prefix("fr_CA")  # another variety
    with pytest.raises(ValueError, match=r"'>>fr<<' is not a target .*\(did you mean fr\?\)"):
        tagged.language_prefix(">>fr<<")  # the tag for its language code
    assert plain.language_prefix() == ([], []) == language_prefixes(plain)
    refusal = "tgt_lang='en': this model has no target-language tokens; it translates into"
    for choose in (plain.language_prefix, lambda lang: language_prefixes(plain, lang)):
        with pytest.raises(ValueError, match=re.escape(refusal)):
            choose("en")


def test_untagged_model_is_the_model_trained_before(plain, lines, tmp_path):
    again = Tokenizer.train(
        lines["de"] + lines["en"], tmp_path / "again.model", 150, user_defined_symbols=()
    )
    assert again.to_bytes() == plain.to_bytes()
    assert plain.languages == () and plain.language_ids == frozenset()
    texts = lines["de"][:20] + [">>fr<< Ein Hund."]
    ids = plain.encode(texts)
    assert plain.encode(texts, side="source", src_lang="de", tgt_lang="en") == ids
    assert plain.encode(texts, side="target", tgt_lang="fr") == ids
    assert ">>fr<<" not in plain.id_to_piece(ids[-1])  # split like any other text
    assert plain.decode(ids[:20]) == lines["de"][:20]


def test_bytes_and_pickle_keep_the_languages(tagged, lines):
    texts = lines["de"][:20]
    for clone in (Tokenizer.from_bytes(tagged.to_bytes()), pickle.loads(pickle.dumps(tagged))):
        assert clone.languages == ("de", "fr") and clone.language_ids == tagged.language_ids
        assert clone.encode(texts, tgt_lang="de") == tagged.encode(texts, tgt_lang="de")
        assert clone.decode([[4, *clone.encode(texts[:1])[0]]]) == texts[:1]


def test_unknown_rate(plain, lines):
    assert unknown_rate(plain, lines["de"] + lines["en"]) == 0.0  # its own training text
    held_out = read_lines(MULTI30K / "val.de.gz")[:200] + read_lines(MULTI30K / "val.en.gz")[:200]
    french = read_lines(MULTI30K / "val.fr.gz")[:200]
    own, other = unknown_rate(plain, held_out), unknown_rate(plain, french)
    assert own < 0.002 and other > 0.005 and other > 5 * own
    assert unknown_rate(plain, []) == 0.0 and unknown_rate(plain, ["", " "]) == 0.0
    assert unknown_rate(plain, ["ç"]) == 1.0 / len(plain.encode(["ç"])[0])


# ---------------------------------------------------------------------- training on pairs
def _write(folder: Path, **sides: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, text in sides.items():
        (folder / f"train.{lang}").write_text("".join(f"{line}\n" for line in text))
    return folder


@pytest.fixture(scope="module")
def multi30k(lines, tmp_path_factory) -> Path:
    """One folder of 300 multi-parallel de, en, fr lines (Multi30k's layout)."""
    return _write(tmp_path_factory.mktemp("multi30k"), **lines)


def test_balanced_sentences_give_each_language_the_same_count(lines, tmp_path):
    """fr-en has 3x the pairs of de-en: every language gives 100 sentences, English read from
    the first pair that has it; a seeded sample, of input_sentence_size / 3 where it is set."""
    de_en = _write(tmp_path / "de-en", de=lines["de"][:100], en=lines["en"][:100])
    fr = lines["fr"][:299] + ["  "]  # a blank line is no sentence
    fr_en = _write(tmp_path / "fr-en", fr=fr * 3, en=lines["en"] * 3)
    trains = [locate_split(de_en, "train", "en", "de"), locate_split(fr_en, "train", "fr", "en")]
    settings = SentencePieceSettings(vocab_size=VOCAB)

    def drawn(settings):
        samples = balanced_sentences(trains, settings, chunk_size=64)
        return {lang: (s.available, s.used, list(s.sentences)) for lang, s in samples.items()}

    got = drawn(settings)
    assert list(got) == ["de", "en", "fr"]
    assert {lang: (a, u, len(text)) for lang, (a, u, text) in got.items()} == {
        "de": (100, 100, 100), "en": (100, 100, 100), "fr": (897, 100, 100),
    }  # fmt: skip
    assert got["de"][2] == lines["de"][:100] and got["en"][2] == lines["en"][:100]
    assert set(got["fr"][2]) <= set(lines["fr"]) and "  " not in got["fr"][2]
    assert drawn(settings) == got  # seeded
    assert drawn(SentencePieceSettings(vocab_size=VOCAB, seed=2))["fr"][2] != got["fr"][2]
    capped = drawn(SentencePieceSettings(vocab_size=VOCAB, input_sentence_size=60))
    assert {lang: len(text) for lang, (_, _, text) in capped.items()} == dict.fromkeys(got, 20)
    # input_sentence_size N: N/3 of each language, the smaller ones giving all they have
    raised = drawn(SentencePieceSettings(vocab_size=VOCAB, input_sentence_size=600))
    assert {lang: (a, u, len(text)) for lang, (a, u, text) in raised.items()} == {
        "de": (100, 100, 100), "en": (100, 100, 100), "fr": (897, 200, 200),
    }  # fmt: skip
    # streaming: the head of 40 pairs of each split, 13 of each language sampled from it
    head = drawn(SentencePieceSettings(vocab_size=VOCAB, input_sentence_size=40, streaming=True))
    assert set(head["de"][2]) < set(lines["de"][:40]) and set(head["fr"][2]) < set(lines["fr"][:40])
    assert {lang: (a, u) for lang, (a, u, _) in head.items()} == dict.fromkeys(got, (40, 13))


def test_a_small_language_that_bounds_the_vocabulary_is_named_with_the_way_out(lines, tmp_path):
    """20 French sentences cap every language at 20: too few for 700 pieces. The error names
    the smallest language and data.spm_input_sentence_size, with which the others give more."""
    de_en = _write(tmp_path / "de-en", de=lines["de"], en=lines["en"])
    fr_en = _write(tmp_path / "fr-en", fr=lines["fr"][:20], en=lines["en"][:20])
    trains = [locate_split(de_en, "train", "de", "en"), locate_split(fr_en, "train", "fr", "en")]
    with pytest.raises(ValueError, match=r"at most \d+ .* The joint model trains on as many "
                       r"sentences of each language as the smallest has \(fr: 20\); "
                       r"--data\.spm_input_sentence_size N takes up to N/3 of each"):  # fmt: skip
        load_or_train_pairs(
            trains, SentencePieceSettings(vocab_size=700), tmp_path / "a", tags=TAGS
        )
    more = SentencePieceSettings(vocab_size=700, input_sentence_size=900)
    assert load_or_train_pairs(trains, more, tmp_path / "b", tags=TAGS).vocab_size == 700


def test_joint_model_file_is_trained_once_and_reused(multi30k, tmp_path, monkeypatch, caplog):
    trains = [locate_split(multi30k, "train", "en", s) for s in ("de", "fr")]
    settings = SentencePieceSettings(vocab_size=VOCAB)
    cache = tmp_path / "cache"
    with caplog.at_level(logging.INFO):
        first = load_or_train_pairs(trains, settings, cache, tags=TAGS[::-1], chunk_size=100)
    (path,) = cache.iterdir()
    assert re.fullmatch(r"spm_deenfr_unigram_200_[0-9a-f]{12}\.model", path.name)
    assert first.languages == ("de", "fr") and first.id_to_piece([4, 5]) == TAGS
    (line,) = [r.getMessage() for r in caplog.records if "SentencePiece" in r.getMessage()]
    for part in ("de 300 of 300", "en 300 of 300", "fr 300 of 300", ">>de<< >>fr<<", str(path)):
        assert part in line

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(Tokenizer, "train", no_training)
    again = load_or_train_pairs(trains[::-1], settings, cache, tags=TAGS, chunk_size=100)
    assert again.to_bytes() == first.to_bytes() and list(cache.iterdir()) == [path]
    monkeypatch.undo()
    # many-to-one (de, fr -> en): no tags, another file
    many = [locate_split(multi30k, "train", s, "en") for s in ("de", "fr")]
    untagged = load_or_train_pairs(many, settings, cache, chunk_size=100)
    assert untagged.languages == () and len(list(cache.iterdir())) == 2


def test_one_pair_without_tags_is_the_bilingual_model(multi30k, tmp_path):
    en_de = locate_split(multi30k, "train", "en", "de")
    settings = SentencePieceSettings(vocab_size=150)
    tok = load_or_train_pairs([en_de], settings, tmp_path / "cache", chunk_size=100)
    (path,) = (tmp_path / "cache").iterdir()
    assert path == model_file(en_de.reversed(), settings, tmp_path / "cache")
    assert path.name.startswith("spm_deen_unigram_150_")
    bilingual = load_or_train(en_de, settings, tmp_path / "other", chunk_size=100)
    assert tok.to_bytes() == bilingual.to_bytes() and tok.languages == ()


def test_refusals_name_the_setting_split_or_file(multi30k, plain, lines, tmp_path):
    trains = [locate_split(multi30k, "train", "en", s) for s in ("de", "fr")]
    settings = SentencePieceSettings(vocab_size=VOCAB)
    with pytest.raises(
        ValueError, match="tags must be target-language tags such as '>>fr<<', got 'de'"
    ):
        load_or_train_pairs(trains, settings, tmp_path, tags=["de", "fr"])
    given = tmp_path / "plain.model"
    given.write_bytes(plain.to_bytes())
    with pytest.raises(
        ValueError, match=r"plain\.model has no target-language tag >>de<< \(its tags: none\)"
    ):
        load_or_train_pairs(trains, SentencePieceSettings(vocab_size=150), tmp_path, given, TAGS)
    empty = _write(tmp_path / "empty", es=["", " "], en=["", ""])
    blank = [trains[0], locate_split(empty, "train", "en", "es")]
    with pytest.raises(
        ValueError, match=r"'train' is empty: \S*empty/train\.en \+ \S*empty/train\.es has no"
    ):
        load_or_train_pairs(blank, settings, tmp_path / "cache", tags=[">>de<<", ">>es<<"])
    one_sided = _write(tmp_path / "one_sided", es=["", " "], en=lines["en"][:2])
    half = [trains[0], locate_split(one_sided, "train", "en", "es")]
    with pytest.raises(ValueError, match=r"has no 'es' text: .*one_sided/train\.es"):
        load_or_train_pairs(half, settings, tmp_path / "cache", tags=[">>de<<", ">>es<<"])
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*.model"))
