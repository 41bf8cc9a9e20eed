"""Tests of seq2seq.data.corpus and .formats (readers, split discovery) and .multi30k."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import json
import os
import socket
import threading
import warnings

import datasets
import pytest
from conftest import MULTI30K  # SEQ2SEQ_MULTI30K, else ../shared/data/multi30k

from seq2seq.data.corpus import (
    count_lines,
    find_split,
    iter_lines,
    iter_parallel,
    iter_tsv,
    locate_split,
    read_jsonl,
    read_lines,
    read_parallel,
    read_tsv,
)
from seq2seq.data.multi30k import MULTI30K_SHA256, download_multi30k


@pytest.fixture(scope="module")
def val_pairs() -> tuple[list[str], list[str]]:
    """The Multi30k validation pairs (1,014 German-English lines)."""
    return read_parallel(MULTI30K / "val.de.gz", MULTI30K / "val.en.gz")


# ---------------------------------------------------------------------- read_lines
def test_read_lines_gz_and_plain_agree(tmp_path, val_pairs):
    de = read_lines(MULTI30K / "val.de.gz")
    assert len(de) == 1014 and de == val_pairs[0]
    plain = tmp_path / "val.de"
    plain.write_bytes(gzip.decompress((MULTI30K / "val.de.gz").read_bytes()))
    assert read_lines(plain) == de


def test_read_lines_splits_on_newline_only(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes("\ufeffa\u2028b\r\nc\u2029d\x0ce\u0085\n\n  f \r\n".encode())
    assert read_lines(path) == ["a\u2028b", "c\u2029d\x0ce\u0085", "", "  f "]
    path.write_bytes(b"no final newline")
    assert read_lines(path) == ["no final newline"]
    path.write_bytes(b"")
    assert read_lines(path) == []


@pytest.mark.parametrize(
    "data",
    [
        "\ufeffa\u2028b\r\nc\u2029d\x0ce\u0085\n\n  f \r\n".encode(),
        b"no final newline",
        b"",
        b"\n",
        "\ufeff".encode(),
        "\ufeff\n".encode(),
        b"a\r\r\nb\r",
    ],
)
def test_iter_lines_agrees_with_read_lines(tmp_path, data):
    path = tmp_path / "x.txt"
    path.write_bytes(data)
    assert list(iter_lines(path)) == read_lines(path)
    path.write_bytes(gzip.compress(data))
    assert list(iter_lines(path)) == read_lines(path)


def test_iter_lines_errors(tmp_path):
    path = tmp_path / "bad.de.gz"
    path.write_bytes(gzip.compress(b"ok\nfine\nbro\xffken\n"))
    with pytest.raises(ValueError, match=r"bad\.de\.gz, line 3: invalid UTF-8"):
        list(iter_lines(path))
    path.write_bytes(gzip.compress(b"ok\n" * 1000)[:-30])
    with pytest.raises(ValueError, match=r"bad\.de\.gz is not a readable gzip file"):
        list(iter_lines(path))
    with pytest.raises(FileNotFoundError, match="nothere"):
        next(iter_lines(tmp_path / "nothere"))


def test_iter_parallel_misaligned_names_both_files_and_counts(tmp_path):
    (tmp_path / "a.de").write_text("1\n2\n3\n")
    (tmp_path / "a.en").write_text("1\n2\n")
    pairs = iter_parallel(tmp_path / "a.de", tmp_path / "a.en")
    assert [next(pairs), next(pairs)] == [("1", "1"), ("2", "2")]
    with pytest.raises(ValueError, match=r"a\.de has 3 lines but .*a\.en has 2 lines"):
        next(pairs)
    with pytest.raises(ValueError, match=r"a\.en has 2 lines but .*a\.de has 3 lines"):
        list(iter_parallel(tmp_path / "a.en", tmp_path / "a.de"))


def test_read_lines_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.de.gz"
    path.write_bytes(gzip.compress(b"ok\nfine\nbro\xffken\n"))
    with pytest.raises(ValueError, match=r"bad\.de\.gz, line 3: invalid UTF-8"):
        read_lines(path)


@pytest.mark.parametrize("reader", [read_lines, lambda path: list(iter_lines(path))])
def test_every_line_that_is_no_utf8_is_named_with_the_conversion(tmp_path, reader):
    """One run names every line at fault, not the first alone, and says how to convert."""
    path = tmp_path / "crawl.de"
    lines = [f"Zeile {i}".encode() for i in range(30)]
    for i in (4, 11, 25):  # lines 5, 12 and 26: Latin-1
        lines[i] = "Grüße".encode("latin-1")
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ValueError) as error:
        reader(path)
    message = str(error.value)
    assert "crawl.de, line 5: invalid UTF-8" in message
    assert "3 lines of it are not UTF-8 (lines 5, 12, 26)" in message
    assert "iconv -f latin1 -t utf-8" in message
    lines[11] = lines[25] = b"ok"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ValueError, match="line 5: invalid UTF-8 .* It is its only such line"):
        reader(path)


@pytest.mark.parametrize("reader", [read_lines, lambda path: list(iter_lines(path))])
def test_lines_ending_in_cr_alone_are_refused(tmp_path, reader):
    """Classic Mac OS line ends: without the refusal, the file is one line, which
    SentencePiece skips (an error about vocab_size) and a corpus counts as one pair."""
    path = tmp_path / "old.de"
    path.write_bytes(b"Ein Hund.\rEine Katze.\rJa.\r")
    with pytest.raises(ValueError, match=r"old\.de has no line feed but 3 carriage returns"):
        reader(path)
    path.write_bytes(gzip.compress(b"Ein Hund.\r\nEine Katze.\r\n"))  # CRLF: read
    assert reader(path) == ["Ein Hund.", "Eine Katze."]
    path.write_bytes(b"Ein Hund.\r")  # one line, ended by CR: one line
    assert reader(path) == ["Ein Hund."]


def test_read_lines_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.en"):
        read_lines(tmp_path / "nothere.en")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        next(iter_lines(tmp_path))


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("read", [read_lines, lambda path: list(iter_lines(path))])
def test_lines_are_read_from_a_pipe(tmp_path, compress, read):
    """A named pipe, as the shell's <(...) and /dev/stdin give, is read like a file, gzip
    detected without seeking back."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    data = b"Ein Hund.\n\nZwei Hunde.\n"
    writer = threading.Thread(
        target=fifo.write_bytes, args=(gzip.compress(data) if compress else data,)
    )
    writer.start()
    try:
        assert read(fifo) == ["Ein Hund.", "", "Zwei Hunde."]
    finally:
        writer.join(timeout=10)


def test_read_parallel_misaligned_names_both_files_and_counts(tmp_path):
    (tmp_path / "a.de").write_text("1\n2\n3\n")
    (tmp_path / "a.en").write_text("1\n2\n")
    with pytest.raises(ValueError, match=r"a\.de has 3 lines but .*a\.en has 2 lines;"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")


@pytest.mark.parametrize("read", [read_parallel, lambda *paths: list(iter_parallel(*paths))])
def test_empty_lines_past_the_shorter_file_are_named(tmp_path, read):
    """A misalignment made of empty lines at the end of the longer file says so."""
    (tmp_path / "a.de").write_text("1\n2\n")
    (tmp_path / "a.en").write_text("1\n2\n\n")
    (tmp_path / "b.en").write_text("1\n2\n \n\n")
    with pytest.raises(ValueError, match=r"has 3 lines \(the last line of .*a\.en is empty\);"):
        read(tmp_path / "a.de", tmp_path / "a.en")
    with pytest.raises(ValueError, match=r"has 2 lines \(the last 2 lines of .*b\.en are empty\);"):
        read(tmp_path / "b.en", tmp_path / "a.de")


def test_files_of_a_split_left_unread_are_warned_about(tmp_path):
    """The first match is read; other files of the split beside it are named in a warning."""
    (tmp_path / "train.de").write_text("a\nb\n")
    (tmp_path / "train.en").write_text("x\ny\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        locate_split(tmp_path, "train", "de", "en")  # nothing else there: no warning
    (tmp_path / "train.tsv").write_text("a\tx\n")
    (tmp_path / "train.en.gz").write_bytes(gzip.compress(b"x\ny\n"))
    with pytest.warns(UserWarning) as record:
        corpus = locate_split(tmp_path, "train", "de", "en")
    assert corpus.format == "text"
    assert str(record[0].message) == (
        f"split 'train': reading {tmp_path / 'train.de'} + {tmp_path / 'train.en'}; also there, "
        f"and not read: {tmp_path / 'train.en.gz'}, {tmp_path / 'train.tsv'}"
    )


@pytest.mark.parametrize("data", [b"", b"x", b"x\n", b"x\n\n", b"\xef\xbb\xbfx\r\ny", b"\n"])
@pytest.mark.parametrize("compress", [False, True])
def test_count_lines_counts_what_the_readers_read(tmp_path, data, compress):
    path = write_bytes(tmp_path / "a.de", data, compress)
    assert count_lines(path, chunk_size=2) == len(read_lines(path)) == len(list(iter_lines(path)))


def test_a_text_split_is_counted_without_reading_it_and_misalignment_still_raises(tmp_path):
    write_bytes(tmp_path / "train.de", b"a\nb\nc", compress=True)
    write_bytes(tmp_path / "train.en", b"x\ny\nz\n", compress=False)
    assert locate_split(tmp_path, "train", "de", "en").count() == 3
    write_bytes(tmp_path / "train.en", b"x\ny\n", compress=False)
    with pytest.raises(ValueError, match=r"misaligned: .*train\.de\.gz has 3 lines but"):
        locate_split(tmp_path, "train", "de", "en").count()


def write_bytes(path, data: bytes, compress: bool):
    """``data`` in ``path`` (gzip-compressed as ``path.gz`` with ``compress``)."""
    path = path.with_name(path.name + ".gz") if compress else path
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def test_find_split_prefers_plain_then_gz(tmp_path):
    (tmp_path / "val.de.gz").write_bytes(gzip.compress(b"x\n"))
    assert find_split(tmp_path, "val", "de") == tmp_path / "val.de.gz"
    (tmp_path / "val.de").write_text("x\n")
    assert find_split(tmp_path, "val", "de") == tmp_path / "val.de"
    with pytest.raises(FileNotFoundError, match=r"val\.en and .*val\.en\.gz"):
        find_split(tmp_path, "val", "en")


# ---------------------------------------------------------------------- TSV / JSONL
def test_read_tsv(tmp_path, val_pairs):
    src, tgt = val_pairs
    path = tmp_path / "val.tsv.gz"
    path.write_bytes(
        gzip.compress("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt, strict=True)).encode())
    )
    assert read_tsv(path) == (src, tgt)
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nonly one field\n")
    with pytest.raises(ValueError, match=r"bad\.tsv, line 2: expected 2 .* found 1"):
        read_tsv(bad)


def test_tsv_blank_lines_are_skipped_and_a_lone_tab_is_an_empty_pair(tmp_path):
    """As in JSON lines, a blank line holds no record; ``\t`` alone is a pair of empty sides
    (dropped and counted by the training filter, kept in held-out sets)."""
    path = tmp_path / "train.tsv"
    path.write_text("a\tb\n\n  \nc\td\n\t\n")
    assert read_tsv(path) == (["a", "c", ""], ["b", "d", ""])
    assert list(iter_tsv(path)) == [("a", "b"), ("c", "d"), ("", "")]


@pytest.mark.parametrize("header", ["de\ten", "en\tde", " en \t de "])
def test_a_tsv_header_sets_which_column_is_the_source(tmp_path, header):
    """A ``de<TAB>en`` or ``en<TAB>de`` first line is no pair: it names the columns, so a run
    de->en or en->de reads the right side as the source whatever the column order."""
    de, en = ["ein Hund", "", "eine Katze"], ["a dog", "", "a cat"]
    columns = (de, en) if header.split()[0] == "de" else (en, de)
    body = "".join(f"{a}\t{b}\n" for a, b in zip(*columns, strict=True))
    path = tmp_path / "train.tsv.gz"
    path.write_bytes(gzip.compress(f"\ufeff\n  \n{header}\n\n{body}".encode()))
    assert read_tsv(path, "de", "en") == (de, en)
    assert read_tsv(path, "en", "de") == (en, de)
    assert list(iter_tsv(path, src_lang="en", tgt_lang="de")) == list(zip(en, de, strict=True))
    # The languages reach the reader from locate_split, chunked and streaming reading included.
    corpus = locate_split(tmp_path, "train", "en", "de")
    assert corpus.format == "tsv" and corpus.read() == (en, de)
    for streaming in (False, True):
        chunks = list(corpus.iter_chunks(2, start=1, streaming=streaming))
        assert chunks == [(en[1:], de[1:])]
    # Without languages there is no header detection: column 1 is the source, the header a pair.
    assert read_tsv(path)[0][0] == header.split("\t")[0]
    assert len(read_tsv(path)[0]) == 4


def test_a_tsv_without_header_keeps_the_column_order(tmp_path):
    """No header: column 1 is the source whatever the languages (a first pair is no header)."""
    path = tmp_path / "train.tsv"
    path.write_text("Hund\tdog\nKatze\tcat\n")
    assert read_tsv(path, "de", "en") == (["Hund", "Katze"], ["dog", "cat"])
    assert read_tsv(path, "en", "de") == (["Hund", "Katze"], ["dog", "cat"])
    path.write_text("de\ten\n")  # a header and nothing else
    assert read_tsv(path, "de", "en") == ([], [])
    assert locate_split(tmp_path, "train", "en", "de").read() == ([], [])


@pytest.mark.parametrize(
    ("header", "found"),
    [
        ("fr\ten", "'fr' and 'en'"),
        ("de\tde", "'de' and 'de'"),
        ("EN\tDE", "'EN' and 'DE'"),
        ("en\tfr", "'en' and 'fr'"),
    ],
)
def test_a_tsv_header_of_other_languages_is_an_error(tmp_path, header, found):
    path = tmp_path / "train.tsv"
    path.write_text(f"{header}\nein Hund\ta dog\n")
    message = (
        rf"train\.tsv, line 1: the header names the languages {found}, but it is read for the "
        r"languages de and en \(data\.src_lang and data\.tgt_lang, or an entry of data\.pairs\); "
        r"a TSV "
        r"header must name exactly these two"
    )
    with pytest.raises(ValueError, match=message):
        read_tsv(path, "de", "en")
    with pytest.raises(ValueError, match=message):
        list(locate_split(tmp_path, "train", "de", "en").iter_chunks(10, streaming=True))
    path.write_text(f"\n{header}\n")
    with pytest.raises(ValueError, match=r"train\.tsv, line 2: the header names"):
        read_tsv(path, "de", "en")


def test_a_first_pair_of_short_words_is_no_header(tmp_path):
    """Two short words naming neither language of the run are a sentence pair, not a header
    (nor an error)."""
    path = tmp_path / "train.tsv"
    path.write_text("die\tthe\nein Hund\ta dog\n")
    assert read_tsv(path, "de", "en") == (["die", "ein Hund"], ["the", "a dog"])
    path.write_text("deu_Latn\teng_Latn\nein Hund\ta dog\n")
    assert read_tsv(path, "de", "en")[0] == ["deu_Latn", "ein Hund"]


def test_read_tsv_needs_both_languages_or_neither(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("de\ten\n")
    with pytest.raises(ValueError, match=r"train\.tsv: give both src_lang and tgt_lang"):
        read_tsv(path, "de")


@pytest.mark.parametrize("nested", [True, False])
def test_read_jsonl_both_layouts(tmp_path, val_pairs, nested):
    src, tgt = val_pairs
    records = [{"de": s, "en": t, "id": i} for i, (s, t) in enumerate(zip(src, tgt, strict=True))]
    if nested:
        records = [{"translation": {"de": r["de"], "en": r["en"]}} for r in records]
    path = tmp_path / "val.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n\n")
    assert read_jsonl(path, "de", "en") == (src, tgt)
    assert read_jsonl(path, "en", "de") == (tgt, src)


def test_read_jsonl_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"de": "a", "en": "b"}\n{"de": "a"\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: invalid JSON"):
        read_jsonl(path, "de", "en")
    path.write_text('{"de": "a", "en": "b"}\n{"de": "a", "fr": "b"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: no 'en' field"):
        read_jsonl(path, "de", "en")


# ---------------------------------------------------------------------- locate_split
def _hf_dataset(src: list[str], tgt: list[str], nested: bool) -> datasets.Dataset:
    if nested:
        return datasets.Dataset.from_dict(
            {"translation": [{"de": s, "en": t} for s, t in zip(src, tgt, strict=True)]}
        )
    return datasets.Dataset.from_dict({"de": src, "en": tgt})


def test_a_language_missing_from_translation_records_is_named(tmp_path):
    """A save_to_disk DatasetDict of {'de', 'en'} translations read with src_lang fr names the
    languages it has (it said "'fr' is None, not a string")."""
    folder = tmp_path / "disk_dict"
    dataset = _hf_dataset(["ein Hund", "eine Katze"], ["a dog", "a cat"], nested=True)
    datasets.DatasetDict({"val": dataset}).save_to_disk(str(folder))
    with pytest.raises(ValueError, match=r"row 0: its 'translation' has no 'fr'; it has \['de', "):
        locate_split(folder, "val", "fr", "en").read()


def test_a_missing_data_folder_is_named_as_such(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data.data_dir \S*nope does not exist\. Point"):
        locate_split(tmp_path / "nope", "train", "de", "en")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"data.data_dir \S*file is not a folder\."):
        locate_split(tmp_path / "file", "train", "de", "en")
    with pytest.raises(FileNotFoundError, match=r"in \S*; looked for: "):  # a folder: the list
        locate_split(tmp_path, "train", "de", "en")


def test_locate_split_every_format(tmp_path, val_pairs):
    src, tgt = (side[:50] for side in val_pairs)
    text = tmp_path / "text"
    text.mkdir()
    (text / "val.de").write_text("\n".join(src) + "\n")
    (text / "val.en.gz").write_bytes(gzip.compress(("\n".join(tgt) + "\n").encode()))
    tsv = tmp_path / "tsv"
    tsv.mkdir()
    (tsv / "val.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt, strict=True)))
    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    (jsonl / "val.jsonl").write_text(
        "".join(
            json.dumps({"translation": {"de": s, "en": t}}) + "\n"
            for s, t in zip(src, tgt, strict=True)
        )
    )
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    _hf_dataset(src, tgt, nested=False).to_parquet(str(parquet / "val.parquet"), batch_size=30)
    disk_dict = tmp_path / "disk_dict"
    datasets.DatasetDict({"val": _hf_dataset(src, tgt, nested=True)}).save_to_disk(str(disk_dict))
    disk_split = tmp_path / "disk_split"
    _hf_dataset(src, tgt, nested=False).save_to_disk(str(disk_split / "val"))

    expected = {
        text: "text",
        tsv: "tsv",
        jsonl: "jsonl",
        parquet: "parquet",
        disk_dict: "hf_disk",
        disk_split: "hf_disk",
    }
    for folder, fmt in expected.items():
        corpus = locate_split(folder, "val", "de", "en")
        assert corpus.format == fmt, folder
        assert corpus.read() == (src, tgt), folder
        if fmt != "tsv":  # every other format picks the sides by language (TSV: by header)
            assert locate_split(folder, "val", "en", "de").read() == (tgt, src), folder
        assert len(corpus.fingerprint()) == 64
        assert len(corpus.stream_fingerprint()) == 64
        # Chunked reading, from any start, gives the same pairs (Parquet: 2 row groups).
        for size, start in ((7, 0), (50, 0), (100, 0), (7, 23), (16, 49), (10, 50)):
            chunks = list(corpus.iter_chunks(size, start=start))
            assert all(len(c[0]) == size for c in chunks[:-1]), (folder, size, start)
            got = tuple(sum((list(c[k]) for c in chunks), []) for k in (0, 1))
            assert got == (src[start:], tgt[start:]), (folder, size, start)
    # A save_to_disk folder given as hf_dataset, with the split selected by name.
    corpus = locate_split("unused", "val", "de", "en", hf_dataset=str(disk_dict))
    assert corpus.read() == (src, tgt)
    with pytest.raises(FileNotFoundError, match=r"Split 'test' not found .* \['val'\]"):
        locate_split("unused", "test", "de", "en", hf_dataset=str(disk_dict)).read()


def test_hub_config_must_hold_the_language_pair():
    corpus = locate_split("unused", "train", "en", "de", hf_dataset="wmt14", hf_config="de-en")
    assert (corpus.format, corpus.hf_name, corpus.hf_config) == ("hf_hub", "wmt14", "de-en")
    with pytest.raises(
        ValueError, match=r"hf_config 'de-en' holds 'de'-'en' pairs, but src_lang='fr'"
    ):
        locate_split("unused", "train", "fr", "en", hf_dataset="wmt14", hf_config="de-en")


def test_locate_split_missing_lists_candidates(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        locate_split(tmp_path, "train", "de", "en")
    message = str(info.value)
    for name in ("train.de", "train.en.gz", "train.tsv", "train.jsonl", "train.parquet"):
        assert name in message
    (tmp_path / "train.de").write_text("x\n")
    with pytest.raises(FileNotFoundError, match=r"train\.en and .*train\.en\.gz"):
        locate_split(tmp_path, "train", "de", "en")


def test_fingerprint_follows_content(tmp_path):
    (tmp_path / "t.de").write_text("a\n")
    (tmp_path / "t.en").write_text("b\n")
    before = locate_split(tmp_path, "t", "de", "en").fingerprint()
    assert locate_split(tmp_path, "t", "de", "en").fingerprint() == before
    assert locate_split(tmp_path, "t", "en", "de").fingerprint() != before
    (tmp_path / "t.en").write_text("c\n")
    assert locate_split(tmp_path, "t", "de", "en").fingerprint() != before


# ---------------------------------------------------------------------- download
@pytest.fixture(scope="module")
def multi30k_server():
    """An HTTP server on 127.0.0.1 serving the Multi30k files; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(MULTI30K))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_download_verifies_and_skips_present_files(tmp_path, multi30k_server):
    names = ["val.de.gz", "val.en.gz", "test_2016_flickr.en.gz"]
    (tmp_path / "val.en.gz").write_bytes(b"already here")
    got = download_multi30k(tmp_path, base_url=multi30k_server, files=names)
    assert sorted(p.name for p in got) == ["test_2016_flickr.en.gz", "val.de.gz"]
    for path in got:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == MULTI30K_SHA256[path.name]
    assert (tmp_path / "val.en.gz").read_bytes() == b"already here"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)  # no temporary files


def test_download_fetches_the_french_files(tmp_path, multi30k_server):
    """The French side of Multi30k (for fr-en and multilingual runs) is known and verified."""
    names = ["val.fr.gz", "test_2016_flickr.fr.gz"]
    got = download_multi30k(tmp_path, base_url=multi30k_server, files=names)
    assert sorted(p.name for p in got) == sorted(names)
    for path in got:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == MULTI30K_SHA256[path.name]
    assert {f"{split}.fr.gz" for split in ("train", "val", "test_2016_flickr")} <= set(
        MULTI30K_SHA256
    )


def test_download_hash_mismatch_removes_file(tmp_path, multi30k_server):
    wrong = "0" * 64
    with pytest.raises(ValueError) as info:
        download_multi30k(tmp_path, base_url=multi30k_server, files={"val.de.gz": wrong})
    message = str(info.value)
    assert "val.de.gz" in message and wrong in message
    assert MULTI30K_SHA256["val.de.gz"] in message
    assert list(tmp_path.iterdir()) == []


def test_download_unreachable_server_explains_what_to_do(tmp_path):
    with socket.socket() as sock:  # a port with nobody listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConnectionError) as info:  # an OSError: one line on the command line
        download_multi30k(tmp_path / "m30k", base_url=f"http://127.0.0.1:{port}", timeout=5)
    message = str(info.value)
    assert "train.de.gz" in message and "test_2016_flickr.en.gz" in message
    assert "val.fr.gz" in message  # every language, French too
    assert str(tmp_path / "m30k") in message and "--data.data_dir" in message
    assert not (tmp_path / "m30k").exists()  # no empty folder left (a mistyped data_dir)
    assert f"into {tmp_path / 'm30k'} (a new folder)," in message


def test_download_into_a_mistyped_folder_names_the_one_beside_it(tmp_path):
    """A ``--data.data_dir`` that does not exist, spelt like a folder beside it: the error
    says the folder is new and names that one."""
    (tmp_path / "multi30k").mkdir()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConnectionError) as info:
        download_multi30k(tmp_path / "Multi30K", base_url=f"http://127.0.0.1:{port}", timeout=5)
    assert f"(a new folder; did you mean {tmp_path / 'multi30k'}?)" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multi30k"]


def test_multi30k_copy_matches_known_hashes():
    for name, digest in MULTI30K_SHA256.items():
        assert hashlib.sha256((MULTI30K / name).read_bytes()).hexdigest() == digest


def test_a_missing_split_of_a_corpus_folder_names_the_splits_it_holds(tmp_path):
    """A mistyped split name in the right folder lists the folder's splits of the pair (text
    pairs, one-file formats) instead of sending the user to another folder."""
    names = "train.de train.en.gz val.de val.en test_2016_flickr.de.gz test_2016_flickr.en.gz"
    for name in (*names.split(), "extra.tsv", "only_de.de", "dev.fr", "dev.en"):
        (tmp_path / name).write_text("x\n")
    with pytest.raises(FileNotFoundError) as info:
        locate_split(tmp_path, "test_2016_flikr", "de", "en")
    assert str(info.value).endswith(
        f"{tmp_path} holds the splits extra, test_2016_flickr, train, val (did you mean "
        "test_2016_flickr?)."
    )
    assert "Point `data.data_dir`" not in str(info.value)
    # language codes in upper case; a folder name spelt in another case
    with pytest.raises(FileNotFoundError) as info:
        locate_split(tmp_path, "train", "DE", "EN")
    assert str(info.value).endswith(
        f"{tmp_path} holds train in de-en, named in lower case (did you mean de-en?)."
    )
    (tmp_path / "Corpus").mkdir()
    with pytest.raises(FileNotFoundError, match=r"corpus does not exist \(did you mean .*Corpus\?"):
        locate_split(tmp_path / "corpus", "train", "de", "en")
