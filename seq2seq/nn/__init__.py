"""Plain-PyTorch Transformer core: attention, layers, model, search and loss.

No dependency on Lightning nor on the rest of :mod:`seq2seq`.
"""

from seq2seq.nn.attention import DecoderCache, KVCache, MultiHeadAttention, padding_mask
from seq2seq.nn.config import TransformerConfig
from seq2seq.nn.decoding import DecodingConfig
from seq2seq.nn.ensemble import Ensemble, EnsembleCache
from seq2seq.nn.loss import label_smoothed_cross_entropy, linear_label_smoothed_cross_entropy
from seq2seq.nn.sampling import sample
from seq2seq.nn.search import Hypothesis, beam_search, greedy_search
from seq2seq.nn.transformer import Transformer

__all__ = [
    "DecoderCache",
    "DecodingConfig",
    "Ensemble",
    "EnsembleCache",
    "Hypothesis",
    "KVCache",
    "MultiHeadAttention",
    "Transformer",
    "TransformerConfig",
    "beam_search",
    "greedy_search",
    "label_smoothed_cross_entropy",
    "linear_label_smoothed_cross_entropy",
    "padding_mask",
    "sample",
]
