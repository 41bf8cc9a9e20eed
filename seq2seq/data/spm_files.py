"""The SentencePiece model file of a run: named by the training split's content and the
settings, trained once into it and reused by every later run."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from seq2seq.data.corpus import CorpusSplit
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
        raise ValueError(
            f"The training split {train.split!r} is empty: {train.describe()} has "
            "no sentence pairs with text (no lines, or blank ones only), so no "
            "SentencePiece model can be trained."
        )
    rank_zero_info(
        f"Training a {settings.model_type} SentencePiece model with "
        f"{settings.vocab_size} pieces on {train.describe()} -> {path}"
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
