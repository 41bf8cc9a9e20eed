"""``TokenizedDataset``: the examples of one split, read from its tokenised Arrow table."""

from __future__ import annotations

from typing import Any

import datasets
from torch.utils.data import Dataset

from seq2seq.data.tokenizer import EOS_ID, Tokenizer


class TokenizedDataset(Dataset):
    """Examples of one split, read from a tokenised Arrow table.

    Each example is a dict with ``"index"`` (line number in the split), ``"src"`` (source
    ids + EOS, at most ``max_positions`` long), ``"tgt"`` (target ids without BOS/EOS, at most
    ``max_positions - 1`` long, when the split has targets) and, with ``with_text``,
    ``"src_text"`` and ``"ref_text"`` (the raw lines, untouched).

    Args:
        data: ``datasets.Dataset`` with columns ``index``, ``src``, ``src_text`` and
            optionally ``tgt``, ``tgt_text``.
        max_positions: Longest sequence the model accepts; longer ones are truncated.
        with_text: Also return the raw source and reference lines.
        tokenizer: Re-encodes the raw text on every access when ``subword_alpha > 0``.
        subword_alpha: Sampling parameter of subword regularisation; 0 uses the cached ids.
    """

    def __init__(
        self,
        data: datasets.Dataset,
        max_positions: int,
        with_text: bool = False,
        tokenizer: Tokenizer | None = None,
        subword_alpha: float = 0.0,
    ) -> None:
        self.data = data
        self.max_positions = max_positions
        self.with_text = with_text
        self.tokenizer = tokenizer
        self.subword_alpha = subword_alpha
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
            src = self.tokenizer.encode(text["src_text"], sample=True, alpha=self.subword_alpha)
            if self.has_targets:
                tgt = self.tokenizer.encode(text["tgt_text"], sample=True, alpha=self.subword_alpha)
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
            examples.append(example)
        return examples
