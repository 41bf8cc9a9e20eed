"""Readers of the file formats a parallel corpus comes in (see :mod:`seq2seq.data.corpus`).

Text is read as strict UTF-8 and split on ``"\\n"`` only: a trailing ``"\\r"`` is removed,
while other line-breaking characters (U+2028, U+2029, U+0085, form feed) stay inside the
sentence, so line counts always agree with ``wc -l`` and aligned files stay aligned.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

_GZIP_MAGIC = b"\x1f\x8b"


# ---------------------------------------------------------------------- plain files
def _check_readable(path: Path) -> None:
    """Refuses a folder or a missing path; a pipe (/dev/stdin, the shell's <(...)) passes."""
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a text file")
    if not path.exists():
        raise FileNotFoundError(f"File not found: {path}")


def _read_bytes(path: Path) -> bytes:
    _check_readable(path)
    data = path.read_bytes()
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise ValueError(f"{path} is not a readable gzip file: {err}") from err
    return data


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes, read a MiB at a time."""
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
        bad = [n for n, row in enumerate(data.split(b"\n"), start=1) if not _is_utf8(row)]
        raise ValueError(_invalid_utf8(name, line, column, err.reason, bad)) from err
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text:
        return []
    _check_line_endings(text, "\n" in text, name)
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
        FileNotFoundError: If ``path`` does not exist; IsADirectoryError for a folder.
        ValueError: On invalid UTF-8 (naming the file and the 1-based line) or a corrupt gzip
            stream.
    """
    path = Path(path)
    _check_readable(path)
    with open(path, "rb") as raw:
        yield from iter_stream_lines(raw, str(path), count_invalid=True)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _invalid_utf8(
    name: str, line: int, column: int, reason: str, bad: list[int] | None = None
) -> str:
    """The error of a line of ``name`` that is no UTF-8, naming every such line (``bad``)
    where the whole text was read, and the ways to convert it."""
    message = (
        f"{name}, line {line}: invalid UTF-8 ({reason} at byte {column} of the line, counting "
        "from 1)."
    )
    if bad is not None and len(bad) > 1:
        shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
        message += f" {len(bad):,} lines of it are not UTF-8 (lines {shown})."
    elif bad is not None:
        message += " It is its only such line."
    return (
        f"{message} seq2seq reads UTF-8 alone: convert the text (iconv -f latin1 -t utf-8 for "
        "Latin-1; iconv -f utf-8 -t utf-8 -c drops the invalid bytes)."
    )


def _check_line_endings(first: str, has_newline: bool, name: str) -> None:
    """Refuses text whose lines end in CR alone (classic Mac OS): read on LF, it is one line
    (``first``), which SentencePiece would skip and a corpus would count as one pair."""
    if not has_newline and "\r" in first.rstrip("\r"):
        raise ValueError(
            f"{name} has no line feed but {first.count(chr(13)):,} carriage returns: its lines "
            "end in CR alone (classic Mac OS), and seq2seq splits lines on LF (\\n); convert "
            f"it, e.g. tr '\\r' '\\n' < {name} > converted"
        )


def count_lines(path: str | Path, chunk_size: int = 1 << 20) -> int:
    """The lines :func:`iter_lines` yields for a file (plain or gzip), counted without decoding
    them: the newlines, and one more for a last line without one.

    Raises:
        FileNotFoundError: If ``path`` does not exist; IsADirectoryError for a folder.
        ValueError: On a corrupt gzip stream.
    """
    path = Path(path)
    _check_readable(path)
    count, last = 0, b"\n"
    with open(path, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw) if compressed else raw
        try:
            while chunk := stream.read(chunk_size):
                count += chunk.count(b"\n")
                last = chunk[-1:]
        except (OSError, EOFError) as err:
            if not compressed:
                raise
            raise ValueError(f"{path} is not a readable gzip file: {err}") from err
    return count + (last != b"\n")


def iter_stream_lines(raw: BinaryIO, name: str, count_invalid: bool = False) -> Iterator[str]:
    """:func:`iter_lines` of an open binary stream (``sys.stdin.buffer``), ``name`` naming it in
    errors (``"<stdin>"``). A line is yielded as soon as it has been read whole, so a reader
    at a terminal gets each line as it is typed. ``count_invalid``: at a line that is no UTF-8,
    read the rest of the stream to name every such line (a file's; not a terminal's)."""
    if not hasattr(raw, "peek"):  # e.g. io.BytesIO
        raw = io.BufferedReader(raw)
    compressed = raw.peek(2)[:2] == _GZIP_MAGIC  # peek: a pipe cannot seek back
    stream = gzip.GzipFile(fileobj=raw) if compressed else raw
    try:
        for number, line in enumerate(stream, start=1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as err:
                bad = None
                if count_invalid:  # the rest of the file, to name every line at fault
                    rest = enumerate(stream, start=number + 1)
                    bad = [number, *(n for n, row in rest if not _is_utf8(row))]
                message = _invalid_utf8(name, number, err.start + 1, err.reason, bad)
                raise ValueError(message) from err
            if number == 1 and text.startswith("\ufeff"):
                text = text[1:]
                if not text:
                    continue
            if number == 1:
                _check_line_endings(text, text.endswith("\n"), name)
            if text.endswith("\n"):
                text = text[:-1]
            yield text[:-1] if text.endswith("\r") else text
    except (OSError, EOFError) as err:
        if not compressed:
            raise
        raise ValueError(f"{name} is not a readable gzip file: {err}") from err


def _misaligned(src_path, tgt_path, n_src: int, n_tgt: int, blank_rest: bool) -> ValueError:
    """The error of files of ``n_src`` and ``n_tgt`` lines; ``blank_rest``: the longer one's
    lines past the shorter's end are all empty (an empty line left at the end, most often)."""
    longer, extra = (src_path, n_src - n_tgt) if n_src > n_tgt else (tgt_path, n_tgt - n_src)
    lines = "line" if extra == 1 else f"{extra} lines"
    hint = f" (the last {lines} of {longer} {'is' if extra == 1 else 'are'} empty)"
    return ValueError(
        f"Parallel files are misaligned: {src_path} has {n_src} lines but {tgt_path} "
        f"has {n_tgt} lines{hint if blank_rest else ''}; line i of one must translate line i "
        "of the other."
    )


def _blank_count(lines: Iterable[str]) -> tuple[int, bool]:
    """How many ``lines`` there are, and whether all of them are empty or white space."""
    n, blank = 0, True
    for line in lines:
        n, blank = n + 1, blank and not line.strip()
    return n, blank


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
        _, blank = _blank_count((src if len(src) > len(tgt) else tgt)[min(len(src), len(tgt)) :])
        raise _misaligned(src_path, tgt_path, len(src), len(tgt), blank)
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
            rest, blank = _blank_count(itertools.chain([src], src_lines))
            raise _misaligned(src_path, tgt_path, n + rest, n, blank)
        n += 1
        yield src, tgt
    rest, blank = _blank_count(tgt_lines)
    if rest:
        raise _misaligned(src_path, tgt_path, n, n + rest, blank)


def read_tsv(
    path: str | Path, src_lang: str | None = None, tgt_lang: str | None = None
) -> tuple[list[str], list[str]]:
    """Reads a two-column TSV file of pairs, plain or gzip, into ``(src_lines, tgt_lines)``.

    Blank lines (no tab, nothing but white space) hold no record and are skipped, as in JSON
    lines (and pandas' ``read_csv``); a pair with both sides empty is a line holding just the tab.

    Column 1 is the source and column 2 the target, unless ``src_lang`` and ``tgt_lang`` are
    given and the first non-blank line is a header naming them in either order, e.g.
    ``de<TAB>en``: it is not a pair, and the column headed ``src_lang`` is the source (so
    ``en<TAB>de`` read with ``src_lang="de"`` swaps the columns). With both None a header line
    is read as a pair.

    Args:
        path: The file.
        src_lang: Source language code, for the header; None reads no header.
        tgt_lang: Target language code, for the header; None reads no header.

    Raises:
        FileNotFoundError: If ``path`` is missing.
        ValueError: If a non-blank line has other than two tab-separated fields (naming the
            file and line), on invalid UTF-8, if only one of ``src_lang`` and ``tgt_lang`` is
            given, or for a header of other languages (see :func:`_tsv_header`).
    """
    return unzip_pairs(iter_tsv(path, src_lang, tgt_lang))


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
    or (source, target) (False); None if it is a sentence pair.

    Raises:
        ValueError: If ``fields`` look like a header (two codes as ``_LANG_CODE``, one of them
            ``src_lang`` or ``tgt_lang`` in any case) but do not name exactly those two; two
            short words naming neither (``die<TAB>the``) are a sentence pair.
    """
    codes = [field.strip() for field in fields]
    if codes == [src_lang, tgt_lang]:
        return False
    if codes == [tgt_lang, src_lang]:
        return True
    mine = {src_lang.lower(), tgt_lang.lower()}
    if all(_LANG_CODE.fullmatch(code) for code in codes) and mine & {c.lower() for c in codes}:
        raise ValueError(
            # The languages in either order: the SentencePiece model reads a split in the
            # order of its codes (spm_files.joint_splits), which may be the other direction.
            f"{where}: the header names the languages {codes[0]!r} and {codes[1]!r}, but "
            f"it is read for the languages {src_lang} and {tgt_lang} (data.src_lang and "
            "data.tgt_lang, or an entry of data.pairs); a TSV header must name exactly these two "
            f"({src_lang}<TAB>{tgt_lang} or {tgt_lang}<TAB>{src_lang}). Give the run the file's "
            "languages, fix the header, or, if this line is a sentence pair, put a header "
            "naming the languages of its two columns before it."
        )
    return None


def unzip_pairs(pairs: Iterator[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """``(src_lines, tgt_lines)`` of an iterator of ``(src, tgt)`` pairs."""
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
    return unzip_pairs(iter_jsonl(path, src_lang, tgt_lang))


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
    columns = pair_columns(dataset.column_names, src_lang, tgt_lang, name)
    return pairs_of_batch(dataset.select_columns(columns)[:], src_lang, tgt_lang, name)


def pair_columns(columns: Sequence[str], src_lang: str, tgt_lang: str, name: str) -> list[str]:
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


def pairs_of_batch(
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
