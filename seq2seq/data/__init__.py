"""Data pipeline: corpora, tokenizers (SentencePiece, an imported model's), batching, DataModule.

The names below are imported on first use, so that ``seq2seq.data.tokenizer`` (what a
:class:`~seq2seq.translator.Translator` needs) loads without Lightning, ``datasets`` or pyarrow.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "TokenBudgetBatchSampler": "batching",
    "collate": "batching",
    "filter_training_pairs": "batching",
    "download_multi30k": "multi30k",
    "find_split": "corpus",
    "iter_lines": "corpus",
    "iter_parallel": "corpus",
    "locate_split": "corpus",
    "read_jsonl": "corpus",
    "read_lines": "corpus",
    "read_parallel": "corpus",
    "read_tsv": "corpus",
    "TranslationDataModule": "datamodule",
    "StreamingLoader": "streaming",
    "StreamingPairs": "streaming",
    "MixedStream": "mixed_stream",
    "BOS_ID": "tokenizer",
    "EOS_ID": "tokenizer",
    "PAD_ID": "tokenizer",
    "UNK_ID": "tokenizer",
    "Tokenizer": "tokenizer",
    "VocabularyTokenizer": "vocabulary",
    "read_pretrained_tokenizer": "pretrained_tokenizers",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
