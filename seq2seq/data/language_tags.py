"""Target-language tags ``>>xx<<`` of a SentencePiece model (OPUS-MT's convention, Johnson
et al. 2017): user-defined pieces, found in the model itself."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import sentencepiece as spm

__all__ = [
    "LANGUAGE_TAG",
    "base_language",
    "is_language_code",
    "language_tag",
    "model_tags",
    "same_language",
    "target_tags",
    "typed_tag",
]

LANGUAGE_TAG = re.compile(r">>(\S+)<<")
"""A target-language tag piece, ``>>fr<<``; group 1 is the language."""

_USER_DEFINED = 4  # sentencepiece_model.proto: ModelProto.SentencePiece.Type.USER_DEFINED


def language_tag(lang: str) -> str:
    """The tag piece of target language ``lang``: ``">>fr<<"`` for ``"fr"``."""
    return f">>{lang}<<"


def target_tags(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """The tags of a model of the language pairs ``(src, tgt)``: one per target language,
    sorted, where there are several; none for one (a bilingual or many-to-one model)."""
    targets = sorted({tgt for _, tgt in pairs})
    return [language_tag(lang) for lang in targets] if len(targets) > 1 else []


def typed_tag(text: str) -> str | None:
    """The tag typed at the start of ``text`` (``>>fra<<`` of ``">>fra<< Ein Hund."``), as
    Marian's tokenizer takes it: from a leading ``>>`` to the first ``<<``; ``None`` if none."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return text[: end + 2]
    return None


def is_language_code(lang: str) -> bool:
    """Whether ``lang`` is a valid BCP 47 language tag (``es``, ``deu_Latn``; ``_`` read as
    ``-``), not a misspelling such as ``xx``; by ``langcodes.tag_is_valid``."""
    import langcodes

    return langcodes.tag_is_valid(lang.replace("_", "-"))


def base_language(lang: str) -> str:
    """The shortest code of ``lang``'s language alone, as sacreBLEU knows languages
    (``zho_Hans``: ``zh``, ``jpn``: ``ja``, ``en``: ``en``); ``lang`` itself where it is no
    language code."""
    import langcodes

    try:
        return langcodes.Language.get(lang.replace("_", "-")).language or lang
    except (langcodes.LanguageTagError, ValueError):
        return lang


def same_language(lang: str, names: Iterable[str]) -> str | None:
    """The one of a model's language ``names`` that means language ``lang``: ``lang`` itself,
    else the name at distance 0 from it by CLDR's language matching (``langcodes.tag_distance``:
    ``de`` is NLLB's ``deu_Latn``, Marian's ``deu``; ``ar`` NLLB's ``arb_Arab``, the standard
    Arabic of the macrolanguage; ``zh`` is ``zho_Hans``, not ``zho_Hant``; ``pt`` is ``pt_BR``,
    not ``pt_PT``); ``None`` if none is. Names that are no language code (``ROMANCE``) match
    only themselves.

    Raises:
        ValueError: naming them, if several names are all that language (``zh_Hans`` and
            ``zho_Hans`` for ``zh``).
    """
    names = list(names)
    if lang in names:
        return lang
    import langcodes  # only where a name is to be found

    same = []
    for name in names:
        try:
            if langcodes.tag_distance(lang.replace("_", "-"), name.replace("_", "-")) == 0:
                same.append(name)
        except (langcodes.LanguageTagError, ValueError):
            continue  # not a language code, on either side
    if len(same) > 1:
        raise ValueError(
            f"language {lang!r} is each of the model's {', '.join(same)}: name the one meant"
        )
    return same[0] if same else None


def model_tags(processor: spm.SentencePieceProcessor) -> dict[str, int]:
    """The model's target-language tags, ``{language: id}`` sorted by language: its
    user-defined pieces spelled ``>>xx<<``.

    The piece types are read from the serialized ``ModelProto`` in protobuf's wire format
    (sentencepiece_model.proto: ``ModelProto.pieces`` is field 1, ``SentencePiece.type`` field
    3, NORMAL = 1 by default): the Python processor has no ``is_user_defined``, and
    ``sentencepiece_model_pb2`` needs the protobuf version its code was generated with
    (protobuf is only an optional extra of sentencepiece).
    """
    pieces = processor.id_to_piece(list(range(processor.get_piece_size())))
    spelled = {
        i: m.group(1)
        for i, p in enumerate(pieces)
        if p.startswith(">>") and (m := LANGUAGE_TAG.fullmatch(p))
    }
    if not spelled:  # a bilingual model: nothing to read
        return {}
    tags = {}
    model = processor.serialized_model_proto()
    last = max(spelled)
    protos = (value for field, value in _proto_fields(model) if field == 1)  # in id order
    for i, proto in enumerate(protos):
        if i in spelled:
            kind = next((value for field, value in _proto_fields(proto) if field == 3), 1)
            if kind == _USER_DEFINED:
                tags[spelled[i]] = i
        if i == last:
            break
    return dict(sorted(tags.items()))


def _proto_fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """``(field number, value)`` of each field of a protobuf message: an int for varints,
    the bytes of length-delimited and fixed-size ones."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        kind = key & 7
        if kind == 0:
            value, pos = _varint(data, pos)
        elif kind == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif kind in (1, 5):  # fixed64, fixed32 (a piece's score)
            size = 8 if kind == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"unexpected protobuf wire type {kind} in a SentencePiece model")
        yield key >> 3, value


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos:]`` and the position after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
