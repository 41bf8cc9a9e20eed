"""SentencePiece subword tokenizer with fixed special ids.

Every model of this project shares one id convention, so that ``PAD_ID`` is a valid
``padding_idx`` and decoding knows where to start and stop:

    pad = 0, unk = 1, bos = 2, eos = 3

Normalisation: models are trained with SentencePiece's default ``nmt_nfkc`` rule (Unicode
NFKC plus the NMT-specific clean-ups, and collapsing of repeated/outer whitespace), and the
rule is stored inside the model, so every input text given to :meth:`Tokenizer.encode` is
normalised the same way. ``decode(encode(x)) == x`` therefore holds for texts that the rule
leaves unchanged. References used for scoring are never passed through the tokenizer.

A model of several target languages has one target-language tag ``>>xx<<`` per language
(OPUS-MT's convention, Johnson et al. 2017): a user-defined piece, put at the start of a source
to select the language (:meth:`Tokenizer.encode`), found again in the model itself
(:attr:`Tokenizer.languages`), so that a checkpoint needs no other record of them.

The model file a run trains once and reuses is named in :mod:`seq2seq.data.spm_files`.
"""

from __future__ import annotations

import io
import random
import warnings
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from seq2seq.data.language_tags import model_tags, same_language
from seq2seq.data.spm_errors import vocabulary_error
from seq2seq.files import atomic_write
from seq2seq.spelling import did_you_mean

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

CONTAINER_MAGIC = b"seq2seq VocabularyTokenizer 1\n"
"""First line of an imported model's tokenizer (:mod:`seq2seq.data.vocabulary`)."""

_SPECIAL_IDS = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}

MIN_VOCAB_SIZE = len(_SPECIAL_IDS) + 1
"""Smallest vocabulary :meth:`Tokenizer.train` accepts: the 4 special pieces and one more.
SentencePiece itself needs one piece per character of the corpus besides the special ones
(``unigram`` and ``bpe`` models also the word-boundary piece ``▁``: at least 6 pieces)."""


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest integer type that holds every id below ``vocab_size``: uint16 up to
    65,536 pieces, int32 beyond (halves the size of tokenised caches and pools)."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def flatten_ids(ids: Sequence[Sequence[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Packs lists of ids into one flat array and offsets (Arrow's list layout).

    Args:
        ids: One list of ids per sentence.
        dtype: Type of the flat array (see :func:`id_dtype`).

    Returns:
        ``(values, offsets)``: ``values[offsets[i]:offsets[i + 1]]`` are the ids of sentence
        ``i``; ``offsets`` is int64 with ``len(ids) + 1`` entries.
    """
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)), out=offsets[1:])
    values = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(offsets[-1]))
    return values, offsets


def check_batch(batch: Any, name: str, entry: str) -> None:
    """Raises TypeError where ``batch``, one entry per sentence, is a single sentence: a str
    (``entry`` ``"str"``) or a list of ints (``"list of ids"``)."""
    one = isinstance(batch, str | bytes) or (
        isinstance(batch, list | tuple) and bool(batch) and isinstance(batch[0], int)
    )
    if one:
        raise TypeError(f"{name} must be a list with one {entry} per sentence, got one sentence")


def sentencepiece_encode(processor: spm.SentencePieceProcessor, texts: list[str], **options):
    """``processor.encode(texts, **options)``, where SentencePiece's ``TypeError`` at a text
    that is no UTF-8 (a lone surrogate, which text decoded with ``errors="surrogateescape"``
    holds for each byte that was no UTF-8) is a ``ValueError`` naming the sentence.

    Raises:
        ValueError: for such a text, naming its 0-based index and character.
    """
    try:
        return processor.encode(texts, **options)
    except TypeError:
        for i, text in enumerate(texts):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(
                    f"sentence {i} (counting from 0) holds U+{ord(text[err.start]):04X}, a lone "
                    f"surrogate, at character {err.start}: no UTF-8 text (a byte that was not "
                    "UTF-8, kept by errors='surrogateescape'); decode the input with "
                    "errors='replace', or mend it"
                ) from None
        raise


class Tokenizer:
    """A SentencePiece model with this project's special ids (pad 0, unk 1, bos 2, eos 3).

    Build one with :meth:`train`, :meth:`load` or :meth:`from_bytes`; :meth:`to_bytes` gives
    the serialized model so that a checkpoint can carry it.

    Args:
        processor: A loaded ``sentencepiece.SentencePieceProcessor`` whose special ids follow
            the convention above.
        name: Where the model came from (file name or description), used in error messages.

    Raises:
        ValueError: If the model's special ids differ from pad 0, unk 1, bos 2, eos 3.
    """

    def __init__(self, processor: spm.SentencePieceProcessor, name: str = "<model>") -> None:
        found = {
            "pad": processor.pad_id(),
            "unk": processor.unk_id(),
            "bos": processor.bos_id(),
            "eos": processor.eos_id(),
        }
        if found != _SPECIAL_IDS:
            raise ValueError(
                f"SentencePiece model {name} has special ids {found}, but this project needs "
                f"{_SPECIAL_IDS}; train it with pad_id=0 unk_id=1 bos_id=2 eos_id=3 "
                "(Tokenizer.train does so)."
            )
        self._sp = processor
        self.name = name
        self._tags = model_tags(processor)  # language -> id of its >>xx<< piece
        self._skip = {PAD_ID, BOS_ID, EOS_ID, *self._tags.values()}

    # ------------------------------------------------------------------ construction
    @classmethod
    def train(
        cls,
        sentences: Iterable[str],
        model_path: str | Path,
        vocab_size: int,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
        byte_fallback: bool = False,
        input_sentence_size: int = 0,
        seed: int = 1,
        num_threads: int = 1,
        user_defined_symbols: Sequence[str] = (),
    ) -> Tokenizer:
        """Trains a SentencePiece model with exactly ``vocab_size`` pieces (a hard limit, so
        the embedding size is known before training), saves it and returns its tokenizer.

        Args:
            sentences: Training sentences (both sides for a joint vocabulary); empty ones skipped.
            model_path: Where the ``.model`` file is written, atomically (folder made if needed).
            vocab_size: Number of pieces, special pieces included (>= :data:`MIN_VOCAB_SIZE`).
            model_type: ``"unigram"``, ``"bpe"``, ``"char"`` or ``"word"``.
            character_coverage: Fraction of characters covered; rarer ones map to ``<unk>``.
            byte_fallback: Spell those as UTF-8 byte pieces instead (256 of the vocabulary).
            input_sentence_size: Train on a random sample of this many sentences (0: all),
                drawn here from ``seed`` (SentencePiece's own sampling differs between
                processes even with a fixed seed), so every process builds the same model.
            seed: Seed of the sentence sample and of SentencePiece's random generator.
            num_threads: Threads used by the trainer.
            user_defined_symbols: Pieces kept whole wherever they occur (tags ``>>xx<<``), with
                ids 4, 5, ... in this order; they count towards ``vocab_size``.

        Raises:
            ValueError: If ``vocab_size`` < :data:`MIN_VOCAB_SIZE` (before reading).
            VocabularyError: (:mod:`seq2seq.data.spm_errors`, a ``ValueError``) if the
                corpus cannot give that many pieces (naming SentencePiece's bound and the fix).
            WriteError: (an ``OSError``) naming ``model_path`` if the machine refuses to
                write it (a full disk, ...); no partial model file is left.
        """
        if vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(
                f"vocab_size must be > {MIN_VOCAB_SIZE - 1}, got {vocab_size} (set "
                "`data.vocab_size`; `model.vocab_size` follows it): the vocabulary holds the 4 "
                "special pieces (pad, unk, bos, eos) and at least one piece per character of "
                "the training corpus."
            )
        model_path = Path(model_path)
        spm.set_random_generator_seed(seed)
        sentences = (s for s in sentences if s)
        if input_sentence_size > 0:
            sentences = iter(_reservoir_sample(sentences, input_sentence_size, seed))
        reading_errors: list[Exception] = []  # raised while reading the corpus, not by spm

        def read(items: Iterable[str]) -> Iterator[str]:
            try:
                yield from items
            except Exception as err:
                reading_errors.append(err)
                raise

        model = io.BytesIO()
        # only given when there are some: a model without them is the one trained before
        symbols = (
            {"user_defined_symbols": list(user_defined_symbols)} if user_defined_symbols else {}
        )
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=read(sentences),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                byte_fallback=byte_fallback,
                input_sentence_size=0,  # sampled above
                hard_vocab_limit=True,
                normalization_rule_name="nmt_nfkc",
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                num_threads=num_threads,
                minloglevel=2,
                **symbols,
            )
        except RuntimeError as err:
            if reading_errors:  # e.g. a misaligned corpus: its own error, not a vocabulary one
                raise reading_errors[0] from None
            raise vocabulary_error(
                str(err), model_type, vocab_size, byte_fallback, character_coverage
            ) from err
        data = model.getvalue()
        kept = "No SentencePiece model was kept; nothing was tokenised."
        with atomic_write(model_path, "wb", kept=kept) as f:  # no half-written model
            f.write(data)
        return cls.from_bytes(data, name=str(model_path))

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Loads a SentencePiece ``.model`` file.

        Args:
            path: Path of the model file.

        Returns:
            The tokenizer.

        Raises:
            FileNotFoundError: If ``path`` does not exist.
            ValueError: If the file is not a SentencePiece model, or its special ids differ
                from this project's.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model file not found: {path}")
        return cls.from_bytes(path.read_bytes(), name=str(path))

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bytes>") -> Tokenizer:
        """Builds a tokenizer from a serialized model (as returned by :meth:`to_bytes`).

        Args:
            data: The serialized SentencePiece ``ModelProto``.
            name: Description used in error messages.

        Returns:
            The tokenizer.

        Raises:
            ValueError: If ``data`` is not a SentencePiece model (an imported model's container,
                which :func:`seq2seq.data.vocabulary.tokenizer_from_bytes` reads, named as
                such), or its special ids differ from this project's.
        """
        if bytes(data[: len(CONTAINER_MAGIC)]) == CONTAINER_MAGIC:
            raise ValueError(
                f"{name} is an imported model's tokenizer, not a SentencePiece model: read it "
                "with seq2seq.data.vocabulary.tokenizer_from_bytes"
            )
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(bytes(data))
        except (RuntimeError, OSError) as err:
            raise ValueError(f"{name} is not a valid SentencePiece model ({err}).") from err
        if processor.get_piece_size() == 0:
            raise ValueError(f"{name} is not a valid SentencePiece model (it has no pieces).")
        return cls(processor, name=name)

    def to_bytes(self) -> bytes:
        """Returns the serialized model, from which :meth:`from_bytes` rebuilds it."""
        return self._sp.serialized_model_proto()

    def __getstate__(self) -> dict:
        return {"model": self.to_bytes(), "name": self.name}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(Tokenizer.from_bytes(state["model"], name=state["name"]).__dict__)

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        """Number of pieces, special pieces included (the model's embedding rows)."""
        return self._sp.get_piece_size()

    @property
    def pad_id(self) -> int:
        """Id of the padding piece (0)."""
        return PAD_ID

    @property
    def unk_id(self) -> int:
        """Id of the unknown piece (1)."""
        return UNK_ID

    @property
    def space_id(self) -> int:
        """Id of the bare word-boundary piece ``"▁"`` (``unk_id`` if the model has none)."""
        return self._sp.piece_to_id("\u2581")

    @property
    def bos_id(self) -> int:
        """Id of the begin-of-sentence piece (2)."""
        return BOS_ID

    @property
    def eos_id(self) -> int:
        """Id of the end-of-sentence piece (3)."""
        return EOS_ID

    @property
    def languages(self) -> tuple[str, ...]:
        """The target languages that have a tag ``>>xx<<`` (sorted); ``()`` for a model
        without tags (a bilingual or many-to-one model)."""
        return tuple(self._tags)

    @property
    def language_ids(self) -> frozenset[int]:
        """Ids of the target-language tags."""
        return frozenset(self._tags.values())

    def language_name(self, lang: str | None) -> str | None:
        """The name in :attr:`languages` of language ``lang`` (a data language code): ``lang``
        itself here, where the tags are the data's codes; ``None`` for ``None`` or a language
        without a tag. An imported model finds its own code for it
        (:meth:`seq2seq.data.vocabulary.VocabularyTokenizer.language_name`)."""
        return lang if lang in self._tags else None

    # ------------------------------------------------------------------ languages
    def language_prefix(
        self, tgt_lang: str | None = None, src_lang: str | None = None
    ) -> tuple[list[int], list[int]]:
        """The ids that select target language ``tgt_lang``: ``(source prefix, target
        prefix)``; ``([id(>>tgt_lang<<)], [])`` with tags, ``([], [])`` without.

        Args:
            tgt_lang: a language of :attr:`languages`; ``None`` only for a model without tags.
            src_lang: ignored (targets alone are tagged; same signature as
                :meth:`seq2seq.data.vocabulary.VocabularyTokenizer.language_prefix`).

        Raises:
            ValueError: for no ``tgt_lang`` or one without a tag on a tagged model (naming
                its languages), or any ``tgt_lang`` on a model without tags.
        """
        if not self._tags:
            if tgt_lang is not None:
                raise ValueError(
                    f"tgt_lang={tgt_lang!r}: this model has no target-language tokens; it "
                    "translates into the one language it was trained on (leave tgt_lang out)"
                )
            return [], []
        return [self._tag_id(tgt_lang)], []

    def _tag_id(self, tgt_lang: str | None) -> int:
        """Id of the tag of ``tgt_lang`` on a tagged model, a language by any of its codes
        (:func:`~seq2seq.data.language_tags.same_language`: ``fra`` is a model's ``fr``);
        ValueError naming its languages."""
        have = ", ".join(self._tags)
        if tgt_lang is None:
            raise ValueError(
                f"this model translates into {have}: choose the target language "
                "(tgt_lang / --tgt_lang)"
            )
        tgt_lang = same_language(tgt_lang, self._tags) or tgt_lang
        if tgt_lang not in self._tags:
            code = tgt_lang.removeprefix(">>").removesuffix("<<")  # the tag given for its code
            hint = f" (did you mean {code}?)" if code in self._tags else ""
            raise ValueError(
                f"tgt_lang={tgt_lang!r} is not a target language of this model"
                f"{hint or did_you_mean(tgt_lang, self._tags)}; it translates into {have}"
            )
        return self._tags[tgt_lang]

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
        """Splits texts into piece ids, without BOS or EOS; a source for target language
        ``tgt_lang`` of a tagged model (:attr:`languages`) starts with its tag.

        A tag typed in a text (``">>fr<< Hallo"``) is one piece wherever it occurs on a tagged
        model, as in Marian, and dropped by :meth:`decode`; a model without tags has no such
        piece, so the text is split like any other.

        Args:
            texts: Sentences (normalised with the model's ``nmt_nfkc`` rule first).
            sample: Sample one segmentation per call (subword regularisation, Kudo 2018)
                instead of the best one; for BPE models this is BPE-dropout (Provilkov et
                al. 2020) with drop probability ``alpha``.
            alpha: Smoothing parameter of the unigram sampling, or the BPE drop probability.
            side: ``"source"`` or ``"target"`` text (one joint model segments both).
            src_lang: Ignored (source languages have no tags).
            tgt_lang: The target language of a source; ignored for targets and without tags
                (a bilingual or many-to-one model).

        Returns:
            One list of ids per text (an empty text gives an empty list, or the tag alone).

        Raises:
            ValueError: for another ``side``, or a ``tgt_lang`` a tagged model lacks.
            TypeError: for one string instead of a list of them.
        """
        check_batch(texts, "texts", "str")
        if side not in ("source", "target"):
            raise ValueError(f"side must be 'source' or 'target', got {side!r}")
        tagged = side == "source" and tgt_lang is not None and bool(self._tags)
        tag = self._tag_id(tgt_lang) if tagged else None  # an unknown language fails first
        options = {"enable_sampling": True, "alpha": alpha, "nbest_size": -1} if sample else {}
        ids = sentencepiece_encode(self._sp, list(texts), out_type=int, **options)
        return ids if tag is None else [[tag, *seq] for seq in ids]

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Turns piece ids back into plain text.

        Args:
            ids: One list of ids per sentence; pad, bos, eos and language tag ids are ignored
                wherever they occur (so padded, EOS-terminated or tagged ids can be passed as
                they are).

        Returns:
            One detokenised string per sentence.

        Raises:
            TypeError: for one list of ids instead of a list of them.
        """
        check_batch(ids, "ids", "list of ids")
        skip = self._skip
        pieces = [[int(i) for i in seq if int(i) not in skip] for seq in ids]
        if len(pieces) < 64:
            # SentencePiece decodes a list of sentences on a thread pool started per call:
            # 140 µs per call against 4 µs for one sentence's ids (2-core AMD EPYC)
            return [self._sp.decode(seq) for seq in pieces]
        return self._sp.decode(pieces)

    def id_to_piece(self, ids: list[int]) -> list[str]:
        """Returns the piece string of each id (e.g. ``"▁Ein"``), for inspection and plots."""
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def __repr__(self) -> str:
        tags = f", languages={self.languages}" if self._tags else ""
        return f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}{tags})"


def unknown_rate(tokenizer: Tokenizer, texts: Sequence[str]) -> float:
    """The fraction of the pieces of ``texts`` (as sources, untagged) that are ``<unk>``; 0.0
    when they have no pieces. Works for any tokenizer of this project (an imported one too)."""
    ids = tokenizer.encode(list(texts))
    total = sum(map(len, ids))
    return sum(seq.count(tokenizer.unk_id) for seq in ids) / total if total else 0.0


def _reservoir_sample(items: Iterable[str], k: int, seed: int) -> list[str]:
    """``k`` items drawn uniformly without replacement from an iterable of unknown length
    (Vitter 1985, Algorithm R), reproducibly from ``seed``; all items if there are fewer."""
    rng = random.Random(seed)
    sample: list[str] = []
    for i, item in enumerate(items):
        if i < k:
            sample.append(item)
        else:
            j = rng.randrange(i + 1)
            if j < k:
                sample[j] = item
    return sample


def check_sentences(sentences: Iterable[Any], name: str = "sentences") -> list[str]:
    """``sentences`` as a list, each entry one sentence.

    Raises:
        TypeError: for an entry that is no str, naming ``name`` and its index.
        ValueError: for entries holding a line break, naming the first and their count.
    """
    sentences = list(sentences)
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(
                f"{name}[{i}] is {type(sentence).__name__}, not a string: pass one str "
                "per sentence ('' for an empty one)"
            )
    broken = [i for i, s in enumerate(sentences) if "\n" in s]
    if broken:
        others = len(broken) - 1
        more = f" (and {others} more {'entry' if others == 1 else 'entries'})" if others else ""
        raise ValueError(
            f"{name}[{broken[0]}]{more} holds a line break (\\n): pass one "
            "sentence per entry, e.g. text.splitlines(), not several lines in one string"
        )
    return sentences


def source_ids(
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    limit: int,
    stacklevel: int = 2,
    tgt_lang: str | None = None,
    src_lang: str | None = None,
    first_line: int = 1,
) -> list[list[int]]:
    """Source sentences as ids without EOS, each cut to ``limit - 1`` tokens so that with EOS
    it fits ``max_positions`` (``limit``); the cut lines (1-based, ``first_line`` the first
    sentence's) are named in one ``UserWarning``.

    Args:
        tokenizer: the model's SentencePiece model.
        sentences: one str per sentence.
        limit: the model's ``max_positions``.
        stacklevel: of the warning, as for :func:`warnings.warn`.
        tgt_lang: the target language a source tag selects (``Tokenizer.encode``'s keyword).
        src_lang: the source language (``Tokenizer.encode``'s keyword; NLLB's source code).

    Raises:
        TypeError: for a str, bytes or a non-str entry instead of a list of str.
        ValueError: for an entry holding a line break.
    """
    if isinstance(sentences, bytes | bytearray):
        raise TypeError(
            f"sentences must be a str or a list of str, not {type(sentences).__name__}: "
            "decode the text first (text.decode('utf-8'))"
        )
    if isinstance(sentences, str):
        raise TypeError(
            "sentences must be a list of sentences, not a str (a string would be encoded "
            "character by character); pass a one-item list: encode([text])"
        )
    sentences = check_sentences(sentences)
    encoded, cut = [], []
    given = {"tgt_lang": tgt_lang, "src_lang": src_lang}
    languages = {key: value for key, value in given.items() if value is not None}
    for i, ids in enumerate(tokenizer.encode(sentences, **languages)):
        if len(ids) + 1 > limit:
            cut.append((i + first_line, len(ids) + 1))
            ids = ids[: limit - 1]
        encoded.append(ids)
    if len(cut) == 1:
        ((line, length),) = cut
        message = (
            f"input line {line} has {length} tokens (with EOS), more than the model's "
            f"max_positions={limit}; truncated to {limit}"
        )
    elif cut:
        line, length = max(cut, key=lambda c: c[1])
        lines = ", ".join(str(c[0]) for c in cut[:10]) + (", ..." if len(cut) > 10 else "")
        message = (
            f"{len(cut)} input lines (lines {lines}) have more than the model's "
            f"max_positions={limit} tokens (with EOS); truncated to {limit} (longest: line "
            f"{line}, {length} tokens)"
        )
    if cut:
        warnings.warn(message, UserWarning, stacklevel=stacklevel)
    return encoded
