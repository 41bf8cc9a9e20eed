"""The tokenizer of an imported Hugging Face checkpoint: SentencePiece model(s) plus the
model's own vocabulary mapping, presented in this project's id order (pad 0, unk 1, eos 3).

Three families of ``save_pretrained`` folders are read without ``transformers``:

- Marian (OPUS-MT, and the Pegasus folders ``seq2seq export --format huggingface`` writes):
  ``source.spm`` segments source text, ``target.spm`` target text, and the joint
  ``vocab.json`` maps pieces to ids (a piece it lacks is ``<unk>``). A text that starts with a
  ``>>xx<<`` tag keeps the tag as one token, as ``MarianTokenizer.remove_language_code`` does
  (``>>`` at the very start, up to the first ``<<``). transformers 5 never applies Moses
  punctuation normalisation when encoding (``MarianTokenizer.normalize`` exists, but its
  ``_tokenize`` does not call it, and without ``sacremoses`` it is the identity anyway), so
  SentencePiece's own normalisation is the only one, here as there.
- M2M-100: ``vocab.json`` + ``sentencepiece.bpe.model``; the language tokens ``__xx__`` follow
  the vocabulary in fairseq's order (``language_codes`` "m2m100" or "wmt21", from
  ``tokenizer_config.json``); the ``num_madeup_words`` rows after them have no piece.
- NLLB: ``sentencepiece.bpe.model`` with fairseq's ids (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2,
  ``<unk>`` 3, SentencePiece's other pieces shifted by one; the piece map of ``tokenizer.json``
  where the folder has one), the language codes (``fra_Latn``) as the folder lists them among
  its added special tokens, with their ids.

Where this differs from transformers 5: text is taken literally (transformers first cuts it
at any special token spelled in it, such as ``</s>`` or ``__de__``); ``decode`` drops Marian's
``>>xx<<`` tags, M2M-100's language tokens (in a folder saved by transformers 5 without them
as ``extra_special_tokens``, it prints them) and ids without a piece (it prints ``<unk>``);
NLLB text is segmented by SentencePiece as fairseq did, which drops trailing whitespace where
transformers' ``tokenizers`` BPE keeps it as a ``▁`` token. Otherwise the ids of
``tokenizer(...)["input_ids"]`` (and ``text_target=``) and ``decode(...,
skip_special_tokens=True)`` are equal, as tested on Multi30k.

Our ids are a permutation of the Hugging Face ids (see :func:`our_order`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from seq2seq.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer

MAGIC = b"seq2seq VocabularyTokenizer 1\n"
"""First line of :meth:`VocabularyTokenizer.to_bytes` (never the start of a SentencePiece
model, whose first byte is a protobuf field tag such as ``0x0a``)."""

SPACE = "\u2581"
FAMILIES = ("marian", "m2m_100", "nllb")
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


def our_order(vocab_size: int, pad: int, unk: int, eos: int) -> list[int]:
    """The Hugging Face id of each of our ids: ``[pad, unk, others[0], eos] + others[1:]``,
    ``others`` being every other id ascending, so that pad 0, unk 1 and eos 3 hold.

    Raises:
        ValueError: if pad, unk and eos are not three distinct ids below ``vocab_size``.
    """
    if len({pad, unk, eos}) < 3 or not all(0 <= i < vocab_size for i in (pad, unk, eos)):
        raise ValueError(
            f"pad {pad}, unk {unk} and eos {eos} must be distinct ids below vocab_size {vocab_size}"
        )
    others = [i for i in range(vocab_size) if i not in (pad, unk, eos)]
    return [pad, unk, others[0], eos, *others[1:]]


class VocabularyTokenizer(Tokenizer):
    """SentencePiece model(s) and a piece -> Hugging Face id map, with our id order.

    Build one with :func:`read_pretrained_tokenizer` or :meth:`from_bytes`. ``bos_id`` is the
    decoder start token (Marian: pad, 0; M2M-100/NLLB: eos, 3), ``eos_id`` 3, ``pad_id`` 0,
    ``unk_id`` 1; :attr:`hf_ids` maps our ids to the Hugging Face ones.

    Args:
        header: the description :meth:`to_bytes` stores (family, ``vocab`` piece -> HF id,
            ``vocab_size``, ``pad``/``unk``/``eos``/``start`` HF ids, ``special`` HF ids,
            ``languages`` [name, HF id] pairs, ``src_lang``, ``tgt_lang``, ``clean_up``).
        source: the serialized SentencePiece model of source text.
        target: that of target text (``None``: the source model).
        name: where it came from, for messages.

    Raises:
        ValueError: for an id outside ``vocab_size``, pad, unk and eos not distinct, or a
            default language the model lacks.
    """

    def __init__(
        self, header: Mapping[str, Any], source: bytes, target: bytes | None = None, name: str = ""
    ) -> None:
        self._header = h = dict(header)
        self.name = name or "<vocabulary>"
        self._source_bytes = bytes(source)
        self._target_bytes = None if target is None else bytes(target)
        self._spm = {"source": _processor(source, self.name)}
        self._spm["target"] = self._spm["source"] if target is None else _processor(target, name)
        self.family: str = h["family"]
        self._check()
        self.hf_ids = our_order(h["vocab_size"], h["pad"], h["unk"], h["eos"])
        self._ours = {hf: i for i, hf in enumerate(self.hf_ids)}
        self._piece_ids = {piece: self._ours[hf] for piece, hf in h["vocab"].items()}
        self._pieces = {self._ours[hf]: piece for piece, hf in h["vocab"].items()}
        self._languages = {lang: self._ours[hf] for lang, hf in h["languages"]}
        self._skip = {self._ours[hf] for hf in h["special"]}
        self._skip |= {PAD_ID, EOS_ID, self.bos_id, *self._languages.values()}
        for key in ("tgt_lang",) if self.family == "marian" else ("src_lang", "tgt_lang"):
            self._language_token(h[key], key)  # an unknown language fails here, not later

    def _check(self) -> None:
        h, size = self._header, self._header["vocab_size"]
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: unknown tokenizer family {self.family!r}")
        ids = [*h["vocab"].values(), *h["special"], h["start"], h["pad"], h["unk"], h["eos"]]
        if not all(0 <= hf < size for hf in ids):
            bad = max(ids) if max(ids) >= size else min(ids)
            raise ValueError(
                f"{self.name}: the tokenizer has id {bad}, but config.json's vocab_size is {size} "
                "(ids must be in 0..vocab_size-1)"
            )

    # ------------------------------------------------------------------ serialization
    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bytes>") -> VocabularyTokenizer:
        """Rebuilds a tokenizer from :meth:`to_bytes`'s container.

        Raises:
            ValueError: if ``data`` is not such a container.
        """
        data = bytes(data)
        if not data.startswith(MAGIC):
            raise ValueError(f"{name} is not a VocabularyTokenizer (no {MAGIC!r} first line)")
        end = data.find(b"\n", len(MAGIC))
        try:
            header = json.loads(data[len(MAGIC) : end])
            source_len, target_len = header.pop("source_bytes"), header.pop("target_bytes")
        except (ValueError, KeyError) as err:
            raise ValueError(f"{name}: broken VocabularyTokenizer header ({err})") from err
        body = data[end + 1 :]
        if len(body) != source_len + target_len:
            raise ValueError(
                f"{name}: VocabularyTokenizer holds {len(body)} model bytes, its header says "
                f"{source_len + target_len}"
            )
        target = body[source_len:] if target_len else None
        return cls(header, body[:source_len], target, name=name)

    def to_bytes(self) -> bytes:
        """The container :meth:`Tokenizer.from_bytes` rebuilds this from: :data:`MAGIC`, one
        JSON line (the vocabulary, ids and languages), the SentencePiece model(s)."""
        target = self._target_bytes or b""
        header = self._header | {
            "source_bytes": len(self._source_bytes),
            "target_bytes": len(target),
        }
        line = json.dumps(header, ensure_ascii=False).encode("utf-8")  # order kept: ids unique
        return MAGIC + line + b"\n" + self._source_bytes + target

    def __getstate__(self) -> dict:
        return {"model": self.to_bytes(), "name": self.name}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(VocabularyTokenizer.from_bytes(state["model"], state["name"]).__dict__)

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        """Number of ids (= config.json's ``vocab_size``, ``len(hf_ids)``)."""
        return self._header["vocab_size"]

    @property
    def bos_id(self) -> int:
        """Our id of the decoder start token (config.json's ``decoder_start_token_id``)."""
        return self._ours[self._header["start"]]

    @property
    def space_id(self) -> int:
        """Our id of the bare word-boundary piece ``"▁"`` (``unk_id`` if there is none)."""
        return self._piece_ids.get(SPACE, UNK_ID)

    @property
    def languages(self) -> tuple[str, ...]:
        """The model's language names (``fra_Latn``, ``fr`` for ``__fr__``, ``fra`` for
        ``>>fra<<``); empty for a bilingual Marian model."""
        return tuple(self._languages)

    @property
    def src_lang(self) -> str | None:
        """The default source language of :meth:`encode`."""
        return self._header["src_lang"]

    @property
    def tgt_lang(self) -> str | None:
        """The default target language of :meth:`encode`."""
        return self._header["tgt_lang"]

    def to_hf_ids(self, ids: Sequence[int]) -> list[int]:
        """Our ids as Hugging Face ids."""
        return [self.hf_ids[int(i)] for i in ids]

    def from_hf_ids(self, ids: Sequence[int]) -> list[int]:
        """Hugging Face ids as ours."""
        return [self._ours[int(i)] for i in ids]

    # ------------------------------------------------------------------ languages
    def _language_token(self, lang: str | None, what: str) -> int | None:
        """Our id of language ``lang`` (None for None, or where a bilingual Marian model
        has no tags); ValueError naming the model's languages for one it lacks."""
        if lang is None or (self.family == "marian" and not self._header["languages"]):
            return None
        known = dict(self._header["languages"])
        if lang not in known:
            have = ", ".join(known) or "none"
            raise ValueError(f"{self.name}: {what} {lang!r} is not a language of the model: {have}")
        return self._ours[known[lang]]

    def language_prefix(
        self, tgt_lang: str | None = None, src_lang: str | None = None
    ) -> tuple[list[int], list[int]]:
        """The ids that select target language ``tgt_lang``: (source prefix, target prefix),
        i.e. what :meth:`encode` puts before the pieces of a source and a target text.

        NLLB/M2M-100: ``([src code], [tgt code])``; Marian: ``([>>tgt<<], [])``; a bilingual
        Marian model: ``([], [])`` for its own target language (or None).

        Args:
            tgt_lang: a name from :attr:`languages` (default: :attr:`tgt_lang`).
            src_lang: the source language of NLLB/M2M-100 (default: :attr:`src_lang`).

        Raises:
            ValueError: for a language the model lacks (naming those it has), or a missing one.
        """
        tgt_lang = tgt_lang or self.tgt_lang
        if self.family == "marian" and not self._languages and tgt_lang != self.tgt_lang:
            raise ValueError(
                f"{self.name}: target language {tgt_lang!r} cannot be selected: the model has "
                f"no language tags (it translates into {self.tgt_lang or 'one language'})"
            )
        return self._prefix("source", src_lang, tgt_lang), self._prefix(
            "target", src_lang, tgt_lang
        )

    def _prefix(self, side: str, src_lang: str | None, tgt_lang: str | None) -> list[int]:
        if self.family == "marian":
            tag = self._language_token(tgt_lang or self.tgt_lang, "target language")
            return [] if side == "target" or tag is None else [tag]
        key, lang = ("src_lang", src_lang) if side == "source" else ("tgt_lang", tgt_lang)
        lang = lang or self._header[key]
        if lang is None:
            have = ", ".join(self._languages)
            raise ValueError(f"{self.name}: set {key} to encode {side} text (one of: {have})")
        return [self._language_token(lang, key)]

    # ------------------------------------------------------------------ conversion
    def encode(
        self,
        texts: list[str],
        sample: bool = False,
        alpha: float = 0.1,
        side: str = "source",
        src_lang: str | None = None,
        tgt_lang: str | None = None,
    ) -> list[list[int]]:
        """Our ids of each text, without EOS: the family's language token(s), then the pieces
        of ``side``'s SentencePiece model (a piece missing from the vocabulary is unk).

        Args:
            texts: sentences.
            sample: sample a segmentation (subword regularisation, Kudo 2018; BPE-dropout,
                Provilkov et al. 2020, for BPE models) with ``alpha``, as :class:`Tokenizer`.
            alpha: the unigram smoothing parameter or the BPE drop probability.
            side: ``"source"`` or ``"target"`` (Marian: ``target.spm``; NLLB/M2M-100: the
                target language's code).
            src_lang, tgt_lang: override :attr:`src_lang` / :attr:`tgt_lang`.

        Raises:
            ValueError: for another ``side``, or a language the model lacks or needs.
        """
        if side not in ("source", "target"):
            raise ValueError(f"side must be 'source' or 'target', got {side!r}")
        prefix = self._prefix(side, src_lang, tgt_lang)
        texts = list(texts)
        codes: list[list[int]] = [[] for _ in texts]
        if self.family == "marian":  # a tag typed at the start is one token
            for i, text in enumerate(texts):
                if text.startswith(">>") and (end := text.find("<<")) != -1:
                    codes[i] = [self._piece_ids.get(text[: end + 2], UNK_ID)]
                    texts[i] = text[end + 2 :]
        options = {"enable_sampling": True, "alpha": alpha, "nbest_size": -1} if sample else {}
        pieces = self._spm[side].encode(texts, out_type=str, **options)
        get = self._piece_ids.get
        return [
            (code or prefix) + [get(p, UNK_ID) for p in seq]
            for code, seq in zip(codes, pieces, strict=True)
        ]

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Text of each id list, as Hugging Face's ``decode(..., skip_special_tokens=True)``:
        pad, unk, eos, the decoder start, language tokens and every other special token are
        dropped, as are ids without a piece (M2M-100's made-up words)."""
        pieces = self._pieces
        return [
            self._join([pieces[i] for i in map(int, seq) if i not in self._skip and i in pieces])
            for seq in ids
        ]

    def _join(self, pieces: list[str]) -> str:
        if self.family == "marian":  # transformers 5 decodes a joint vocabulary with source.spm
            text = self._spm["source"].decode_pieces(pieces).replace(SPACE, " ").strip()
        elif self.family == "m2m_100":
            text = self._spm["source"].decode_pieces(pieces).strip()
        else:  # tokenizers' Metaspace decoder: every ▁ a space, the first token's leading one cut
            text = "".join(pieces).replace(SPACE, " ")
            text = text[1:] if pieces and pieces[0].startswith(SPACE) else text
        return _clean_up(text) if self._header["clean_up"] else text

    def id_to_piece(self, ids: list[int]) -> list[str]:
        """The piece (or token) of each of our ids; unk's for an id without one."""
        unk = self._pieces.get(UNK_ID, "<unk>")
        return [self._pieces.get(int(i), unk) for i in ids]

    def __repr__(self) -> str:
        return (
            f"VocabularyTokenizer(name={self.name!r}, family={self.family!r}, "
            f"vocab_size={self.vocab_size}, languages={len(self.languages)})"
        )


def _processor(data: bytes, name: str) -> spm.SentencePieceProcessor:
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(bytes(data))
    except (RuntimeError, OSError) as err:
        raise ValueError(f"{name}: not a valid SentencePiece model ({err})") from err
    return processor


def _clean_up(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (used where tokenizer_config.json sets
    ``clean_up_tokenization_spaces``): no space before . ? ! , and English clitics."""
    for old, new in (
        (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
        (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
    ):  # fmt: skip
        text = text.replace(old, new)
    return text


# ---------------------------------------------------------------------- reading a folder
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
        src_lang, tgt_lang: the language pair (default: tokenizer_config.json's; NLLB/M2M-100
            sources default to transformers' ``eng_Latn`` / ``en`` where the model has it).

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
    default = {"m2m_100": "en", "nllb": "eng_Latn"}.get(family)
    src = src_lang or settings.get("src_lang") or settings.get("source_lang")
    src = src or (default if default in dict(languages) else None)
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
        "tgt_lang": tgt_lang or settings.get("tgt_lang") or settings.get("target_lang"),
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
        processor = _processor(_read(model), str(model))
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
        raise ValueError(f"{path}: file not found (the tokenizer needs it)")
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
