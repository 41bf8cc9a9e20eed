"""Data pipeline: corpora, SentencePiece tokenizer, token-budget batching, DataModule."""

from seq2seq.data.batching import TokenBudgetBatchSampler, collate
from seq2seq.data.corpus import (
    download_multi30k,
    find_split,
    locate_split,
    read_jsonl,
    read_lines,
    read_parallel,
    read_tsv,
)
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "TokenBudgetBatchSampler",
    "Tokenizer",
    "TranslationDataModule",
    "collate",
    "download_multi30k",
    "find_split",
    "locate_split",
    "read_jsonl",
    "read_lines",
    "read_parallel",
    "read_tsv",
]
