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

from seq2seq.data.language_tags import LANGUAGE_TAG, same_language, typed_tag
from seq2seq.data.tokenizer import (
    CONTAINER_MAGIC,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    check_batch,
    sentencepiece_encode,
)
from seq2seq.spelling import did_you_mean

MAGIC = CONTAINER_MAGIC
"""First line of :meth:`VocabularyTokenizer.to_bytes` (never the start of a SentencePiece
model, whose first byte is a protobuf field tag such as ``0x0a``)."""

SPACE = "\u2581"
FAMILIES = ("marian", "m2m_100", "nllb")


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
        self._spm = {"source": processor_from_bytes(source, self.name)}
        target_spm = None if target is None else processor_from_bytes(target, self.name)
        self._spm["target"] = target_spm or self._spm["source"]
        self.family: str = h["family"]
        self._check()
        self.hf_ids = our_order(h["vocab_size"], h["pad"], h["unk"], h["eos"])
        self._ours = {hf: i for i, hf in enumerate(self.hf_ids)}
        self._piece_ids = {piece: self._ours[hf] for piece, hf in h["vocab"].items()}
        self._pieces = {self._ours[hf]: piece for piece, hf in h["vocab"].items()}
        self._languages = {lang: self._ours[hf] for lang, hf in h["languages"]}
        self._names: dict[str, str | None] = {}  # language_name's answers
        self._skip = {self._ours[hf] for hf in h["special"]}
        self._skip |= {PAD_ID, EOS_ID, self.bos_id, *self._languages.values()}
        for key in ("tgt_lang",) if self.family == "marian" else ("src_lang", "tgt_lang"):
            if self._language_token(h[key], key) is not None:  # an unknown one fails here
                h[key] = self.language_name(h[key])  # the model's own name: de -> deu_Latn

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
    def source_model(self) -> bytes:
        """The serialized SentencePiece model that segments source text."""
        return self._source_bytes

    @property
    def target_model(self) -> bytes:
        """The serialized SentencePiece model that segments target text."""
        return self._source_bytes if self._target_bytes is None else self._target_bytes

    @property
    def language_ids(self) -> frozenset[int]:
        """Our ids of the language tokens (codes and ``>>xx<<`` tags)."""
        return frozenset(self._languages.values())

    def language_name(self, lang: str | None) -> str | None:
        """The model's name of language ``lang``, so that a corpus named by ISO 639-1 codes
        (``train.de``, ``data.src_lang de``) trains and tests an imported model: ``lang``
        itself where the model has it, else the one of :attr:`languages` that is the same
        language (:func:`~seq2seq.data.language_tags.same_language`: ``de`` -> NLLB's
        ``deu_Latn``, Marian's ``deu`` of ``>>deu<<``, which ``>>deu<<`` names too); ``None``
        for ``None`` or a language the model lacks.

        Raises:
            ValueError: if several of the model's names are that language (naming them).
        """
        if lang is None or lang in self._languages:
            return lang
        if (tag := LANGUAGE_TAG.fullmatch(lang)) and tag[1] in self._languages:
            return tag[1]  # Marian's tag spelt whole: >>fra<<
        if lang not in self._names:
            self._names[lang] = same_language(lang, self._languages)
        return self._names[lang]

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
        name = self.language_name(lang)
        if name is None:
            known = list(self._languages)
            raise ValueError(
                f"{what} {lang!r} is not a language of the model{_suggestion(lang, known)}; "
                f"its languages: {_listing(known)}"
            )
        return self._languages[name]

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
                f"target language {tgt_lang!r} cannot be selected: the model has "
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
            have = _listing(list(self._languages))
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
        check_batch(texts, "texts", "str")
        if side not in ("source", "target"):
            raise ValueError(f"side must be 'source' or 'target', got {side!r}")
        prefix = self._prefix(side, src_lang, tgt_lang)
        texts = list(texts)
        codes: list[list[int]] = [[] for _ in texts]
        if self.family == "marian":  # a tag typed at the start is one token
            for i, text in enumerate(texts):
                if tag := typed_tag(text):
                    codes[i] = [self._piece_ids.get(tag, UNK_ID)]
                    texts[i] = text[len(tag) :]
        options = {"enable_sampling": True, "alpha": alpha, "nbest_size": -1} if sample else {}
        pieces = sentencepiece_encode(self._spm[side], texts, out_type=str, **options)
        get = self._piece_ids.get
        return [
            (code or prefix) + [get(p, UNK_ID) for p in seq]
            for code, seq in zip(codes, pieces, strict=True)
        ]

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Text of each id list, as Hugging Face's ``decode(..., skip_special_tokens=True)``:
        pad, unk, eos, the decoder start, language tokens and every other special token are
        dropped, as are ids without a piece (M2M-100's made-up words)."""
        check_batch(ids, "ids", "list of ids")
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


def _listing(languages: list[str], shown: int = 8) -> str:
    """``a, b, c`` for a few languages; the first ``shown`` and their number for many."""
    if len(languages) <= shown + 2:
        return ", ".join(languages) or "none"
    return f"{', '.join(languages[:shown])}, ... ({len(languages)} in all)"


def _suggestion(lang: str, known: Sequence[str]) -> str:
    """`` (did you mean fra_Latn?)``: the codes that start with ``lang`` (``fra``, ``fr`` ->
    ``fra_Latn``), else the closest spellings."""
    starting = [code for code in known if code.lower().startswith(lang.lower())]
    if 0 < len(starting) <= 3:
        return f" (did you mean {' or '.join(starting)}?)"
    return did_you_mean(lang, known)


def processor_from_bytes(data: bytes, name: str) -> spm.SentencePieceProcessor:
    """A loaded SentencePiece model; ValueError naming ``name`` for bytes that are none."""
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
def tokenizer_from_bytes(data: bytes, name: str = "<bytes>") -> Tokenizer:
    """A checkpoint's tokenizer from its bytes: a :class:`VocabularyTokenizer` for an imported
    model's container (it starts with :data:`MAGIC`), else a SentencePiece :class:`Tokenizer`.

    Raises:
        ValueError: as :meth:`VocabularyTokenizer.from_bytes` or :meth:`Tokenizer.from_bytes`.
    """
    if bytes(data[: len(MAGIC)]) == MAGIC:
        return VocabularyTokenizer.from_bytes(data, name=name)
    return Tokenizer.from_bytes(data, name=name)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """:func:`tokenizer_from_bytes` of a file.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: as :func:`tokenizer_from_bytes`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SentencePiece model file not found: {path}")
    return tokenizer_from_bytes(path.read_bytes(), name=str(path))
