"""The tokenised Arrow cache: each split's ids, keyed by the corpus content and the
SentencePiece model, written once and memory-mapped by every later run."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.arrow_writer import ArrowWriter

from seq2seq.data.corpus import CorpusSplit
from seq2seq.data.tokenizer import Tokenizer, flatten_ids, id_dtype
from seq2seq.files import WriteError, write_error
from seq2seq.temporaries import make_temporary_folder, remove_abandoned

CACHE_VERSION = "2"  # bump when the layout of the tokenised Arrow cache changes
ENCODE_CHUNK = 10_000  # sentence pairs tokenised (or read for SentencePiece) at a time


def _arrow_lists(values: np.ndarray, offsets: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))


def tokenized_split(
    corpus: CorpusSplit,
    tokenizer: Tokenizer,
    folder: Path,
    pair: str,
    fingerprint: str,
    streaming: bool = False,
    kind: str = "split",
    languages: Mapping[str, str] | None = None,
) -> tuple[datasets.Dataset, bool]:
    """The split ``corpus`` as an Arrow table of ids, from the cache in ``folder`` or freshly
    tokenised into it (in a :func:`~seq2seq.temporaries.make_temporary_folder` renamed into
    place, or another process's table where it wrote one meanwhile); temporaries of any split
    that killed runs left in ``folder`` are removed first (see :mod:`seq2seq.temporaries`).

    Args:
        corpus: the split to read.
        tokenizer: the SentencePiece model (its bytes are part of the cache key).
        folder: the cache folder (``<cache_dir>/tokenized``).
        pair: the language pair as in the cache's folder names (``"deen"``).
        fingerprint: the corpus content's digest (part of the cache key).
        streaming: read a Hub dataset as a stream while tokenising.
        kind: what the split is, for the error of an empty one (``"held-out split"``).
        languages: ``src_lang`` / ``tgt_lang`` keywords of ``tokenizer.encode`` (a tagged
            model's sources start with the target's tag); part of the key when given.

    Returns:
        The table (``index``, ``src_text``, ``tgt_text``, ``src``, ``tgt``), whether made now.

    Raises:
        ValueError: if the split holds no pairs.
        WriteError: (an ``OSError``) naming the cache folder if the machine refuses to write
            the table (a full disk, ...); nothing of it is kept. Other ``OSError``: as raised.
    """
    languages = dict(languages or {})
    # Without languages the key is the bilingual one it always was; the fingerprint already
    # covers the pair's languages, the encoding keywords are added where they are used.
    encoding = "".join(f"{k}={v}|" for k, v in sorted(languages.items()))
    key = hashlib.sha256(
        f"{CACHE_VERSION}|{fingerprint}|{encoding}".encode()
        + hashlib.sha256(tokenizer.to_bytes()).digest()
    ).hexdigest()[:16]
    path = folder / f"{corpus.split}_{pair}_{key}"
    table_file = path / "data.arrow"
    remove_abandoned(folder, "*_*_" + "?" * len(key))  # any split's, left by killed runs
    if table_file.is_file():
        return datasets.Dataset.from_file(str(table_file)), False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = make_temporary_folder(path.parent, path.name)
    except OSError as err:
        raise write_error(err, path, "Nothing of the cache was kept.") from err
    try:
        n_pairs = write_tokenized(corpus, tokenizer, tmp / table_file.name, streaming, languages)
        if n_pairs == 0:
            raise ValueError(f"The {kind} {corpus.split!r} is empty: {corpus.describe()}.")
        os.rename(tmp, path)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if not table_file.is_file():  # not written meanwhile by another process
            if isinstance(err, WriteError):  # named by the cache's place, not the temporary one
                raise WriteError(path, err.errno, err.strerror, err.kept) from err
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return datasets.Dataset.from_file(str(table_file)), True


def cached_split(
    corpus: CorpusSplit,
    tokenizer: Tokenizer,
    cache_dir: Path,
    streaming: bool,
    training: bool,
    languages: Mapping[str, str] | None = None,
) -> tuple[datasets.Dataset, bool]:
    """:func:`tokenized_split` into ``<cache_dir>/tokenized``, keyed by the corpus content's
    digest (for a Hub dataset read as a stream, one that downloads nothing) and ``languages``;
    ``training``: whether ``corpus`` is the training split, for the error of an empty one."""
    if streaming and corpus.format == "hf_hub":
        fingerprint = corpus.stream_fingerprint()
    else:
        fingerprint = corpus.fingerprint()
    kind = "training split" if training else "held-out split"
    pair = f"{corpus.src_lang}{corpus.tgt_lang}"
    folder = Path(cache_dir) / "tokenized"
    return tokenized_split(corpus, tokenizer, folder, pair, fingerprint, streaming, kind, languages)


def write_tokenized(
    corpus: CorpusSplit,
    tokenizer: Tokenizer,
    file: Path,
    streaming: bool = False,
    languages: Mapping[str, str] | None = None,
) -> int:
    """Tokenises the split a chunk at a time straight into an Arrow file (both sides encoded
    with ``languages``, ``tokenizer.encode``'s ``src_lang`` / ``tgt_lang``); returns its rows.

    Only one chunk of text and ids is in memory at a time. Ids are stored as uint16 when
    the vocabulary allows it (int32 otherwise).

    Raises:
        WriteError: (an ``OSError``) naming ``file`` if the machine refuses to write it.
    """
    id_type = id_dtype(tokenizer.vocab_size)
    ids = datasets.List(datasets.Value(id_type.name))
    features = datasets.Features(
        {
            "index": datasets.Value("int64"),
            "src_text": datasets.Value("string"),
            "tgt_text": datasets.Value("string"),
            "src": ids,
            "tgt": ids,
        }
    )
    n_pairs, languages = 0, dict(languages or {})
    with _writing(file):
        writer = ArrowWriter(features=features, path=str(file))
    with writer:
        for src, tgt in corpus.iter_chunks(ENCODE_CHUNK, streaming=streaming):
            chunk = {
                "index": pa.array(np.arange(n_pairs, n_pairs + len(src))),
                "src_text": pa.array(src, pa.string()),
                "tgt_text": pa.array(tgt, pa.string()),
                "src": _arrow_lists(*flatten_ids(tokenizer.encode(src, **languages), id_type)),
                "tgt": _arrow_lists(
                    *flatten_ids(tokenizer.encode(tgt, side="target", **languages), id_type)
                ),
            }
            with _writing(file):
                writer.write_table(pa.table(chunk))
            n_pairs += len(src)
        with _writing(file):
            writer.finalize()
    return n_pairs


@contextmanager
def _writing(file: Path) -> Iterator[None]:
    """An ``OSError`` of writing the cache's ``file`` (a full disk, ...) as a
    :class:`~seq2seq.files.WriteError`; the corpus is only read outside such a block, so its
    own errors (a missing or corrupt file) stay as they are."""
    try:
        yield
    except OSError as err:
        raise write_error(
            err, file, "Nothing of the cache was kept (the corpus files are untouched)."
        ) from err


def token_lengths(table: datasets.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Numbers of source and target ids per row, without EOS/BOS (unselected tables)."""
    return tuple(
        np.asarray(pc.list_value_length(table.data.column(name)), dtype=np.int64)
        for name in ("src", "tgt")
    )
