"""``TokenizedDataset``: the examples of one split, read from its tokenised Arrow table, and
the training, held-out and predict sets built from such tables."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import Dataset

from seq2seq.data.batching import describe_filtering, filter_training_pairs
from seq2seq.data.formats import read_lines
from seq2seq.data.token_cache import token_lengths
from seq2seq.data.tokenizer import EOS_ID, Tokenizer

#: (N,) source and target lengths of a set's examples, in tokens with EOS / BOS.
Lengths = tuple[np.ndarray, np.ndarray]


class TokenizedDataset(Dataset):
    """Examples of one split, read from a tokenised Arrow table.

    Each example is a dict with ``"index"`` (line number in the split), ``"src"`` (source
    ids + EOS, at most ``max_positions`` long), ``"tgt"`` (target ids without BOS/EOS, at most
    ``max_positions - 1`` long, when the split has targets) and, with ``with_text``,
    ``"src_text"`` and ``"ref_text"`` (the raw lines, untouched), and ``"pair"`` (the pair
    index of a multilingual run) when ``pair`` is set.

    Args:
        data: ``datasets.Dataset`` with columns ``index``, ``src``, ``src_text`` and
            optionally ``tgt``, ``tgt_text``.
        max_positions: Longest sequence the model accepts; longer ones are truncated.
        with_text: Also return the raw source and reference lines.
        tokenizer: Re-encodes the raw text on every access when ``subword_alpha > 0``.
        subword_alpha: Sampling parameter of subword regularisation; 0 uses the cached ids.
        languages: ``src_lang`` / ``tgt_lang`` keywords of ``tokenizer.encode`` for the
            re-encoded text (see :func:`~seq2seq.data.pairs.encode_languages`).
        pair: Index of the split's language pair in a multilingual run, or None.
    """

    def __init__(
        self,
        data: datasets.Dataset,
        max_positions: int,
        with_text: bool = False,
        tokenizer: Tokenizer | None = None,
        subword_alpha: float = 0.0,
        languages: Mapping[str, str] | None = None,
        pair: int | None = None,
    ) -> None:
        self.data = data
        self.max_positions = max_positions
        self.with_text = with_text
        self.tokenizer = tokenizer
        self.subword_alpha = subword_alpha
        self.languages = dict(languages or {})
        self.pair = pair
        self.has_targets = "tgt" in data.column_names
        # Only the columns a batch needs are read, so pages of the memory-mapped cache
        # holding raw text are never touched while training on cached ids.
        names = data.column_names
        self._ids = data.select_columns([c for c in ("index", "src", "tgt") if c in names])
        needs_text = with_text or (subword_alpha > 0 and tokenizer is not None)
        text_columns = [c for c in ("src_text", "tgt_text") if c in names]
        self._text = data.select_columns(text_columns) if needs_text else None

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        indices = list(indices)
        rows = self._ids[indices]
        text = self._text[indices] if self._text is not None else {}
        src, tgt = rows["src"], rows["tgt"] if self.has_targets else None
        if self.subword_alpha > 0 and self.tokenizer is not None:
            sampling = {"sample": True, "alpha": self.subword_alpha, **self.languages}
            src = self.tokenizer.encode(text["src_text"], **sampling)
            if self.has_targets:
                tgt = self.tokenizer.encode(text["tgt_text"], side="target", **sampling)
        limit = self.max_positions - 1
        examples = []
        for k in range(len(indices)):
            example: dict[str, Any] = {"index": rows["index"][k], "src": [*src[k][:limit], EOS_ID]}
            if tgt is not None:
                example["tgt"] = list(tgt[k][:limit])
            if self.with_text:
                example["src_text"] = text["src_text"][k]
                if self.has_targets:
                    example["ref_text"] = text["tgt_text"][k]
            if self.pair is not None:
                example["pair"] = self.pair
            examples.append(example)
        return examples


def training_set(
    table: datasets.Dataset,
    where: str,
    tokenizer: Tokenizer,
    max_positions: int,
    max_length_ratio: float,
    subword_alpha: float,
    languages: Mapping[str, str] | None = None,
    pair: int | None = None,
) -> tuple[TokenizedDataset, Lengths]:
    """The training pairs of a tokenised split that :func:`filter_training_pairs` keeps (the
    counts are logged), and their lengths; ``languages`` and ``pair``: as for
    :class:`TokenizedDataset`.

    Raises:
        ValueError: if every pair is filtered out, naming ``where`` (the split's location).
    """
    s, t = token_lengths(table)
    mask, counts = filter_training_pairs(s, t, max_positions, max_length_ratio)
    keep = np.flatnonzero(mask)
    rank_zero_info(
        f"Training pairs from {where}: "
        f"{describe_filtering(counts, max_positions, max_length_ratio)}."
    )
    if keep.size == 0:
        raise ValueError(
            f"Every training pair of {where} was filtered out (empty, longer "
            f"than max_positions={max_positions}, or length ratio above "
            f"max_length_ratio={max_length_ratio})."
        )
    data = table if keep.size == len(table) else table.select(keep)
    dataset = TokenizedDataset(
        data, max_positions, tokenizer=tokenizer, subword_alpha=subword_alpha,
        languages=languages, pair=pair,
    )  # fmt: skip
    return dataset, (s[keep] + 1, t[keep] + 1)


def heldout_set(
    table: datasets.Dataset, split: str, max_positions: int, pair: int | None = None
) -> tuple[TokenizedDataset, Lengths]:
    """Every pair of a tokenised held-out split, with its text, and their lengths; sentences
    longer than ``max_positions`` are truncated with a warning. ``pair``: as for
    :class:`TokenizedDataset`."""
    s, t = token_lengths(table)
    warn_truncation(split, s, t, max_positions)
    warn_empty(split, s, t, table)
    dataset = TokenizedDataset(table, max_positions, with_text=True, pair=pair)
    return dataset, (s + 1, t + 1)


def warn_empty(split: str, s: np.ndarray, t: np.ndarray, table: datasets.Dataset) -> None:
    """Warns of the empty source and reference sentences of a held-out split (lengths ``s``,
    ``t`` of ``table``'s rows), naming the first five by their 1-based number in the split.
    They are kept, since a score counts every sentence, but an empty line in a held-out set
    most often means misaligned or cut files."""
    for side, lengths in (("source", s), ("reference", t)):
        rows = np.flatnonzero(lengths == 0)
        if not rows.size:
            continue
        numbers = ", ".join(str(int(table[int(row)]["index"]) + 1) for row in rows[:5])
        more = f" and {rows.size - 5} more" if rows.size > 5 else ""
        many = rows.size > 1
        rank_zero_warn(
            f"{rows.size} {side} sentence{'s' if many else ''} of {split!r} "
            f"{'are' if many else 'is'} empty (number{'s' if many else ''} {numbers}{more}); "
            f"{'they are' if many else 'it is'} scored with the others: are the files aligned?"
        )


def predict_set(
    path: str | Path,
    tokenizer: Tokenizer,
    max_positions: int,
    languages: Mapping[str, str] | None = None,
) -> tuple[TokenizedDataset, Lengths]:
    """Every line of a source-language file (empty ones included) as an example without a
    target, ``index`` its 0-based line number, and the lengths (targets 0); the lines are
    encoded with ``languages`` (``tokenizer.encode``'s ``src_lang`` / ``tgt_lang``).

    Raises:
        ValueError: if the file has no lines (or as :func:`~seq2seq.data.formats.read_lines`).
    """
    lines = read_lines(path)
    if not lines:
        raise ValueError(f"The predict file {path} has no lines.")
    table = datasets.Dataset.from_dict(
        {
            "index": list(range(len(lines))),
            "src_text": lines,
            "src": tokenizer.encode(lines, **(languages or {})),
        }
    )
    s = np.array([len(ids) for ids in table["src"]], dtype=np.int64)
    warn_truncation(str(path), s, None, max_positions)
    return TokenizedDataset(table, max_positions, with_text=True), (s + 1, np.zeros_like(s))


def warn_truncation(split: str, s: np.ndarray, t: np.ndarray | None, max_positions: int) -> None:
    """Warns of the source (``s``) and target (``t``) sentences, lengths without EOS/BOS, that
    are truncated to ``max_positions``."""
    for side, lengths in (("source", s), ("target", t)):
        if lengths is None:
            continue
        n = int((lengths + 1 > max_positions).sum())
        if n:
            rank_zero_warn(
                f"{n} {side} sentence{'s' if n > 1 else ''} of {split!r} "
                f"{'are' if n > 1 else 'is'} longer than max_positions={max_positions} tokens and "
                f"{'are' if n > 1 else 'is'} truncated (never dropped)."
            )
