"""Where the splits of a parallel corpus live, and reading them.

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

In every case the languages to read are the ``src_lang`` / ``tgt_lang`` settings. A folder
``<data_dir>/<src>-<tgt>/`` (or ``<tgt>-<src>/``) holds the splits of that pair where it exists
(:func:`pair_folder`; one folder per pair of a multilingual run), else ``data_dir`` itself does
(e.g. one folder of multi-parallel files: ``train.de.gz``, ``train.fr.gz``, ``train.en.gz``). The
readers of each format, and how text is split into lines, are in :mod:`seq2seq.data.formats`
(importable from here too).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path

from seq2seq import compat
from seq2seq.data.formats import (
    count_lines,
    decode_lines,
    file_sha256,
    iter_jsonl,
    iter_lines,
    iter_parallel,
    iter_tsv,
    pair_columns,
    pairs_of_batch,
    read_hf_dataset,
    read_jsonl,
    read_lines,
    read_parallel,
    read_tsv,
    unzip_pairs,
)
from seq2seq.files import folders_alike
from seq2seq.spelling import did_you_mean

__all__ = [
    "CorpusSplit",
    "SplitNotFoundError",
    "decode_lines",
    "find_split",
    "iter_jsonl",
    "iter_lines",
    "iter_parallel",
    "iter_tsv",
    "locate_split",
    "pair_folder",
    "read_hf_dataset",
    "read_jsonl",
    "read_lines",
    "read_parallel",
    "read_tsv",
]


# ---------------------------------------------------------------------- locating splits
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
    suffixes = (p.name[len(split) + 1 :] for p in Path(data_dir).glob(f"{split}.*") if p.is_file())
    langs = sorted({name.removesuffix(".gz") for name in suffixes} - {""})
    has = f"; the folder has {split!r} in: {', '.join(langs)}" if langs else ""
    if lang != lang.lower() and lang.lower() in langs:  # codes are lower case: de, not DE
        has += f" (did you mean {lang.lower()!r}?)"
    raise FileNotFoundError(
        f"No {lang!r} file for split {split!r}: looked for "
        + " and ".join(str(p) for p in candidates)
        + has
    )


def pair_folder(data_dir: str | Path, src_lang: str, tgt_lang: str) -> Path:
    """The folder of a language pair's splits: ``<data_dir>/<src>-<tgt>`` or else
    ``<data_dir>/<tgt>-<src>`` where such a folder exists, otherwise ``data_dir`` itself."""
    for name in (f"{src_lang}-{tgt_lang}", f"{tgt_lang}-{src_lang}"):
        if (Path(data_dir) / name).is_dir():
            return Path(data_dir) / name
    return Path(data_dir)


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
                yield unzip_pairs(iter(chunk))
        elif self.format == "parquet":
            yield from self._parquet_chunks(size, start)
        elif self.format == "hf_hub" and streaming:
            dataset = self._hf_dataset(streaming=True)
            columns = dataset.column_names
            if columns is None:  # features unknown until the first example is read
                columns = list(next(dataset.take(1).iter(batch_size=1), {}))
            columns = pair_columns(columns, self.src_lang, self.tgt_lang, self.describe())
            dataset = dataset.select_columns(columns)
            if start:
                dataset = dataset.skip(start)
            row = start
            # ``iter`` reads the whole stream in every process (``__iter__`` would give a
            # DataLoader worker only its share of the shards).
            for batch in dataset.iter(batch_size=size):
                chunk = pairs_of_batch(batch, self.src_lang, self.tgt_lang, self.describe(), row)
                row += len(chunk[0])
                yield chunk
        else:
            dataset = self._hf_dataset()
            name = self.describe()
            columns = pair_columns(dataset.column_names, self.src_lang, self.tgt_lang, name)
            dataset = dataset.select_columns(columns)
            for row in range(start, len(dataset), size):
                batch = dataset[row : row + size]
                yield pairs_of_batch(batch, self.src_lang, self.tgt_lang, name, row)

    def count(self, chunk_size: int = 10_000) -> int:
        """The number of sentence pairs, read from the metadata of Parquet files, saved
        datasets and Hub datasets that record it, the newlines of text files, else by reading
        the pairs through (as :meth:`iter_chunks` with ``streaming=True``, so bad lines raise
        as there)."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(self.paths[0]).metadata.num_rows
        if self.format == "hf_disk":
            return len(self._hf_dataset())
        if self.format == "hf_hub":
            splits = self._hf_dataset(streaming=True).info.splits or {}
            known = splits.get(self.split)
            if known is not None and known.num_examples:
                return int(known.num_examples)
        if self.format == "text":  # the newlines; files of other lengths are read for the error
            counts = {count_lines(path) for path in self.paths}
            if len(counts) == 1:
                return counts.pop()
        return sum(len(src) for src, _ in self.iter_chunks(chunk_size, streaming=True))

    def _parquet_chunks(self, size: int, start: int) -> Iterator[tuple[list[str], list[str]]]:
        import pyarrow.parquet as pq

        name = str(self.paths[0])
        parquet = pq.ParquetFile(self.paths[0])
        columns = pair_columns(parquet.schema_arrow.names, self.src_lang, self.tgt_lang, name)
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
            src, tgt = pairs_of_batch(batch, self.src_lang, self.tgt_lang, name, row)
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
                digest.update(file_sha256(path).encode())
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


class SplitNotFoundError(FileNotFoundError):
    """No file of a split in a folder (neither side, nor a single-file format). ``problem``
    says what was looked for; ``advice`` what the folder suggests instead (a split of another
    name, the languages in lower case), or None where the folder suggests nothing and the
    message ends with where to point instead. Kept apart so that a caller that looks further
    (``data.pairs``' pair folders) can say so. One side of a pair of text files missing is a
    plain ``FileNotFoundError``."""

    def __init__(self, problem: str, advice: str | None = None) -> None:
        point = "Point `data.data_dir` at the corpus folder or set `data.hf_dataset`"
        super().__init__(f"{problem}. {advice or point}.")
        self.problem = problem
        self.advice = advice


def locate_split(
    data_dir: str | Path,
    split: str,
    src_lang: str,
    tgt_lang: str,
    hf_dataset: str | None = None,
    hf_config: str | None = None,
) -> CorpusSplit:
    """The location of one split of a parallel corpus (the layouts: the module docstring).

    With ``hf_dataset``: that ``save_to_disk`` folder if it exists, else that Hub dataset
    (loaded with ``hf_config``). Otherwise the first match in ``data_dir``: a ``DatasetDict``
    in ``data_dir`` itself; ``<split>.<src_lang>[.gz]`` with ``<split>.<tgt_lang>[.gz]``;
    ``<split>.tsv[.gz]``; ``<split>.jsonl[.gz]``; ``<split>.parquet``; a ``Dataset`` in
    ``<split>/``.

    Args:
        data_dir: Folder holding the corpus.
        split: Split name.
        src_lang: Source language code.
        tgt_lang: Target language code.
        hf_dataset: Hugging Face dataset name or ``save_to_disk`` folder, or None.
        hf_config: Hugging Face dataset configuration (e.g. ``"de-en"``), or None.

    Raises:
        SplitNotFoundError: If ``data_dir`` is not a folder, or nothing is found in it (listing
            every path looked for).
        FileNotFoundError: If one side of a pair of text files is missing.
        ValueError: If ``hf_config`` names a language pair (``"de-en"``) other than
            ``src_lang`` and ``tgt_lang`` in either order.
    """

    def found(fmt: str, *paths: Path) -> CorpusSplit:
        corpus = CorpusSplit(split, src_lang, tgt_lang, fmt, tuple(paths))
        # a DatasetDict in data_dir keeps its splits in folders of their names
        own_folder = [] if paths == (root,) else [root / split]
        _warn_unread(corpus, [*src_candidates, *tgt_candidates, *singles, *own_folder])
        return corpus

    if hf_dataset is not None:
        path = Path(hf_dataset)
        if path.is_dir():
            return CorpusSplit(split, src_lang, tgt_lang, "hf_disk", (path,))
        pair = hf_config.split("-") if hf_config and hf_config.count("-") == 1 else None
        if pair and sorted(pair) != sorted((src_lang, tgt_lang)):
            raise ValueError(
                f"data.hf_config {hf_config!r} holds {pair[0]!r}-{pair[1]!r} pairs, but "
                f"src_lang={src_lang!r} and tgt_lang={tgt_lang!r}; set data.src_lang and "
                f"data.tgt_lang to the config's languages (in either direction)."
            )
        return CorpusSplit(split, src_lang, tgt_lang, "hf_hub", (), hf_dataset, hf_config)

    root = Path(data_dir)
    src_candidates = [root / f"{split}.{src_lang}", root / f"{split}.{src_lang}.gz"]
    tgt_candidates = [root / f"{split}.{tgt_lang}", root / f"{split}.{tgt_lang}.gz"]
    single = {
        "tsv": [root / f"{split}.tsv", root / f"{split}.tsv.gz"],
        "jsonl": [root / f"{split}.jsonl", root / f"{split}.jsonl.gz"],
        "parquet": [root / f"{split}.parquet"],
    }
    singles = [path for paths in single.values() for path in paths]
    if (root / "dataset_dict.json").is_file():
        return found("hf_disk", root)
    if any(p.is_file() for p in src_candidates + tgt_candidates):
        return found(
            "text",
            find_split(root, split, src_lang),
            find_split(root, split, tgt_lang),
        )
    for fmt, candidates in single.items():
        for path in candidates:
            if path.is_file():
                return found(fmt, path)
    if (root / split / "state.json").is_file():
        return found("hf_disk", root / split)
    if not root.is_dir():
        alike = " or ".join(folders_alike(root))
        what = "is not a folder" if root.exists() else "does not exist"
        what += f" (did you mean {alike}?)" if alike else ""
        raise SplitNotFoundError(
            f"No {src_lang}-{tgt_lang} data for split {split!r}: data.data_dir {root} {what}"
        )
    looked = [*src_candidates, *tgt_candidates, *(p for c in single.values() for p in c)]
    looked += [root / "dataset_dict.json", root / split / "state.json"]
    others = splits_in(root, src_lang, tgt_lang)
    lower = (src_lang.lower(), tgt_lang.lower())  # codes are lower case: de, not DE
    advice: str | None = None  # where the folder suggests nothing: where to point instead
    if lower != (src_lang, tgt_lang) and split in splits_in(root, *lower):
        pair = f"{lower[0]}-{lower[1]}"
        advice = f"{root} holds {split} in {pair}, named in lower case (did you mean {pair}?)"
    elif others:  # the folder is right, the split name is not
        advice = f"{root} holds the splits {', '.join(others)}{did_you_mean(split, others)}"
    raise SplitNotFoundError(
        f"No {src_lang}-{tgt_lang} data for split {split!r} in {root}; looked for: "
        + ", ".join(str(p) for p in looked),
        advice,
    )


def _warn_unread(corpus: CorpusSplit, candidates: list[Path]) -> None:
    """Warns (once per split and files) when other files of the split lie beside those read,
    which the first match of :func:`locate_split` leaves unread (``train.tsv`` beside
    ``train.de`` and ``train.en``, ``train.en.gz`` beside ``train.en``)."""
    read = [path.resolve() for path in corpus.paths]
    unread = [
        str(path)
        for path in candidates
        if (path.is_file() or (path / "state.json").is_file()) and path.resolve() not in read
    ]
    if unread:
        warnings.warn(
            f"split {corpus.split!r}: reading {corpus.describe()}; also there, and not read: "
            f"{', '.join(unread)}",
            stacklevel=3,
        )


def splits_in(root: Path, src_lang: str, tgt_lang: str) -> list[str]:
    """The split names of ``src_lang``-``tgt_lang`` data in folder ``root``, sorted: a pair of
    text files (plain or gzip) or one TSV, JSON lines or Parquet file."""
    names = set()
    try:
        files = [p.name for p in root.iterdir() if p.is_file()]
    except OSError:
        return []
    for name in files:
        stem = name.removesuffix(".gz")
        for suffix in (".tsv", ".jsonl", ".parquet"):
            if stem.endswith(suffix):
                names.add(stem.removesuffix(suffix))
        split, _, lang = stem.rpartition(".")
        if (
            split
            and lang == src_lang
            and any(f"{split}.{tgt_lang}{gz}" in files for gz in ("", ".gz"))
        ):
            names.add(split)
    return sorted(names)
