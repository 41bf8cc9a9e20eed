"""Multi30k (task 1: German, English, French, line-aligned): its files and their SHA-256, the
verified download, and which missing files of a corpus folder are fetched.

Only a Multi30k folder is completed: one without a training split yet, or whose
``train.<lang>.gz`` files are Multi30k's own (by SHA-256). A corpus of one's own that lacks a
split is never filled with Multi30k's: the missing split is reported.
"""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lightning.pytorch.utilities.rank_zero import rank_zero_info

from seq2seq.data.corpus import CorpusSplit
from seq2seq.data.formats import file_sha256
from seq2seq.files import new_folder_hint
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
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
}
"""SHA-256 of each Multi30k German, English and French file (task 1, raw)."""


def download_multi30k(
    data_dir: str | Path,
    base_url: str = MULTI30K_URL,
    files: Mapping[str, str] | Sequence[str] | None = None,
    timeout: float = 60.0,
) -> list[Path]:
    """Downloads the Multi30k files (German, English, French) missing from ``data_dir``.

    Each file is fetched from ``<base_url>/<name>`` into a temporary file next to its
    destination, checked against its SHA-256, and only then renamed into place, so an
    interrupted or corrupt download never leaves a file under the final name. Files already
    present are left untouched.

    Args:
        data_dir: Destination folder (created if needed).
        base_url: URL of the folder holding the files.
        files: File names to fetch, as a mapping to their SHA-256 or a list of names from
            :data:`MULTI30K_SHA256`; None fetches all nine (three splits x de, en, fr).
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
    new_folder = new_folder_hint(root)
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
        actual = file_sha256(tmp)
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
            f"{', '.join(name for name, _, _ in failed)} (from {base_url}) into {root}"
            f"{new_folder}, or set "
            "`--data.data_dir` to a folder that already holds a copy (and `--data.download "
            "false` to skip downloading)."
        )
    return downloaded


# ---------------------------------------------------------------------- which files
#: Finds a split of the configured corpus by name (raises ``FileNotFoundError`` if missing).
Locate = Callable[[str], CorpusSplit]


def missing_files(
    data_dir: Path,
    splits: Sequence[str],
    train_split: str,
    locate: Locate,
    langs: tuple[str, str],
) -> list[str]:
    """The Multi30k files of ``splits`` that cannot be found in ``data_dir`` and that the
    download would fetch, where ``data_dir`` is a Multi30k folder (see the module); ``[]``
    for another corpus.

    Args:
        data_dir: the corpus folder.
        splits: the split names the command reads.
        train_split: the name of the training split (the one whose files tell a Multi30k
            folder).
        locate: finds a split by name.
        langs: source and target language codes.
    """
    wanted = []
    for split in splits:
        try:
            locate(split)
        except FileNotFoundError:
            names = [f"{split}.{lang}.gz" for lang in langs]
            wanted += [
                name
                for name in names
                if name in MULTI30K_SHA256
                and not any((data_dir / f).is_file() for f in (name, name[:-3]))
            ]
    if wanted and is_multi30k_folder(train_split, locate, langs):  # hashes only then
        return wanted
    return []


def download_missing(data_dir: Path, files: Sequence[str]) -> None:
    """Downloads ``files`` (:func:`missing_files`, of every language pair that reads
    ``data_dir``, so that a failure names them all) into ``data_dir``."""
    files = list(dict.fromkeys(files))
    if files:
        rank_zero_info(f"Downloading {', '.join(files)} into {data_dir}{new_folder_hint(data_dir)}")
        download_multi30k(data_dir, files=files)


def downloadable(split: str, train_split: str, locate: Locate, langs: tuple[str, str]) -> bool:
    """Whether the download fetches both files of ``split`` (both Multi30k files, into a
    Multi30k folder), given that they cannot be found yet."""
    names = [f"{split}.{lang}.gz" for lang in langs]
    return all(name in MULTI30K_SHA256 for name in names) and is_multi30k_folder(
        train_split, locate, langs
    )


def is_multi30k_folder(train_split: str, locate: Locate, langs: tuple[str, str]) -> bool:
    """Whether the corpus holds no training split or Multi30k's own training files."""
    try:
        train = locate(train_split)
    except FileNotFoundError:
        return True
    expected = [f"{train_split}.{lang}.gz" for lang in langs]
    if train.format != "text" or not all(name in MULTI30K_SHA256 for name in expected):
        return False
    return all(
        path.name in MULTI30K_SHA256 and file_sha256(path) == MULTI30K_SHA256[path.name]
        for path in train.paths
    )
