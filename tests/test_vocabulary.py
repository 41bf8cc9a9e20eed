"""Tests of seq2seq.data.vocabulary against transformers' own tokenizers, on Multi30k.

The Hugging Face folders are built offline: SentencePiece models trained here on a few
thousand lines, wrapped in ``MarianTokenizer`` / ``M2M100Tokenizer`` / ``NllbTokenizer`` and
written with ``save_pretrained``, each with a config.json dict as the real models have.
"""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from conftest import MULTI30K  # SEQ2SEQ_MULTI30K, else ../shared/data/multi30k

from seq2seq.data.corpus import read_lines
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.pretrained_tokenizers import read_pretrained_tokenizer
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.vocabulary import MAGIC, VocabularyTokenizer, load_tokenizer, tokenizer_from_bytes

transformers = pytest.importorskip("transformers")
from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES  # noqa: E402

WMT21 = ["en", "ha", "is", "ja", "cs", "ru", "zh", "de"]
LANGS = {"m2m_100": ("de", "en"), "nllb": ("deu_Latn", "eng_Latn"), "marian": (None, None)}


def _spm(lines: list[str], path: Path, size: int, kind: str) -> Path:
    """A model with SentencePiece's default ids (unk 0, <s> 1, </s> 2), as OPUS-MT and fairseq."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(path), vocab_size=size,
        model_type=kind, character_coverage=1.0, minloglevel=2, num_threads=1,
    )  # fmt: skip
    return path.with_suffix(".model")


def _pieces(model: Path) -> list[str]:
    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


@pytest.fixture(scope="module")
def test_set() -> tuple[list[str], list[str]]:
    return read_lines(MULTI30K / "test_2016_flickr.de.gz"), read_lines(
        MULTI30K / "test_2016_flickr.en.gz"
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[Path, dict, transformers.PreTrainedTokenizerBase]]:
    """family -> (folder, config.json dict, the transformers tokenizer loaded from it)."""
    root = tmp_path_factory.mktemp("hf")
    de = read_lines(MULTI30K / "train.de.gz")[:3000]
    en = read_lines(MULTI30K / "train.en.gz")[:3000]
    src, tgt = _spm(de, root / "de", 500, "unigram"), _spm(en, root / "en", 500, "unigram")
    bpe = _spm(de + en, root / "bpe", 800, "bpe")
    out, made = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
        # Marian: a joint vocab.json lacking every 10th target piece (those become <unk>),
        # <pad> last as in OPUS-MT; a second folder has language tags.
        for name, tags in (("marian", []), ("marian_tags", [">>eng<<", ">>fra<<"])):
            vocab = {"</s>": 0, "<unk>": 1}
            for i, piece in enumerate(_pieces(src) + _pieces(tgt)[::-1]):
                if piece not in vocab and piece != "<s>" and i % 10 != 3:
                    vocab[piece] = len(vocab)
            vocab |= {tag: len(vocab) + i for i, tag in enumerate(tags)}
            vocab["<pad>"] = pad = len(vocab)
            (root / f"{name}.json").write_text(json.dumps(vocab))
            made[name] = transformers.MarianTokenizer(
                str(src), str(tgt), str(root / f"{name}.json")
            )
            out[name] = dict(vocab_size=len(vocab), pad_token_id=pad, eos_token_id=0,
                             decoder_start_token_id=pad, model_type="marian")  # fmt: skip
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for piece in _pieces(bpe):
            vocab.setdefault(piece, len(vocab))
        (root / "m2m.json").write_text(json.dumps(vocab))
        made["m2m_100"] = transformers.M2M100Tokenizer(
            str(root / "m2m.json"), str(bpe), language_codes="wmt21", src_lang="de",
            tgt_lang="en", additional_special_tokens=[f"__{c}__" for c in WMT21],
        )  # fmt: skip
        out["m2m_100"] = dict(vocab_size=len(vocab) + len(WMT21) + 8, model_type="m2m_100")
        (root / "nllb_spm").mkdir()
        shutil.copy(bpe, root / "nllb_spm" / "sentencepiece.bpe.model")
        made["nllb"] = transformers.NllbTokenizer.from_pretrained(
            str(root / "nllb_spm"), src_lang="deu_Latn", tgt_lang="eng_Latn",
            additional_special_tokens=list(FAIRSEQ_LANGUAGE_CODES),
        )  # fmt: skip
        out["nllb"] = dict(vocab_size=len(made["nllb"]), model_type="m2m_100")
        result = {}
        for name, tokenizer in made.items():
            tokenizer.save_pretrained(str(root / name))
            if name == "nllb":  # transformers 5 writes tokenizer.json only; hub folders hold both
                shutil.copy(bpe, root / name / "sentencepiece.bpe.model")
            if not name.startswith("marian"):
                out[name] |= dict(pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
            loaded = type(tokenizer).from_pretrained(str(root / name))
            result[name] = (root / name, out[name], loaded)
    return result


def _ours(folders, name: str, **kwargs) -> VocabularyTokenizer:
    folder, config, _ = folders[name]
    return read_pretrained_tokenizer(folder, config, **kwargs)


@pytest.mark.parametrize("name", ["marian", "m2m_100", "nllb"])
def test_every_test_line_as_transformers_encodes_and_decodes_it(folders, test_set, name):
    """Source with side="source", target with side="target": ids, and text back."""
    _, _, hf = folders[name]
    src_lang, tgt_lang = LANGS[name]
    tok = _ours(folders, name, src_lang=src_lang, tgt_lang=tgt_lang)
    de, en = test_set
    assert len(de) == len(en) == 1000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = hf(de, text_target=en)
    ours = {"source": tok.encode(de, side="source"), "target": tok.encode(en, side="target")}
    for side, key in (("source", "input_ids"), ("target", "labels")):
        got = [tok.to_hf_ids([*ids, tok.eos_id]) for ids in ours[side]]
        assert got == expected[key], side
        assert tok.decode(ours[side]) == [hf.decode(x, skip_special_tokens=True) for x in got]
    assert ours["source"] != ours["target"]
    unk = sum(seq.count(tok.unk_id) for seq in ours["target"])
    assert unk > 0 if name == "marian" else True  # Marian's missing pieces were exercised
    if name != "marian":  # the target starts with the target language's code
        assert {seq[0] for seq in ours["target"]} == {tok.language_prefix(tgt_lang)[1][0]}


@pytest.mark.parametrize(
    ("name", "pad", "unk", "eos", "bos"),
    [("marian", None, 1, 0, 0), ("m2m_100", 1, 3, 2, 3), ("nllb", 1, 3, 2, 3)],
)
def test_our_order_keeps_pad_unk_eos_and_starts_from_the_decoder_start(
    folders, name, pad, unk, eos, bos
):
    _, config, _ = folders[name]
    tok = _ours(folders, name)
    pad = config["pad_token_id"] if pad is None else pad
    assert sorted(tok.hf_ids) == list(range(config["vocab_size"])) == list(range(tok.vocab_size))
    assert tok.hf_ids[:4] == [pad, unk, min(set(range(4)) - {pad, unk, eos}), eos]
    assert tok.hf_ids[4:] == sorted(tok.hf_ids[4:])
    assert (tok.pad_id, tok.unk_id, tok.eos_id, tok.bos_id) == (0, 1, 3, bos)
    assert tok.to_hf_ids([tok.bos_id]) == [config["decoder_start_token_id"]]
    assert tok.from_hf_ids(tok.to_hf_ids(range(tok.vocab_size))) == list(range(tok.vocab_size))
    assert tok.id_to_piece([tok.unk_id, tok.eos_id]) == ["<unk>", "</s>"]


def test_marian_language_tags(folders, test_set):
    """>>xx<< before a source when the target language is set; typed tags are kept."""
    _, _, hf = folders["marian_tags"]
    tok = _ours(folders, "marian_tags", tgt_lang="fra")
    assert tok.languages == ("eng", "fra") and _ours(folders, "marian").languages == ()
    de = test_set[0][:200]
    fra, eng = (hf.convert_tokens_to_ids(t) for t in (">>fra<<", ">>eng<<"))
    assert tok.language_prefix("fra") == (tok.from_hf_ids([fra]), [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lang, tag in (("fra", fra), ("eng", eng)):
            expected = hf([f">>{lang}<< {x}" for x in de])["input_ids"]
            ids = tok.encode(de, tgt_lang=lang)
            assert [tok.to_hf_ids([*x, tok.eos_id]) for x in ids] == expected
            assert {x[0] for x in ids} == set(tok.from_hf_ids([tag]))
        typed = tok.encode([">>eng<< " + de[0]])  # the tag in the text wins
        assert tok.to_hf_ids(typed[0]) == hf(">>eng<< " + de[0])["input_ids"][:-1]
    assert tok.encode(de[:3], side="target") == _ours(folders, "marian_tags").encode(
        de[:3], side="target"
    )  # no tag on the target side
    assert tok.decode(tok.encode(de[:3])) == _ours(folders, "marian_tags").decode(
        tok.encode(de[:3])
    )  # nor in the text: decode drops tags
    with pytest.raises(
        ValueError, match=r"'deu' is not a language of the model; its languages: eng, fra"
    ):
        tok.language_prefix("deu")
    with pytest.raises(ValueError, match=r"tgt_lang 'deu' is not a language"):
        _ours(folders, "marian_tags", tgt_lang="deu")
    bilingual = _ours(folders, "marian", tgt_lang="en")
    assert bilingual.language_prefix() == bilingual.language_prefix("en") == ([], [])
    with pytest.raises(ValueError, match="no language tags"):
        bilingual.language_prefix("fr")


@pytest.mark.parametrize("name", ["m2m_100", "nllb"])
def test_language_codes_and_overrides(folders, test_set, tmp_path, name):
    _, _, hf = folders[name]
    src, tgt = LANGS[name]
    other = "fr" if name == "m2m_100" else "fra_Latn"
    other = "ja" if name == "m2m_100" else other  # wmt21 has no fr
    tok = _ours(folders, name, src_lang=src, tgt_lang=tgt)
    assert tok.languages == (tuple(WMT21) if name == "m2m_100" else tuple(FAIRSEQ_LANGUAGE_CODES))
    code = {lang: tok.from_hf_ids([hf.convert_tokens_to_ids(t)])[0] for lang, t in (
        (src, f"__{src}__" if name == "m2m_100" else src),
        (other, f"__{other}__" if name == "m2m_100" else other),
    )}  # fmt: skip
    assert tok.language_prefix(other) == ([code[src]], [code[other]])
    assert tok.language_prefix(src, src_lang=other) == ([code[other]], [code[src]])
    en = test_set[1][:100]
    hf.tgt_lang = other
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = hf(text_target=en)["input_ids"]
    got = tok.encode(en, side="target", tgt_lang=other)
    assert [tok.to_hf_ids([*x, tok.eos_id]) for x in got] == expected
    assert tok.encode(en, src_lang=other)[0][0] == code[other]
    with pytest.raises(
        ValueError,
        match=rf"tgt_lang 'xx' is not a language of the model; its languages: "
        rf"{tok.languages[0]}, ",
    ):
        tok.language_prefix("xx")
    if name == "nllb":  # a language's other codes are its NLLB code; a misspelling is not
        for lang, code in (("fr", "fra_Latn"), ("fra", "fra_Latn"), ("ar", "arb_Arab")):
            assert tok.language_name(lang) == code
            assert tok.language_prefix(lang) == tok.language_prefix(code)
        assert tok.language_name("zh") == "zho_Hans"  # zho_Hant is zh-Hant
        with pytest.raises(ValueError, match=r"'fra_Latm' is not a language .*mean fra_Latn\?"):
            tok.language_prefix("fra_Latm")
    with pytest.raises(ValueError, match="src_lang 'xx'"):
        _ours(folders, name, src_lang="xx")
    unset = tmp_path / "unset"  # a folder that names no target language
    shutil.copytree(folders[name][0], unset)
    settings = json.loads((unset / "tokenizer_config.json").read_text()) | {"tgt_lang": None}
    (unset / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="unset: set tgt_lang to encode target text"):
        read_pretrained_tokenizer(unset, folders[name][1]).encode(["Ein Hund."], side="target")
    with pytest.raises(ValueError, match="side must be 'source' or 'target', got 'both'"):
        tok.encode(["x"], side="both")


@pytest.mark.parametrize("name", ["marian", "nllb"])
def test_sampling_uses_the_sides_model(folders, test_set, name):
    """Subword regularisation samples segmentations of the same text from side's model."""
    tok = _ours(folders, name, **dict(zip(("src_lang", "tgt_lang"), LANGS[name], strict=True)))
    en = [x for x in test_set[1][:100] if tok.unk_id not in tok.encode([x], side="target")[0]]
    best = tok.encode(en, side="target")
    sampled = tok.encode(en, side="target", sample=True, alpha=0.3)
    assert sampled != best
    known = [k for k, x in enumerate(sampled) if tok.unk_id not in x]  # Marian lacks some pieces
    assert len(known) > len(en) / 2
    assert tok.decode([sampled[k] for k in known]) == tok.decode([best[k] for k in known])
    if name == "marian":  # pieces of target.spm, not of source.spm
        folder = folders[name][0]
        target = set(_pieces(folder / "target.spm"))
        assert set(tok.id_to_piece([i for x in sampled for i in x])) <= target | {"<unk>"}


def test_container_round_trip_pickling_and_dispatch(folders, tmp_path, test_set):
    tok = _ours(folders, "nllb", src_lang="deu_Latn", tgt_lang="eng_Latn")
    data = tok.to_bytes()
    assert data.startswith(MAGIC)
    again = tokenizer_from_bytes(data, name="again")
    assert type(again) is VocabularyTokenizer and again.to_bytes() == data
    (tmp_path / "tok.model").write_bytes(data)
    loaded = load_tokenizer(tmp_path / "tok.model")
    with pytest.raises(ValueError, match="again is an imported model's tokenizer, not a Sen"):
        Tokenizer.from_bytes(data, name="again")
    copied = pickle.loads(pickle.dumps(tok))
    de = test_set[0][:50]
    for other in (again, loaded, copied):
        assert other.encode(de) == tok.encode(de) and other.decode(tok.encode(de)) == tok.decode(
            tok.encode(de)
        )
        assert (other.bos_id, other.hf_ids, other.languages) == (3, tok.hf_ids, tok.languages)
        assert (other.src_lang, other.tgt_lang) == ("deu_Latn", "eng_Latn")
    assert copied.name == tok.name
    # the token cache is keyed by to_bytes(): another language pair gives another key
    assert _ours(folders, "nllb", src_lang="deu_Latn", tgt_lang="fra_Latn").to_bytes() != data
    with pytest.raises(ValueError, match="broken.model: VocabularyTokenizer holds"):
        tokenizer_from_bytes(data[:-5], name="broken.model")


def test_plain_sentencepiece_tokenizer_is_unchanged(tmp_path, test_set):
    lines = read_lines(MULTI30K / "train.en.gz")[:1000]
    plain = Tokenizer.train(lines, tmp_path / "plain.model", 300)
    again = tokenizer_from_bytes(plain.to_bytes())
    assert type(again) is Tokenizer and type(load_tokenizer(tmp_path / "plain.model")) is Tokenizer
    assert again.to_bytes() == (tmp_path / "plain.model").read_bytes()
    en = test_set[1][:100]
    ids = plain.encode(en)
    assert plain.encode(en, side="target", src_lang="de", tgt_lang="fr") == ids
    assert type(pickle.loads(pickle.dumps(plain))) is Tokenizer and plain.bos_id == 2


def test_refusals_name_the_folder_and_value(folders, tmp_path):
    folder, config, _ = folders["marian"]

    def copy(name: str, drop: str | None = None, settings: dict | None = None) -> Path:
        target = tmp_path / name
        shutil.copytree(folder, target)
        if drop:
            (target / drop).unlink()
        if settings is not None:
            path = target / "tokenizer_config.json"
            path.write_text(json.dumps(json.loads(path.read_text()) | settings))
        return target

    pegasus = copy("pegasus", settings={"tokenizer_class": "PegasusTokenizer"})
    with pytest.raises(
        ValueError, match=r"pegasus: tokenizer class PegasusTokenizer .* supported: MarianTokenizer"
    ):
        read_pretrained_tokenizer(pegasus, config)
    only_json = tmp_path / "only_json"
    only_json.mkdir()
    (only_json / "tokenizer.json").write_text("{}")
    with pytest.raises(
        ValueError, match=r"only_json: tokenizer class none \(config.json model_type 'pegasus'\)"
    ):
        read_pretrained_tokenizer(only_json, {**config, "model_type": "pegasus"})
    with pytest.raises(ValueError, match=r"no_target/target.spm: file not found"):
        read_pretrained_tokenizer(copy("no_target", drop="target.spm"), config)
    with pytest.raises(ValueError, match=r"config.json's vocab_size is 100"):
        read_pretrained_tokenizer(folder, {**config, "vocab_size": 100})
    with pytest.raises(
        ValueError, match=r"config.json: decoder_start_token_id must be an integer, got None"
    ):
        read_pretrained_tokenizer(folder, {**config, "decoder_start_token_id": None})
    with pytest.raises(ValueError, match=r"pad_token_id 0, eos_token_id 0 .* must differ"):
        read_pretrained_tokenizer(folder, {**config, "pad_token_id": 0})
    with pytest.raises(ValueError, match=r"separate_vocabs=true"):
        read_pretrained_tokenizer(copy("separate", settings={"separate_vocabs": True}), config)
    nllb, nllb_config, _ = folders["nllb"]
    legacy = tmp_path / "legacy"
    shutil.copytree(nllb, legacy)
    path = legacy / "tokenizer_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"legacy_behaviour": True}))
    with pytest.raises(ValueError, match=r"legacy_behaviour=true"):
        read_pretrained_tokenizer(legacy, nllb_config)


@pytest.mark.parametrize("streaming", [False, True])
def test_data_module_encodes_targets_with_target_spm_and_starts_from_bos_id(
    folders, tmp_path, streaming
):
    """A Marian tokenizer (decoder start = pad = 0) given as data.tokenizer_path."""
    tok = _ours(folders, "marian")
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 300), ("val", 50)):
        for lang in ("de", "en"):
            lines = read_lines(MULTI30K / f"{split}.{lang}.gz")[:n]
            (data / f"{split}.{lang}.gz").write_bytes(
                gzip.compress(("\n".join(lines) + "\n").encode())
            )
    (tmp_path / "tok.model").write_bytes(tok.to_bytes())
    dm = TranslationDataModule(
        data_dir=str(data), cache_dir=str(tmp_path / "cache"), vocab_size=tok.vocab_size,
        tokenizer_path=str(tmp_path / "tok.model"), max_tokens=2000, download=False,
        streaming=streaming, subword_alpha=0.1 if streaming else 0.0,
    )  # fmt: skip
    dm.setup("fit")
    assert isinstance(dm.tokenizer, VocabularyTokenizer)
    val = dm.val_dataloader()
    val = val[0] if isinstance(val, list) else val
    target = set(_pieces(folders["marian"][0] / "target.spm")) | {"</s>", "<pad>", "<unk>"}
    for loader in (dm.train_dataloader(), val):
        batch = next(iter(loader))
        assert (batch["tgt_in"][:, 0] == tok.bos_id).all() and tok.bos_id == 0
        assert (batch["tgt_out"] == tok.eos_id).sum() == batch["tgt_in"].shape[0]
        assert set(tok.id_to_piece(batch["tgt_out"].flatten().tolist())) <= target
    en = read_lines(MULTI30K / "val.en.gz")[:50]
    batch = next(iter(val))
    rows = batch["tgt_out"].tolist()
    for index, row in zip(batch["index"].tolist(), rows, strict=True):
        expected = tok.encode([en[index]], side="target")[0]
        assert row[: len(expected) + 1] == [*expected, tok.eos_id]
    assert torch.is_tensor(batch["src"])
