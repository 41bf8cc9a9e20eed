"""The Multi30k download policy: which missing files of a corpus folder to fetch.

Only a Multi30k folder is completed: one without a training split yet, or whose
``train.<lang>.gz`` files are Multi30k's own (by SHA-256). A corpus of one's own that lacks a
split is never filled with Multi30k's: the missing split is reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from lightning.pytorch.utilities.rank_zero import rank_zero_info

from seq2seq.data.corpus import MULTI30K_SHA256, CorpusSplit, _sha256, download_multi30k

#: Finds a split of the configured corpus by name (raises ``FileNotFoundError`` if missing).
Locate = Callable[[str], CorpusSplit]


def download_missing(
    data_dir: Path,
    splits: Sequence[str],
    train_split: str,
    locate: Locate,
    langs: tuple[str, str],
) -> None:
    """Downloads the Multi30k files of ``splits`` that cannot be found in ``data_dir``, where
    ``data_dir`` is a Multi30k folder (see the module).

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
        rank_zero_info(f"Downloading {', '.join(wanted)} into {data_dir}")
        download_multi30k(data_dir, files=wanted)


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
        path.name in MULTI30K_SHA256 and _sha256(path) == MULTI30K_SHA256[path.name]
        for path in train.paths
    )
