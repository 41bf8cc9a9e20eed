"""Reading a Hugging Face ``save_pretrained`` folder's tokenizer files into a
:class:`~seq2seq.data.vocabulary.VocabularyTokenizer` (Marian, M2M-100, NLLB), without
``transformers``; what each family's files hold is described in :mod:`seq2seq.data.vocabulary`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seq2seq.data.vocabulary import VocabularyTokenizer, processor_from_bytes

__all__ = ["M2M100_LANGUAGES", "read_pretrained_tokenizer"]

_CLASSES = {"MarianTokenizer": "marian", "M2M100Tokenizer": "m2m_100", "NllbTokenizer": "nllb"}
_SUPPORTED = (
    "MarianTokenizer (source.spm, target.spm, vocab.json), M2M100Tokenizer (vocab.json, "
    "sentencepiece.bpe.model) and NllbTokenizer (sentencepiece.bpe.model)"
)
_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

# fairseq's language lists of M2M-100 (Fan et al. 2021), in the order of their ids.
M2M100_LANGUAGES = {
    "m2m100": (
        "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd "
        "gl gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg "
        "mk ml mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw "
        "ta th tl tn tr uk ur uz vi wo xh yi yo zh zu"
    ).split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}


def read_pretrained_tokenizer(
    folder: Path,
    config: Mapping[str, Any],
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> VocabularyTokenizer:
    """The tokenizer of a Hugging Face ``save_pretrained`` folder, in our id order.

    The family comes from tokenizer_config.json's ``tokenizer_class`` (without one: config.json's
    ``model_type``, "marian" -> Marian, "m2m_100" -> M2M-100).

    Args:
        folder: the folder (tokenizer files, tokenizer_config.json).
        config: its parsed config.json (``model_type``, ``vocab_size``, ``pad_token_id``,
            ``eos_token_id``, ``decoder_start_token_id``).
        src_lang, tgt_lang: the language pair (default: tokenizer_config.json's where it is
            one of the model's; NLLB/M2M-100 sources default to transformers' ``eng_Latn`` /
            ``en`` where the model has it).

    Raises:
        ValueError: (one line naming the folder or file and the value) for a missing file or
            config key, a tokenizer class other than the three supported, ids at or above
            ``vocab_size``, or a language the model lacks.
    """
    folder = Path(folder)
    settings = _json(folder / "tokenizer_config.json", required=False)
    family = _family(folder, config, settings)
    ids = {}
    for key in ("vocab_size", "pad_token_id", "eos_token_id", "decoder_start_token_id"):
        value = ids[key] = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{folder / 'config.json'}: {key} must be an integer, got {value!r}")
    given = {key: _content(settings.get(key)) for key in _SPECIAL_KEYS}
    named = _DEFAULTS[family] | {key: text for key, text in given.items() if text}
    vocab, languages, models = {"marian": _marian, "m2m_100": _m2m_100, "nllb": _nllb}[family](
        folder, settings
    )
    added = _added_tokens(folder, settings)
    vocab |= {token: hf for hf, token, _ in added}
    if family == "nllb":  # its language codes: the added special tokens that name no role
        languages = [(t, hf) for hf, t, special in added if special and t not in named.values()]
        if not languages:
            raise ValueError(
                f"{folder}: lists no NLLB language codes among its added special tokens "
                "(tokenizer.json added_tokens, tokenizer_config.json added_tokens_decoder)"
            )
    unk = named["unk_token"]
    if unk not in vocab:
        raise ValueError(f"{folder}: the unk token {unk!r} is not in the vocabulary")
    special = {vocab[t] for t in named.values() if t in vocab}
    special |= {hf for hf, _, is_special in added if is_special}
    if family != "marian":  # (Marian's tags are not special there; decode drops them anyway)
        special |= {hf for _, hf in languages}
    codes = dict(languages)

    def stated(keys: tuple[str, str], untagged: bool = False) -> str | None:
        """tokenizer_config.json's language, a default where it is one of the model's (or
        names no token: a bilingual Marian's, Marian sources): Marian folders hold the
        model's name there, ``en`` beside ``>>eng<<``, en-ROMANCE's ``ROMANCE``."""
        value = next((settings[key] for key in keys if settings.get(key)), None)
        return value if untagged or not codes or value in codes else None

    default = {"m2m_100": "en", "nllb": "eng_Latn"}.get(family)
    src = src_lang or stated(("src_lang", "source_lang"), untagged=family == "marian")
    src = src or (default if default in codes else None)
    clean_up = bool(settings.get("clean_up_tokenization_spaces", False))
    if family == "nllb":  # transformers skips the clean-up for a BPE model unless forced
        clean_up &= bool(settings.get(f"clean_up_tokenization_spaces_{_FORCE}", False))
    header = {
        "family": family,
        "vocab": vocab,
        "vocab_size": ids["vocab_size"],
        "pad": ids["pad_token_id"],
        "unk": vocab[unk],
        "eos": ids["eos_token_id"],
        "start": ids["decoder_start_token_id"],
        "special": sorted(special),
        "languages": [list(pair) for pair in languages],
        "src_lang": src,
        "tgt_lang": tgt_lang or stated(("tgt_lang", "target_lang")),
        "clean_up": clean_up,
    }
    if len({header["pad"], header["unk"], header["eos"]}) < 3:
        raise ValueError(
            f"{folder / 'config.json'}: pad_token_id {header['pad']}, eos_token_id "
            f"{header['eos']} and the unk token's id {header['unk']} must differ"
        )
    return VocabularyTokenizer(header, *map(_read, models), name=str(folder))


_FORCE = "for_bpe_even_though_it_will_corrupt_output"
_DEFAULTS = {  # the special tokens' texts where tokenizer_config.json names none
    "marian": {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
    "m2m_100": {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "unk_token": "<unk>",
                "pad_token": "<pad>"},
    "nllb": {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
             "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"},
}  # fmt: skip


def _family(folder: Path, config: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    cls = settings.get("tokenizer_class")
    if cls is None:
        model_type = config.get("model_type")
        cls = {"marian": "MarianTokenizer", "m2m_100": "M2M100Tokenizer"}.get(
            model_type, f"none (config.json model_type {model_type!r})"
        )
    family = _CLASSES.get(str(cls).removesuffix("Fast"))
    if family is None:
        raise ValueError(
            f"{folder}: tokenizer class {cls} (tokenizer_config.json) is not supported; "
            f"supported: {_SUPPORTED}"
        )
    return family


def _marian(folder: Path, settings: Mapping[str, Any]) -> tuple[dict, list, list[Path]]:
    if settings.get("separate_vocabs"):
        raise ValueError(
            f"{folder / 'tokenizer_config.json'}: separate_vocabs=true (two vocabularies) is "
            "not supported; the model needs one joint vocab.json"
        )
    vocab = _json(folder / "vocab.json")
    languages = [(p[2:-2], i) for p, i in vocab.items() if p.startswith(">>") and p.endswith("<<")]
    return vocab, languages, [folder / "source.spm", folder / "target.spm"]


def _m2m_100(folder: Path, settings: Mapping[str, Any]) -> tuple[dict, list, list[Path]]:
    vocab = _json(folder / "vocab.json")
    codes = settings.get("language_codes", "m2m100")
    if codes not in M2M100_LANGUAGES:
        raise ValueError(
            f"{folder / 'tokenizer_config.json'}: language_codes {codes!r} is not one of "
            f"{', '.join(M2M100_LANGUAGES)}"
        )
    languages = [(lang, len(vocab) + i) for i, lang in enumerate(M2M100_LANGUAGES[codes])]
    vocab |= {f"__{lang}__": hf for lang, hf in languages}  # taking precedence, as there
    return vocab, languages, [folder / "sentencepiece.bpe.model"]


def _nllb(folder: Path, settings: Mapping[str, Any]) -> tuple[dict, list, list[Path]]:
    if settings.get("legacy_behaviour"):
        raise ValueError(
            f"{folder / 'tokenizer_config.json'}: legacy_behaviour=true (X </s> [src code]) is "
            "not supported, only the prefix layout [src code] X </s>"
        )
    model = folder / "sentencepiece.bpe.model"
    fast = _json(folder / "tokenizer.json", required=False).get("model", {})
    vocab = fast.get("vocab") if fast.get("type") == "BPE" else None
    if not isinstance(vocab, dict):  # fairseq's ids: its 4 specials, then the pieces shifted by 1
        processor = processor_from_bytes(_read(model), str(model))
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for i in range(processor.get_piece_size()):
            vocab.setdefault(processor.id_to_piece(i), len(vocab))
    return dict(vocab), [], [model]


def _added_tokens(folder: Path, settings: Mapping[str, Any]) -> list[tuple[int, str, bool]]:
    """(HF id, text, whether special) of each added token tokenizer.json (first) or
    tokenizer_config.json's ``added_tokens_decoder`` lists, by id."""
    found = {
        int(item["id"]): (item["content"], bool(item.get("special")))
        for item in _json(folder / "tokenizer.json", required=False).get("added_tokens", [])
    }
    for hf, item in (settings.get("added_tokens_decoder") or {}).items():
        special = bool(item.get("special")) if isinstance(item, Mapping) else False
        found.setdefault(int(hf), (_content(item), special))
    return [(hf, text, special) for hf, (text, special) in sorted(found.items())]


def _content(token: Any) -> str | None:
    """A token's text, given as a str or as a serialized ``AddedToken`` (``{"content": ...}``)."""
    return token.get("content") if isinstance(token, Mapping) else token


def _read(path: Path) -> bytes:
    if not path.is_file():
        fast_only = path.suffix in (".model", ".spm") and (path.parent / "tokenizer.json").is_file()
        raise ValueError(
            f"{path}: file not found (the tokenizer needs it)"
            + (
                "; the folder has tokenizer.json alone, as transformers 5's save_pretrained "
                "writes it: copy the SentencePiece model in from the model's Hub repository "
                "(hf download has it)"
                if fast_only
                else ""
            )
        )
    return path.read_bytes()


def _json(path: Path, required: bool = True) -> dict:
    if not required and not path.is_file():
        return {}
    try:
        data = json.loads(_read(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
