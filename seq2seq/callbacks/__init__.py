"""Lightning callbacks, one module per concern: writing predictions in input order
(:mod:`~seq2seq.callbacks.prediction`), TensorBoard samples, attention heatmaps and the best
score (:mod:`~seq2seq.callbacks.tensorboard`), the last checkpoint and graceful stops
(:mod:`~seq2seq.callbacks.last_checkpoint`), an exact resume
(:mod:`~seq2seq.callbacks.resume`) and ``train/tokens_per_s``
(:mod:`~seq2seq.callbacks.throughput`), both of which ``TranslationModule`` adds itself, text
progress lines (:mod:`~seq2seq.callbacks.progress`) and a moving average of the weights
(:mod:`~seq2seq.callbacks.ema`). Configs name them as ``seq2seq.callbacks.<Class>``."""

from seq2seq.callbacks.ema import EMA
from seq2seq.callbacks.last_checkpoint import LastCheckpoint
from seq2seq.callbacks.prediction import TranslationWriter
from seq2seq.callbacks.progress import TextProgress
from seq2seq.callbacks.resume import ExactResume
from seq2seq.callbacks.tensorboard import (
    AttentionHeatmaps,
    BestScoreHparams,
    ValidationSamples,
    plot_attention,
)
from seq2seq.callbacks.throughput import TokenThroughput

__all__ = [
    "EMA",
    "AttentionHeatmaps",
    "BestScoreHparams",
    "ExactResume",
    "LastCheckpoint",
    "TextProgress",
    "TokenThroughput",
    "TranslationWriter",
    "ValidationSamples",
    "plot_attention",
]
