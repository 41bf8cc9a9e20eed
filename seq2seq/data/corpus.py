"""Reading and checking parallel corpora.

A split of a parallel corpus (``train``, ``val``, ``test_2016_flickr``, ...) can live in:

* two aligned text files ``<split>.<src>`` / ``<split>.<tgt>`` (each optionally ``.gz``),
  one sentence per line;
* a TSV file ``<split>.tsv[.gz]`` with two tab-separated columns: source then target, unless
  an optional header line (``de<TAB>en``, see :func:`read_tsv`) names the column languages;
* a JSON-lines file ``<split>.jsonl[.gz]`` whose lines are either
  ``{"translation": {"de": ..., "en": ...}}`` (the Hugging Face layout) or flat
  ``{"de": ..., "en": ...}``;
* a Parquet file ``<split>.parquet`` with either of the two JSON layouts as columns;
* a Hugging Face ``datasets`` dataset: a folder written by ``save_to_disk`` (a
  ``DatasetDict`` in the data folder itself, or one ``Dataset`` per ``<split>/`` folder), or a
  dataset on the Hub loaded with ``load_dataset(name, config, split=split)``.

In every case the languages to read are the ``src_lang`` / ``tgt_lang`` settings.

Text is read as strict UTF-8 and split on ``"\\n"`` only: a trailing ``"\\r"`` is removed,
while other line-breaking characters (U+2028, U+2029, U+0085, form feed) stay inside the
sentence, so line counts always agree with ``wc -l`` and aligned files stay aligned.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path

from seq2seq import compat
from seq2seq.temporaries import remove_abandoned, temporary_prefix

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
"""Where :func:`download_multi30k` fetches the Multi30k task-1 files from."""

MULTI30K_SHA256: dict[str, str] = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}
"""SHA-256 of each Multi30k German-English file (task 1, raw)."""

_GZIP_MAGIC = b"\x1f\x8b"


# ---------------------------------------------------------------------- plain files
def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a text file")
    if not path.is_file():
        raise FileNotFoundError(f"Corpus file not found: {path}")
    data = path.read_bytes()
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise ValueError(f"{path} is not a readable gzip file: {err}") from err
    return data


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_lines(path: str | Path) -> list[str]:
    """Reads a text file (plain or gzip-compressed) as a list of lines.

    The file is decoded as strict UTF-8 (a UTF-8 byte-order mark at its start is dropped) and
    split on ``"\\n"`` only; one trailing ``"\\r"`` per line is removed, nothing else is
    stripped. A final newline does not create an extra empty line. Compression is detected
    from the gzip magic bytes, not the file name.

    Args:
        path: The file.

    Returns:
        The lines, without line terminators.

    Raises:
        FileNotFoundError: If ``path`` does not exist (the message names it).
        ValueError: If the file is not valid UTF-8, naming the file and the 1-based line, or
            if it looks gzip-compressed but cannot be decompressed.
    """
    path = Path(path)
    return decode_lines(_read_bytes(path), str(path))


def decode_lines(data: bytes, name: str) -> list[str]:
    """Splits UTF-8 text into lines by the rules of :func:`read_lines` (e.g. for stdin).

    Args:
        data: the raw bytes.
        name: how errors name the source (a path, ``"<stdin>"``).

    Returns:
        The lines, without line terminators.

    Raises:
        ValueError: if ``data`` is not valid UTF-8, naming ``name`` and the 1-based line.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(
            f"{name}, line {line}: invalid UTF-8 ({err.reason} at byte {column} of the line)."
        ) from err
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def iter_lines(path: str | Path) -> Iterator[str]:
    """Reads a text file (plain or gzip-compressed) line by line, as :func:`read_lines` does.

    The same rules apply (strict UTF-8, a leading byte-order mark dropped, split on ``"\\n"``
    only, one trailing ``"\\r"`` removed), but only one line is held at a time, so files
    larger than memory can be read.

    Args:
        path: The file.

    Yields:
        The lines, without line terminators.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: On invalid UTF-8 (naming the file and the 1-based line) or a corrupt gzip
            stream.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Corpus file not found: {path}")
    with open(path, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw) if compressed else raw
        try:
            for number, line in enumerate(stream, start=1):
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ValueError(
                        f"{path}, line {number}: invalid UTF-8 ({err.reason} at byte "
                        f"{err.start + 1} of the line)."
                    ) from err
                if number == 1 and text.startswith("\ufeff"):
                    text = text[1:]
                    if not text:
                        continue
                if text.endswith("\n"):
                    text = text[:-1]
                yield text[:-1] if text.endswith("\r") else text
        except (OSError, EOFError) as err:
            if not compressed:
                raise
            raise ValueError(f"{path} is not a readable gzip file: {err}") from err


def _misaligned(src_path, tgt_path, n_src: int, n_tgt: int) -> ValueError:
    return ValueError(
        f"Parallel files are misaligned: {src_path} has {n_src} lines but {tgt_path} "
        f"has {n_tgt} lines; line i of one must translate line i of the other."
    )


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Reads two aligned text files, line ``i`` of one translating line ``i`` of the other.

    Args:
        src_path: Source-language file (plain or ``.gz``).
        tgt_path: Target-language file (plain or ``.gz``).

    Returns:
        ``(src_lines, tgt_lines)`` of equal length.

    Raises:
        FileNotFoundError: If either file is missing.
        ValueError: If the files have different numbers of lines (naming both files and both
            counts), or on invalid UTF-8.
    """
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise _misaligned(src_path, tgt_path, len(src), len(tgt))
    return src, tgt


def iter_parallel(src_path: str | Path, tgt_path: str | Path) -> Iterator[tuple[str, str]]:
    """Reads two aligned text files pair by pair, as :func:`read_parallel` does.

    Args:
        src_path: Source-language file (plain or ``.gz``).
        tgt_path: Target-language file (plain or ``.gz``).

    Yields:
        ``(src_line, tgt_line)``.

    Raises:
        FileNotFoundError: If either file is missing.
        ValueError: When one file ends before the other (raised after the last complete
            pair, naming both files and both line counts), or on invalid UTF-8.
    """
    src_lines, tgt_lines = iter_lines(src_path), iter_lines(tgt_path)
    n = 0
    for src in src_lines:
        tgt = next(tgt_lines, None)
        if tgt is None:
            raise _misaligned(src_path, tgt_path, n + 1 + sum(1 for _ in src_lines), n)
        n += 1
        yield src, tgt
    rest = sum(1 for _ in tgt_lines)
    if rest:
        raise _misaligned(src_path, tgt_path, n, n + rest)


def find_split(data_dir: str | Path, split: str, lang: str) -> Path:
    """Finds the text file of one side of a split: ``<data_dir>/<split>.<lang>[.gz]``.

    Args:
        data_dir: Folder holding the corpus.
        split: Split name, e.g. ``"train"`` or ``"test_2016_flickr"``.
        lang: Language code, e.g. ``"de"``.

    Returns:
        The first existing of ``<split>.<lang>`` and ``<split>.<lang>.gz``.

    Raises:
        FileNotFoundError: Listing the paths looked for.
    """
    candidates = [Path(data_dir) / f"{split}.{lang}", Path(data_dir) / f"{split}.{lang}.gz"]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"No {lang!r} file for split {split!r}: looked for "
        + " and ".join(str(p) for p in candidates)
    )


def read_tsv(
    path: str | Path, src_lang: str | None = None, tgt_lang: str | None = None
) -> tuple[list[str], list[str]]:
    """Reads a two-column TSV file of sentence pairs, plain or gzip-compressed.

    Blank lines (no tab, nothing but white space) hold no record and are skipped, as in JSON lines
    (and pandas' ``read_csv``); a pair with both sides empty is a line holding just the tab.

    Which column is the source: with ``src_lang`` and ``tgt_lang`` given, the first non-blank
    line may be a header naming the two languages, e.g. ``de<TAB>en``, in either order: it is
    not a pair, and the column headed ``src_lang`` is the source (so ``en<TAB>de`` read with
    ``src_lang="de"`` swaps the columns). Without a header, or with ``src_lang`` and
    ``tgt_lang`` left None (no header detection: a header line is read as a pair), column 1 is
    the source and column 2 the target, whatever the languages.

    Args:
        path: The file.
        src_lang: Source language code, for the header; None reads no header.
        tgt_lang: Target language code, for the header; None reads no header.

    Returns:
        ``(src_lines, tgt_lines)``, of equal length, without the header.

    Raises:
        FileNotFoundError: If ``path`` is missing.
        ValueError: If a non-blank line does not have exactly two tab-separated fields
            (naming the file and the 1-based line), on invalid UTF-8, if only one of
            ``src_lang`` and ``tgt_lang`` is given, or if the first non-blank line looks like a
            header (two language codes: 2-3 letters, all lower or all upper case, optionally
            with ``-``/``_`` subtags such as ``pt_BR``), one of them ``src_lang`` or
            ``tgt_lang`` in any case, but does not name exactly ``src_lang`` and ``tgt_lang``
            (naming the file, the line, the codes found and the codes expected). Two short
            words naming neither (``die<TAB>the``) are a sentence pair.
    """
    return _unzip(iter_tsv(path, src_lang, tgt_lang))


_LANG_CODE = re.compile(r"(?:[a-z]{2,3}|[A-Z]{2,3})(?:[-_][A-Za-z0-9]{2,8})*")
"""What a TSV header field looks like: ``de``, ``eng``, ``pt_BR``, ``zh-Hans``, ``EN``."""


def iter_tsv(
    path: str | Path, src_lang: str | None = None, tgt_lang: str | None = None
) -> Iterator[tuple[str, str]]:
    """Reads a two-column TSV file pair by pair (see :func:`read_tsv`).

    Args:
        path: The file.
        src_lang: Source language code, for the header; None reads no header.
        tgt_lang: Target language code, for the header; None reads no header.

    Yields:
        ``(src, tgt)``; a header line yields nothing.

    Raises:
        FileNotFoundError: If ``path`` is missing.
        ValueError: As :func:`read_tsv` (on the offending line, after the pairs before it).
    """
    if (src_lang is None) != (tgt_lang is None):
        raise ValueError(
            f"Reading {path}: give both src_lang and tgt_lang (for the TSV header) or neither; "
            f"got src_lang={src_lang!r}, tgt_lang={tgt_lang!r}."
        )
    first, swap = src_lang is not None, False
    for number, line in enumerate(iter_lines(path), start=1):
        if "\t" not in line and not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{path}, line {number}: expected 2 tab-separated fields (source, target), "
                f"found {len(fields)}."
            )
        if first:
            first = False
            header = _tsv_header(fields, src_lang, tgt_lang, f"{path}, line {number}")
            if header is not None:
                swap = header
                continue
        yield (fields[1], fields[0]) if swap else (fields[0], fields[1])


def _tsv_header(fields: list[str], src_lang: str, tgt_lang: str, where: str) -> bool | None:
    """Whether the first line ``fields`` is a header with the columns (target, source) (True)
    or (source, target) (False); None if it is a sentence pair. Raises ValueError for a header
    of other languages."""
    codes = [field.strip() for field in fields]
    if codes == [src_lang, tgt_lang]:
        return False
    if codes == [tgt_lang, src_lang]:
        return True
    mine = {src_lang.lower(), tgt_lang.lower()}
    if all(_LANG_CODE.fullmatch(code) for code in codes) and mine & {c.lower() for c in codes}:
        raise ValueError(
            f"{where}: the header names the languages {codes[0]!r} and {codes[1]!r}, but "
            f"data.src_lang={src_lang!r} and data.tgt_lang={tgt_lang!r}; a TSV header must "
            f"name exactly these two ({src_lang}<TAB>{tgt_lang} or {tgt_lang}<TAB>{src_lang}). "
            "Set --data.src_lang and --data.tgt_lang to the file's languages, fix the header, "
            f"or, if this line is a sentence pair, put the header {src_lang}<TAB>{tgt_lang} "
            "before it."
        )
    return None


def _unzip(pairs: Iterator[tuple[str, str]]) -> tuple[list[str], list[str]]:
    src, tgt = [], []
    for s, t in pairs:
        src.append(s)
        tgt.append(t)
    return src, tgt


def _pair_from_record(record: object, src_lang: str, tgt_lang: str, where: str) -> tuple[str, str]:
    if isinstance(record, Mapping) and isinstance(record.get("translation"), Mapping):
        record = record["translation"]
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: expected a JSON object, found {type(record).__name__}.")
    missing = [lang for lang in (src_lang, tgt_lang) if lang not in record]
    if missing:
        raise ValueError(
            f"{where}: no {' / '.join(map(repr, missing))} field; the record has keys "
            f"{sorted(record)} (expected {{'translation': {{{src_lang!r}: ..., {tgt_lang!r}: "
            f"...}}}} or {{{src_lang!r}: ..., {tgt_lang!r}: ...}})."
        )
    pair = record[src_lang], record[tgt_lang]
    if not all(isinstance(text, str) for text in pair):
        raise ValueError(f"{where}: the {src_lang!r} and {tgt_lang!r} values must be strings.")
    return pair


def read_jsonl(path: str | Path, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Reads a JSON-lines file of translation pairs, plain or gzip-compressed.

    Each non-blank line is ``{"translation": {src_lang: ..., tgt_lang: ...}}`` or
    ``{src_lang: ..., tgt_lang: ...}``; blank lines are skipped and other keys ignored.

    Args:
        path: The file.
        src_lang: Key of the source sentence.
        tgt_lang: Key of the target sentence.

    Returns:
        ``(src_lines, tgt_lines)``.

    Raises:
        FileNotFoundError: If ``path`` is missing.
        ValueError: On invalid JSON, a missing language key or a non-string value, naming the
            file and the 1-based line; or on invalid UTF-8.
    """
    return _unzip(iter_jsonl(path, src_lang, tgt_lang))


def iter_jsonl(path: str | Path, src_lang: str, tgt_lang: str) -> Iterator[tuple[str, str]]:
    """Reads a JSON-lines file of translation pairs pair by pair (see :func:`read_jsonl`)."""
    for number, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: invalid JSON ({err.msg}).") from err
        yield _pair_from_record(record, src_lang, tgt_lang, where)


# ---------------------------------------------------------------------- Hugging Face datasets
def read_hf_dataset(dataset, src_lang: str, tgt_lang: str, name: str = "dataset"):
    """Extracts the sentence pairs of a Hugging Face ``datasets.Dataset``.

    Args:
        dataset: A ``datasets.Dataset`` with a ``translation`` column of
            ``{src_lang: ..., tgt_lang: ...}`` dicts, or with ``src_lang`` and ``tgt_lang``
            string columns.
        src_lang: Source language code.
        tgt_lang: Target language code.
        name: Description used in error messages.

    Returns:
        ``(src_lines, tgt_lines)`` as lists of ``str``.

    Raises:
        ValueError: If neither layout is present, naming the columns found, or if a value is
            not a string.
    """
    columns = _pair_columns(dataset.column_names, src_lang, tgt_lang, name)
    return _pairs_of_batch(dataset.select_columns(columns)[:], src_lang, tgt_lang, name)


def _pair_columns(columns: Sequence[str], src_lang: str, tgt_lang: str, name: str) -> list[str]:
    """The columns holding the pairs: ``["translation"]`` or ``[src_lang, tgt_lang]``."""
    if "translation" in columns:
        return ["translation"]
    if src_lang in columns and tgt_lang in columns:
        return [src_lang, tgt_lang]
    raise ValueError(
        f"{name} has columns {list(columns)}; expected a 'translation' column of "
        f"{{{src_lang!r}: ..., {tgt_lang!r}: ...}} or the columns {src_lang!r} and "
        f"{tgt_lang!r}."
    )


def _pairs_of_batch(
    batch: Mapping[str, Sequence], src_lang: str, tgt_lang: str, name: str, first_row: int = 0
) -> tuple[list[str], list[str]]:
    """``(src_lines, tgt_lines)`` of a column batch in either layout, checked to be strings."""
    if "translation" in batch:
        pairs = batch["translation"]
        for row, pair in enumerate(pairs, start=first_row):
            for lang in (src_lang, tgt_lang):
                if isinstance(pair, Mapping) and lang not in pair:
                    raise ValueError(
                        f"{name}, row {row}: its 'translation' has no {lang!r}; it has "
                        f"{sorted(pair)} (set --data.src_lang and --data.tgt_lang to two of them)."
                    )
        src = [pair.get(src_lang) if pair else None for pair in pairs]
        tgt = [pair.get(tgt_lang) if pair else None for pair in pairs]
    else:
        src, tgt = list(batch[src_lang]), list(batch[tgt_lang])
    for side, lang in ((src, src_lang), (tgt, tgt_lang)):
        for row, text in enumerate(side, start=first_row):
            if not isinstance(text, str):
                raise ValueError(f"{name}, row {row}: {lang!r} is {text!r}, not a string.")
    return src, tgt


def _load_from_disk(path: Path, split: str):
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise FileNotFoundError(
                f"Split {split!r} not found in the dataset saved at {path}; it has "
                f"{sorted(loaded)}."
            )
        return loaded[split]
    return loaded


# ---------------------------------------------------------------------- locating splits
@dataclass(frozen=True)
class CorpusSplit:
    """Where one split of a parallel corpus lives, and how to read it.

    Build it with :func:`locate_split`.

    Attributes:
        split: Split name.
        src_lang: Source language code.
        tgt_lang: Target language code.
        format: One of ``"text"``, ``"tsv"``, ``"jsonl"``, ``"parquet"``, ``"hf_disk"``,
            ``"hf_hub"``.
        paths: The files or folder read (two files for ``"text"``); empty for ``"hf_hub"``.
        hf_name: Dataset name on the Hub (``"hf_hub"`` only).
        hf_config: Dataset configuration on the Hub (``"hf_hub"`` only).
    """

    split: str
    src_lang: str
    tgt_lang: str
    format: str
    paths: tuple[Path, ...] = ()
    hf_name: str | None = None
    hf_config: str | None = None

    def reversed(self) -> CorpusSplit:
        """The same split read in the other direction (source and target swapped)."""
        paths = self.paths[::-1] if self.format == "text" else self.paths
        return replace(self, src_lang=self.tgt_lang, tgt_lang=self.src_lang, paths=paths)

    def describe(self) -> str:
        """Human-readable location, for messages (e.g. ``data/train.de.gz + data/train.en.gz``)."""
        if self.format == "hf_hub":
            config = f", config {self.hf_config!r}" if self.hf_config else ""
            return f"Hugging Face dataset {self.hf_name!r}{config}, split {self.split!r}"
        if self.format == "hf_disk":
            return f"saved dataset {self.paths[0]} (split {self.split!r})"
        return " + ".join(str(p) for p in self.paths)

    def _hf_dataset(self, streaming: bool = False):
        """The split as a ``datasets.Dataset`` (or ``IterableDataset`` from the Hub when
        streaming); Parquet files are read whole (only :meth:`fingerprint` and
        :meth:`read` use this for them)."""
        if self.format == "hf_hub":
            import datasets

            return datasets.load_dataset(
                self.hf_name, self.hf_config, split=self.split, streaming=streaming
            )
        if self.format == "hf_disk":
            return _load_from_disk(self.paths[0], self.split)
        import datasets
        import pyarrow.parquet as pq

        return datasets.Dataset(pq.read_table(self.paths[0]))

    def iter_chunks(
        self, size: int = 10_000, start: int = 0, streaming: bool = False
    ) -> Iterator[tuple[list[str], list[str]]]:
        """Reads the sentence pairs in chunks, holding one chunk at a time.

        Args:
            size: Pairs per chunk; every chunk but the last has exactly this many.
            start: Skip the first ``start`` pairs (they are read, or for Parquet and saved
                datasets skipped by position, but not returned).
            streaming: Read a dataset on the Hub with ``load_dataset(..., streaming=True)``
                instead of downloading and caching it first. Every other format is read
                incrementally anyway.

        Yields:
            ``(src_lines, tgt_lines)`` of equal length, ``size`` pairs at most.

        Raises:
            FileNotFoundError: If a file is missing.
            ValueError: As :meth:`read`.
        """
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}.")
        if self.format in ("text", "tsv", "jsonl"):
            if self.format == "text":
                pairs = iter_parallel(*self.paths)
            elif self.format == "tsv":
                pairs = iter_tsv(self.paths[0], self.src_lang, self.tgt_lang)
            else:
                pairs = iter_jsonl(self.paths[0], self.src_lang, self.tgt_lang)
            next(islice(pairs, start, start), None)  # skips `start` pairs
            while chunk := list(islice(pairs, size)):
                yield _unzip(iter(chunk))
        elif self.format == "parquet":
            yield from self._parquet_chunks(size, start)
        elif self.format == "hf_hub" and streaming:
            dataset = self._hf_dataset(streaming=True)
            columns = dataset.column_names
            if columns is None:  # features unknown until the first example is read
                columns = list(next(dataset.take(1).iter(batch_size=1), {}))
            columns = _pair_columns(columns, self.src_lang, self.tgt_lang, self.describe())
            dataset = dataset.select_columns(columns)
            if start:
                dataset = dataset.skip(start)
            row = start
            # ``iter`` reads the whole stream in every process (``__iter__`` would give a
            # DataLoader worker only its share of the shards).
            for batch in dataset.iter(batch_size=size):
                chunk = _pairs_of_batch(batch, self.src_lang, self.tgt_lang, self.describe(), row)
                row += len(chunk[0])
                yield chunk
        else:
            dataset = self._hf_dataset()
            name = self.describe()
            columns = _pair_columns(dataset.column_names, self.src_lang, self.tgt_lang, name)
            dataset = dataset.select_columns(columns)
            for row in range(start, len(dataset), size):
                batch = dataset[row : row + size]
                yield _pairs_of_batch(batch, self.src_lang, self.tgt_lang, name, row)

    def _parquet_chunks(self, size: int, start: int) -> Iterator[tuple[list[str], list[str]]]:
        import pyarrow.parquet as pq

        name = str(self.paths[0])
        parquet = pq.ParquetFile(self.paths[0])
        columns = _pair_columns(parquet.schema_arrow.names, self.src_lang, self.tgt_lang, name)
        groups, row = [], 0
        for group in range(parquet.metadata.num_row_groups):  # skip whole leading row groups
            rows = parquet.metadata.row_group(group).num_rows
            if not groups and row + rows <= start:
                row += rows
            else:
                groups.append(group)
        skip = start - row
        pending: tuple[list[str], list[str]] = ([], [])
        for record_batch in parquet.iter_batches(size, row_groups=groups, columns=columns):
            batch = record_batch.to_pydict()
            src, tgt = _pairs_of_batch(batch, self.src_lang, self.tgt_lang, name, row)
            row += len(src)
            if skip:
                cut = min(skip, len(src))
                src, tgt, skip = src[cut:], tgt[cut:], skip - cut
            pending = (pending[0] + src, pending[1] + tgt)
            while len(pending[0]) >= size:
                yield pending[0][:size], pending[1][:size]
                pending = (pending[0][size:], pending[1][size:])
        if pending[0]:
            yield pending

    def read(self) -> tuple[list[str], list[str]]:
        """Reads the sentence pairs.

        Returns:
            ``(src_lines, tgt_lines)`` of equal length.

        Raises:
            FileNotFoundError: If a file is missing.
            ValueError: On misaligned files, invalid UTF-8, or malformed records (see the
                ``read_*`` functions).
        """
        if self.format == "text":
            return read_parallel(*self.paths)
        if self.format == "tsv":
            return read_tsv(self.paths[0], self.src_lang, self.tgt_lang)
        if self.format == "jsonl":
            return read_jsonl(self.paths[0], self.src_lang, self.tgt_lang)
        return read_hf_dataset(self._hf_dataset(), self.src_lang, self.tgt_lang, self.describe())

    def fingerprint(self) -> str:
        """A hex digest that changes whenever the split's content or languages change.

        Files are hashed byte for byte (without decoding them); Hugging Face datasets
        contribute their own ``_fingerprint``.
        """
        digest = hashlib.sha256(
            f"{self.format}|{self.split}|{self.src_lang}|{self.tgt_lang}".encode()
        )
        if self.format in ("hf_hub", "hf_disk"):
            digest.update(compat.dataset_fingerprint(self._hf_dataset()).encode())
        else:
            for path in self.paths:
                digest.update(_sha256(path).encode())
        return digest.hexdigest()

    def stream_fingerprint(self) -> str:
        """A hex digest of where the split is, for corpora too large to hash or download.

        It covers the format, split, languages, Hub name and configuration, and each file's
        resolved path, size and modification time (for a saved dataset, its own
        fingerprint), without reading the data.
        """
        digest = hashlib.sha256(
            f"stream|{self.format}|{self.split}|{self.src_lang}|{self.tgt_lang}|"
            f"{self.hf_name}|{self.hf_config}".encode()
        )
        if self.format == "hf_disk":
            digest.update(compat.dataset_fingerprint(self._hf_dataset()).encode())
        else:
            for path in self.paths:
                stat = path.stat()
                digest.update(f"|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
        return digest.hexdigest()


def locate_split(
    data_dir: str | Path,
    split: str,
    src_lang: str,
    tgt_lang: str,
    hf_dataset: str | None = None,
    hf_config: str | None = None,
) -> CorpusSplit:
    """Finds one split of a parallel corpus.

    With ``hf_dataset`` set, that is a folder written by ``save_to_disk`` if such a folder
    exists, otherwise a dataset name on the Hugging Face Hub (loaded with ``hf_config``); a
    configuration named after a language pair (``"de-en"``) must hold ``src_lang`` and
    ``tgt_lang``, in either order.
    Otherwise ``data_dir`` is searched, first match wins: a ``save_to_disk`` ``DatasetDict``
    in ``data_dir`` itself; ``<split>.<src_lang>[.gz]`` with ``<split>.<tgt_lang>[.gz]``;
    ``<split>.tsv[.gz]``; ``<split>.jsonl[.gz]``; ``<split>.parquet``; a ``save_to_disk``
    ``Dataset`` in ``<split>/``.

    Args:
        data_dir: Folder holding the corpus.
        split: Split name.
        src_lang: Source language code.
        tgt_lang: Target language code.
        hf_dataset: Hugging Face dataset name or ``save_to_disk`` folder, or None.
        hf_config: Hugging Face dataset configuration (e.g. ``"de-en"``), or None.

    Returns:
        The split's location.

    Raises:
        FileNotFoundError: If ``data_dir`` is not a folder (saying so), if nothing is found in
            it, listing every path looked for; or if only one side of a pair of text files
            exists, naming the missing side.
        ValueError: If ``hf_config`` names a language pair other than ``src_lang`` and
            ``tgt_lang``.
    """

    def found(fmt: str, *paths: Path) -> CorpusSplit:
        return CorpusSplit(split, src_lang, tgt_lang, fmt, tuple(paths))

    if hf_dataset is not None:
        path = Path(hf_dataset)
        if path.is_dir():
            return found("hf_disk", path)
        pair = hf_config.split("-") if hf_config and hf_config.count("-") == 1 else None
        if pair and sorted(pair) != sorted((src_lang, tgt_lang)):
            raise ValueError(
                f"data.hf_config {hf_config!r} holds {pair[0]!r}-{pair[1]!r} pairs, but "
                f"src_lang={src_lang!r} and tgt_lang={tgt_lang!r}; set data.src_lang and "
                f"data.tgt_lang to the config's languages (in either direction)."
            )
        return CorpusSplit(split, src_lang, tgt_lang, "hf_hub", (), hf_dataset, hf_config)

    root = Path(data_dir)
    if (root / "dataset_dict.json").is_file():
        return found("hf_disk", root)
    src_candidates = [root / f"{split}.{src_lang}", root / f"{split}.{src_lang}.gz"]
    tgt_candidates = [root / f"{split}.{tgt_lang}", root / f"{split}.{tgt_lang}.gz"]
    if any(p.is_file() for p in src_candidates + tgt_candidates):
        return found(
            "text",
            find_split(root, split, src_lang),
            find_split(root, split, tgt_lang),
        )
    single = {
        "tsv": [root / f"{split}.tsv", root / f"{split}.tsv.gz"],
        "jsonl": [root / f"{split}.jsonl", root / f"{split}.jsonl.gz"],
        "parquet": [root / f"{split}.parquet"],
    }
    for fmt, candidates in single.items():
        for path in candidates:
            if path.is_file():
                return found(fmt, path)
    if (root / split / "state.json").is_file():
        return found("hf_disk", root / split)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise FileNotFoundError(
            f"No {src_lang}-{tgt_lang} data for split {split!r}: data.data_dir {root} {what}. "
            "Point `data.data_dir` at the corpus folder or set `data.hf_dataset`."
        )
    looked = [*src_candidates, *tgt_candidates, *(p for c in single.values() for p in c)]
    looked += [root / "dataset_dict.json", root / split / "state.json"]
    raise FileNotFoundError(
        f"No {src_lang}-{tgt_lang} data for split {split!r} in {root}; looked for: "
        + ", ".join(str(p) for p in looked)
        + ". Point `data.data_dir` at the corpus folder or set `data.hf_dataset`."
    )


# ---------------------------------------------------------------------- download
def download_multi30k(
    data_dir: str | Path,
    base_url: str = MULTI30K_URL,
    files: Mapping[str, str] | Sequence[str] | None = None,
    timeout: float = 60.0,
) -> list[Path]:
    """Downloads the Multi30k German-English files that are missing from ``data_dir``.

    Each file is fetched from ``<base_url>/<name>`` into a temporary file next to its
    destination, checked against its SHA-256, and only then renamed into place, so an
    interrupted or corrupt download never leaves a file under the final name. Files already
    present are left untouched.

    Args:
        data_dir: Destination folder (created if needed).
        base_url: URL of the folder holding the files.
        files: File names to fetch, as a mapping to their SHA-256 or a list of names from
            :data:`MULTI30K_SHA256`; None fetches all six German-English files.
        timeout: Seconds to wait on the network per request.

    Returns:
        The paths of the files that were downloaded.

    Raises:
        ValueError: If a downloaded file's SHA-256 differs from the expected one (naming the
            file, the expected and actual hash); the download is discarded. Also for a file
            name without a known hash.
        ConnectionError: If the server cannot be reached or refuses a file, listing which files
            to put where by hand and that ``--data.data_dir`` can point to an existing copy
            (an ``OSError``: the command line reports it in one line).
    """
    if files is None:
        files = MULTI30K_SHA256
    if not isinstance(files, Mapping):
        unknown = [name for name in files if name not in MULTI30K_SHA256]
        if unknown:
            raise ValueError(f"No known SHA-256 for {unknown}; pass files as {{name: sha256}}.")
        files = {name: MULTI30K_SHA256[name] for name in files}
    root = Path(data_dir)
    created = [p for p in (root, *root.parents) if not p.exists()]
    root.mkdir(parents=True, exist_ok=True)
    downloaded, failed = [], []
    for name, expected in files.items():
        dest = root / name
        if dest.is_file():
            continue
        url = f"{base_url.rstrip('/')}/{name}"
        remove_abandoned(root, name, ".part")  # downloads of killed runs
        fd, tmp_name = tempfile.mkstemp(dir=root, prefix=temporary_prefix(name), suffix=".part")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as r:
                while chunk := r.read(1 << 20):
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as err:
            tmp.unlink(missing_ok=True)
            failed.append((name, url, err))
            continue
        actual = _sha256(tmp)
        if actual != expected:
            tmp.unlink(missing_ok=True)
            raise ValueError(
                f"SHA-256 mismatch for {name} downloaded from {url}: expected {expected}, got "
                f"{actual}. The download was removed; fetch the file again or place a good "
                f"copy at {dest}."
            )
        os.replace(tmp, dest)
        downloaded.append(dest)
    if failed:
        for folder in created:  # leave no empty folder behind (a mistyped data_dir, say)
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        reasons = {str(err) for _, _, err in failed}
        if len(reasons) == 1:  # e.g. no network: one reason for every file
            details = f"{', '.join(url for _, url, _ in failed)} ({reasons.pop()})"
        else:
            details = "; ".join(f"{url} ({err})" for _, url, err in failed)
        raise ConnectionError(
            f"Could not download Multi30k: {details}. Put the files "
            f"{', '.join(name for name, _, _ in failed)} (from {base_url}) into {root}, or set "
            "`--data.data_dir` to a folder that already holds a copy (and `--data.download "
            "false` to skip downloading)."
        )
    return downloaded
