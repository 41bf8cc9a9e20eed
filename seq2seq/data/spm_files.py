"""The SentencePiece model file of a run: named by the training split's content and the
settings, trained once into it and reused by every later run.

A run over several language pairs has one joint model over every language of the pairs
(:func:`load_or_train_pairs`), trained on the same number of sentences of each language
(:func:`balanced_sentences`), with a target-language tag ``>>xx<<`` per target language where
there are several (:mod:`seq2seq.data.language_tags`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import NamedTuple

import numpy as np

from seq2seq.data.corpus import CorpusSplit
from seq2seq.data.language_tags import LANGUAGE_TAG
from seq2seq.data.spm_errors import VocabularyError
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.vocabulary import load_tokenizer
from seq2seq.temporaries import remove_abandoned

STREAM_SPM_PAIRS = 500_000  # pairs SentencePiece trains on when streaming, by default


@dataclass(frozen=True)
class SentencePieceSettings:
    """The ``data.*`` settings a SentencePiece model is trained with (see
    :class:`~seq2seq.data.datamodule.TranslationDataModule` for each)."""

    vocab_size: int
    model_type: str = "unigram"
    character_coverage: float = 1.0
    byte_fallback: bool = False
    input_sentence_size: int = 0
    seed: int = 1
    streaming: bool = False
    user_symbols: tuple[str, ...] = ()

    @property
    def stream_pairs(self) -> int:
        """With ``streaming``: the pairs at the head of the stream it is trained on."""
        return self.input_sentence_size or STREAM_SPM_PAIRS


def model_file(train: CorpusSplit, settings: SentencePieceSettings, cache_dir: Path) -> Path:
    """``<cache_dir>/spm_<src><tgt>_<type>_<vocab_size>_<hash>.model``, the hash covering the
    training split's content and the SentencePiece settings."""
    if settings.streaming:
        corpus = f"{train.stream_fingerprint()}|first {settings.stream_pairs} pairs"
    else:
        corpus = f"{train.fingerprint()}|{settings.input_sentence_size}"
    key = f"{corpus}|{settings.character_coverage}|{settings.byte_fallback}|{settings.seed}"
    key += _symbols_key(settings)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = f"spm_{train.src_lang}{train.tgt_lang}_{settings.model_type}_{settings.vocab_size}"
    return Path(cache_dir) / f"{name}_{digest}.model"


def load_or_train(
    train: CorpusSplit | None,
    settings: SentencePieceSettings,
    cache_dir: Path,
    tokenizer_path: str | Path | None = None,
    chunk_size: int = 10_000,
) -> Tokenizer:
    """The SentencePiece model of a run: ``tokenizer_path`` where that file exists, else the
    model trained on ``train`` with ``settings`` (trained now, into ``tokenizer_path`` or
    :func:`model_file`, where that file does not exist yet).

    Temporaries of SentencePiece models that killed runs left in ``cache_dir`` (and beside
    ``tokenizer_path``) are removed (see :func:`seq2seq.temporaries.remove_abandoned`).

    One joint model serves both directions of a language pair: it is trained on (and cached
    under the name and digest of) the split read in the order of the language codes (de-en
    for an en->de run too).

    Args:
        train: the training split (``None`` when ``tokenizer_path`` exists).
        settings: the SentencePiece settings.
        cache_dir: the folder of trained models.
        tokenizer_path: the model file to use, trained there if missing.
        chunk_size: sentence pairs read at a time.

    Raises:
        ValueError: if the training split has no text, or the model has another number of
            pieces than ``settings.vocab_size``.
    """
    if train is None:
        path = Path(tokenizer_path)
        tokenizer = load_tokenizer(path)  # also an imported model's
    else:
        if train.src_lang > train.tgt_lang:
            train = train.reversed()
        path = Path(tokenizer_path) if tokenizer_path is not None else None
        path = path or model_file(train, settings, cache_dir)
        # Model temporaries that killed runs left: the cache's, and those of a named model.
        remove_abandoned(cache_dir, "spm_*.model", ".tmp")
        remove_abandoned(path.parent, path.name, ".tmp")
        if path.is_file():
            tokenizer = load_tokenizer(path)
        else:
            tokenizer = _train_on_split(train, settings, path, chunk_size)
    return _check_size(tokenizer, path, settings)


def _check_size(tokenizer: Tokenizer, path: Path, settings: SentencePieceSettings) -> Tokenizer:
    """``tokenizer``, if it has ``settings.vocab_size`` pieces; ValueError naming ``path``."""
    if tokenizer.vocab_size != settings.vocab_size:
        raise ValueError(
            f"SentencePiece model {path} has {tokenizer.vocab_size} pieces but "
            f"data.vocab_size is {settings.vocab_size}; set data.vocab_size to "
            f"{tokenizer.vocab_size} or point data.tokenizer_path at another model."
        )
    return tokenizer


def _train_on_split(
    train: CorpusSplit, settings: SentencePieceSettings, path: Path, chunk_size: int
) -> Tokenizer:
    """Trains the model ``path`` on the training split (its head when streaming)."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    if settings.streaming:  # the head of the stream, every sentence of it
        src, tgt = _stream_head(train, settings.stream_pairs, chunk_size)
        sentences, sample = src + tgt, 0
        has_text = any(s.strip() for s in sentences)
    else:  # the whole split, read twice; SentencePiece samples as it reads
        has_text = _has_text(train, chunk_size)
        sentences = _split_sentences(train, chunk_size)
        sample = settings.input_sentence_size
    if not has_text:
        raise _empty(train)
    rank_zero_info(
        f"Training a {settings.model_type} SentencePiece model with "
        f"{settings.vocab_size} pieces{_symbols_text(settings)} on {train.describe()} -> {path}"
    )
    return Tokenizer.train(
        sentences,
        path,
        settings.vocab_size,
        model_type=settings.model_type,
        character_coverage=settings.character_coverage,
        byte_fallback=settings.byte_fallback,
        input_sentence_size=sample,
        seed=settings.seed,
        num_threads=min(8, os.cpu_count() or 1),
        user_defined_symbols=settings.user_symbols,
    )


def _symbols_text(settings: SentencePieceSettings) -> str:
    """`` (user symbols <BT> <FT>)``, or nothing, for the training message."""
    return f" (user symbols {' '.join(settings.user_symbols)})" if settings.user_symbols else ""


def _symbols_key(settings: SentencePieceSettings) -> str:
    """The user symbols' part of a model file's hash key: none for none, so that a model
    trained before they existed keeps its name."""
    return f"|symbols {' '.join(settings.user_symbols)}" if settings.user_symbols else ""


def _empty(train: CorpusSplit) -> ValueError:
    """The error of a training split without text."""
    return ValueError(
        f"The training split {train.split!r} is empty: {train.describe()} has "
        "no sentence pairs with text (no lines, or blank ones only), so no "
        "SentencePiece model can be trained."
    )


def _has_text(train: CorpusSplit, chunk_size: int) -> bool:
    """Whether the training split holds a sentence with text. Text, TSV and JSONL files are
    read to their end, so that misaligned files or a malformed line are reported before
    SentencePiece training is announced; other formats are read up to the first text."""
    whole = train.format in ("text", "tsv", "jsonl")
    found = False
    for src, tgt in train.iter_chunks(chunk_size):
        found = found or any(s.strip() for s in chain(src, tgt))
        if found and not whole:
            break
    return found


def _split_sentences(train: CorpusSplit, chunk_size: int) -> Iterator[str]:
    """Every source sentence of the training split, then every target sentence.

    The split is read twice, a chunk at a time, so no list of all lines is built
    (SentencePiece samples ``input_sentence_size`` sentences as they stream by).
    """
    for side in (0, 1):
        for chunk in train.iter_chunks(chunk_size):
            yield from chunk[side]


def _stream_head(train: CorpusSplit, wanted: int, chunk_size: int) -> tuple[list[str], list[str]]:
    """The first ``wanted`` pairs of the streamed training split."""
    src: list[str] = []
    tgt: list[str] = []
    for s, t in train.iter_chunks(min(chunk_size, wanted), streaming=True):
        src += s[: wanted - len(src)]
        tgt += t[: wanted - len(tgt)]
        if len(src) >= wanted:
            break
    return src, tgt


# ---------------------------------------------------------------------- several pairs
class LanguageSample(NamedTuple):
    """One language's part of a joint model's training text."""

    available: int
    """Sentences with text of the language in the split it is read from."""
    used: int
    """Those trained on (the same number for every language, unless a language has fewer
    than ``input_sentence_size`` asks for)."""
    sentences: Iterator[str]
    """The ``used`` sentences, read lazily (once)."""


def joint_splits(trains: Sequence[CorpusSplit]) -> list[CorpusSplit]:
    """The training splits of the pairs, each read in the order of its language codes (de-en
    for en-de too, as :func:`load_or_train`), kept once and sorted by language pair, so that
    the order of the pairs makes no other model."""
    splits = {t.reversed() if t.src_lang > t.tgt_lang else t for t in trains}
    return sorted(splits, key=lambda t: (t.src_lang, t.tgt_lang, t.describe()))


def model_file_pairs(
    trains: Sequence[CorpusSplit],
    settings: SentencePieceSettings,
    cache_dir: Path,
    tags: Sequence[str] = (),
) -> Path:
    """``<cache_dir>/spm_<languages>_<type>_<vocab_size>_<hash>.model`` of a joint model: the
    languages sorted and joined (``deenfr``), the hash covering every pair's split (content,
    or location when streaming), the tags and the SentencePiece settings."""
    splits = joint_splits(trains)
    if settings.streaming:
        corpora = [t.stream_fingerprint() for t in splits] + [f"first {settings.stream_pairs}"]
    else:
        corpora = [t.fingerprint() for t in splits] + [str(settings.input_sentence_size)]
    key = "|".join(
        ["balanced", *corpora, ",".join(sorted(tags)), str(settings.character_coverage)]
        + [str(settings.byte_fallback), str(settings.seed)]
    ) + _symbols_key(settings)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    languages = "".join(sorted({lang for t in splits for lang in (t.src_lang, t.tgt_lang)}))
    name = f"spm_{languages}_{settings.model_type}_{settings.vocab_size}"
    return Path(cache_dir) / f"{name}_{digest}.model"


def load_or_train_pairs(
    trains: Sequence[CorpusSplit] | None,
    settings: SentencePieceSettings,
    cache_dir: Path,
    tokenizer_path: str | Path | None = None,
    tags: Sequence[str] = (),
    chunk_size: int = 10_000,
) -> Tokenizer:
    """The joint SentencePiece model of a run over several language pairs: ``tokenizer_path``
    where that file exists, else the model trained on :func:`balanced_sentences` of ``trains``
    with ``tags`` as user-defined symbols (ids 4, 5, ... in sorted order), trained now into
    ``tokenizer_path`` or :func:`model_file_pairs` where that file does not exist yet.

    One pair (in either direction) without tags is a bilingual run: :func:`load_or_train`'s
    model, under its file name.

    Args:
        trains: the training split of each pair (``None`` when ``tokenizer_path`` exists).
        settings: the SentencePiece settings.
        cache_dir: the folder of trained models.
        tokenizer_path: the model file to use, trained there if missing.
        tags: the target-language tags, e.g. ``[">>de<<", ">>fr<<"]`` (none for one target).
        chunk_size: sentence pairs read at a time.

    Raises:
        ValueError: for a tag not spelled ``>>xx<<``, a split or language without text (naming
            its files), a model of another size than ``settings.vocab_size``, or one without
            every tag.
    """
    bad = [tag for tag in tags if not LANGUAGE_TAG.fullmatch(tag)]
    if bad:
        raise ValueError(f"tags must be target-language tags such as '>>fr<<', got {bad[0]!r}")
    tags = sorted(set(tags))
    splits = None if trains is None else joint_splits(trains)
    if splits is not None and len(splits) == 1 and not tags:
        return load_or_train(splits[0], settings, cache_dir, tokenizer_path, chunk_size)
    if splits is None and tokenizer_path is None:
        raise ValueError(
            "no training split to train a SentencePiece model on, and no tokenizer_path"
        )
    path = Path(tokenizer_path) if tokenizer_path is not None else None
    path = path or model_file_pairs(splits, settings, cache_dir, tags)
    if splits is not None:
        remove_abandoned(cache_dir, "spm_*.model", ".tmp")
        remove_abandoned(path.parent, path.name, ".tmp")
    if path.is_file() or splits is None:
        tokenizer = load_tokenizer(path)
    else:
        tokenizer = _train_joint(splits, settings, path, tags, chunk_size)
    missing = [tag for tag in tags if LANGUAGE_TAG.fullmatch(tag)[1] not in tokenizer.languages]
    if missing:
        have = ", ".join(tokenizer.languages) or "none"
        raise ValueError(
            f"SentencePiece model {path} has no target-language tag {missing[0]} (its tags: "
            f"{have}); point data.tokenizer_path at a model trained for these pairs, or leave "
            "it unset to train one."
        )
    return _check_size(tokenizer, path, settings)


def balanced_sentences(
    trains: Sequence[CorpusSplit], settings: SentencePieceSettings, chunk_size: int = 10_000
) -> dict[str, LanguageSample]:
    """The training text of a joint model, per language (sorted by code).

    A language is read from the first split of :func:`joint_splits` that has it (from its head
    of ``stream_pairs`` pairs when streaming), since multi-parallel corpora repeat a side
    (Multi30k's English). Each language gives a sample of its sentences with text seeded by
    ``settings.seed``: the smallest language's count; with ``input_sentence_size`` N > 0, N/L
    of each of the L languages instead, a language with fewer giving all it has (so that a
    small pair does not bound the vocabulary).

    Raises:
        ValueError: for a split without text, or a language without text in its split (naming
            the split and its files).
    """
    splits = joint_splits(trains)
    sources: dict[str, tuple[CorpusSplit, int]] = {}  # language -> (split, side)
    for split in splits:
        for side, lang in enumerate((split.src_lang, split.tgt_lang)):
            sources.setdefault(lang, (split, side))
    read = list(dict.fromkeys(split for split, _ in sources.values()))
    for split in splits:  # splits that give no language are still checked
        if split not in read and not _has_text(split, chunk_size):
            raise _empty(split)
    if settings.streaming:
        heads: dict[CorpusSplit, list[list[str]]] = {}
        for split in read:
            head = _stream_head(split, settings.stream_pairs, chunk_size)
            heads[split] = [[s for s in side if s.strip()] for side in head]
        counts = {split: tuple(map(len, h)) for split, h in heads.items()}
    else:
        counts = {split: _text_counts(split, chunk_size) for split in read}
    for split in read:
        if not any(counts[split]):
            raise _empty(split)
    for lang, (split, side) in sources.items():
        if not counts[split][side]:
            raise ValueError(
                f"The training split {split.split!r} has no {lang!r} text: {split.describe()} "
                f"has text on its other side only, so the {lang} part of the joint SentencePiece "
                "model has nothing to train on."
            )
    available = {lang: counts[split][side] for lang, (split, side) in sources.items()}
    n = min(available.values())
    if settings.input_sentence_size > 0:
        n = max(1, settings.input_sentence_size // len(sources))
    samples = {}
    for lang in sorted(sources):
        split, side = sources[lang]
        lines = heads[split][side] if settings.streaming else _side(split, side, chunk_size)
        used = min(n, available[lang])
        keep = _sample_mask(available[lang], used, settings.seed, lang)
        samples[lang] = LanguageSample(available[lang], used, _kept(lines, keep))
    return samples


def _train_joint(
    splits: list[CorpusSplit],
    settings: SentencePieceSettings,
    path: Path,
    tags: list[str],
    chunk_size: int,
) -> Tokenizer:
    """Trains the joint model ``path`` on :func:`balanced_sentences` of ``splits``."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    samples = balanced_sentences(splits, settings, chunk_size)
    parts = ", ".join(f"{lang} {s.used:,} of {s.available:,}" for lang, s in samples.items())
    rank_zero_info(
        f"Training a joint {settings.model_type} SentencePiece model with {settings.vocab_size} "
        f"pieces{_symbols_text(settings)} on a sample of each language's sentences ({parts}), tags "
        f"{' '.join(tags) or 'none'}, from {' ; '.join(t.describe() for t in splits)} -> {path}"
    )
    try:
        return Tokenizer.train(
            chain.from_iterable(sample.sentences for sample in samples.values()),
            path,
            settings.vocab_size,
            model_type=settings.model_type,
            character_coverage=settings.character_coverage,
            byte_fallback=settings.byte_fallback,
            input_sentence_size=0,  # sampled by balanced_sentences
            seed=settings.seed,
            num_threads=min(8, os.cpu_count() or 1),
            user_defined_symbols=[*tags, *settings.user_symbols],
        )
    except VocabularyError as err:  # too few pieces: say what bounds the sample, and the way out
        if settings.input_sentence_size > 0 or err.max_pieces is None:
            raise
        smallest = min(samples, key=lambda lang: samples[lang].available)
        raise ValueError(
            f"{err} The joint model trains on as many sentences of each language as the "
            f"smallest has ({smallest}: {samples[smallest].available:,}); "
            f"--data.spm_input_sentence_size N takes up to N/{len(samples)} of each, a smaller "
            "language giving all it has."
        ) from None


def _side(train: CorpusSplit, side: int, chunk_size: int) -> Iterator[str]:
    """Every sentence of one side of the split (0: source, 1: target), read in chunks."""
    for chunk in train.iter_chunks(chunk_size):
        yield from chunk[side]


def _text_counts(train: CorpusSplit, chunk_size: int) -> tuple[int, int]:
    """The source and target sentences with text of the split (reading it whole)."""
    src = tgt = 0
    for s, t in train.iter_chunks(chunk_size):
        src += sum(1 for x in s if x.strip())
        tgt += sum(1 for x in t if x.strip())
    return src, tgt


def _sample_mask(available: int, wanted: int, seed: int, lang: str) -> np.ndarray | None:
    """Which of ``available`` sentences to keep: ``wanted`` of them drawn without replacement
    from ``seed`` and the language (``None``: all)."""
    if wanted >= available:
        return None
    digest = hashlib.sha256(f"{seed}|{lang}".encode()).digest()  # any int seed, per language
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    keep = np.zeros(available, dtype=bool)
    keep[rng.choice(available, wanted, replace=False)] = True
    return keep


def _kept(lines: Iterable[str], keep: np.ndarray | None) -> Iterator[str]:
    """The lines with text, those ``keep`` marks (all for ``None``)."""
    texts = (s for s in lines if s.strip())
    if keep is None:
        yield from texts
    else:
        yield from (s for s, kept in zip(texts, keep, strict=False) if kept)
