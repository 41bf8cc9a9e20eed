"""Data pipeline: corpora, SentencePiece tokenizer, token-budget batching, DataModule."""

from seq2seq.data.batching import TokenBudgetBatchSampler, collate, filter_training_pairs
from seq2seq.data.corpus import (
    download_multi30k,
    find_split,
    iter_lines,
    iter_parallel,
    locate_split,
    read_jsonl,
    read_lines,
    read_parallel,
    read_tsv,
)
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.streaming import StreamingLoader, StreamingPairs
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "StreamingLoader",
    "StreamingPairs",
    "TokenBudgetBatchSampler",
    "Tokenizer",
    "TranslationDataModule",
    "collate",
    "download_multi30k",
    "filter_training_pairs",
    "find_split",
    "iter_lines",
    "iter_parallel",
    "locate_split",
    "read_jsonl",
    "read_lines",
    "read_parallel",
    "read_tsv",
]
