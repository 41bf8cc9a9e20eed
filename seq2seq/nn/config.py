"""The architecture of :class:`seq2seq.nn.Transformer`, written once.

:class:`TransformerConfig` holds every setting that decides the model's structure and its
training-time regularisation. ``Transformer(config)`` builds from it, checkpoints store it
(``checkpoint["seq2seq"]["model_config"]``, :meth:`TransformerConfig.to_dict`), and
``TranslationModule`` exposes its fields as the flat ``--model.*`` keys of the command line
(LightningCLI follows the module's ``**architecture`` into this class, docstrings included).
The blocks of :mod:`seq2seq.nn.layers` take it whole, so an option is a field here (default,
line in the docstring, check in ``__post_init__``) and its use there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["TransformerConfig"]


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and options of an encoder-decoder Transformer (Vaswani et al. 2017).

    Attributes:
        vocab_size: joint (source and target) vocabulary size V, linked from
            ``data.vocab_size`` on the command line.
        d_model: model width D.
        n_heads: attention heads H; must divide ``d_model``.
        n_encoder_layers: encoder layers.
        n_decoder_layers: decoder layers.
        d_ff: inner width of the feed-forward blocks.
        dropout: dropout on embeddings and residual branches.
        attention_dropout: dropout on attention weights.
        activation_dropout: dropout after the feed-forward activation.
        activation: feed-forward activation: ``"relu"``, ``"gelu"`` (exact erf form) or
            ``"silu"`` (``x * sigmoid(x)``, Elfwing et al. 2018; "swish", Ramachandran et al.
            2017; Marian's ``swish``).
        norm_first: Pre-LN (True, with a final LayerNorm on encoder and decoder outputs) or
            Post-LN (False, as in the original paper) layers.
        positional: ``"sinusoidal"`` (fixed, sin and cos interleaved, added to the
            embeddings), ``"sinusoidal_fairseq"`` (fairseq's fixed table as M2M-100 and NLLB
            use it: sin half, cos half, the token at position ``p`` taking row ``p + 2``; needs
            an even ``d_model`` of at least 4), ``"learned"`` (added) or ``"rotary"`` (RoPE,
            Su et al. 2021, in every self-attention; needs an even head width).
        max_positions: longest source or target sequence, in tokens, the model accepts.
        tie_embeddings: ``"none"`` (three matrices), ``"decoder"`` (target embedding = output
            projection, Press & Wolf 2017) or ``"all"`` (source embedding, target embedding and
            output projection shared, Vaswani et al. 2017 Sec. 3.4; needs a joint vocabulary).
        scale_embedding: token embeddings times ``sqrt(d_model)`` (True, Vaswani et al. 2017
            Sec. 3.4) or times 1 (False).
        output_bias: a learned ``(V,)`` bias added to the logits (Marian's
            ``final_logits_bias``), zero-initialised; False: no bias.
    """

    vocab_size: int = 8000
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = True
    positional: str = "sinusoidal"
    max_positions: int = 256
    tie_embeddings: str = "all"
    scale_embedding: bool = True
    output_bias: bool = False

    def __post_init__(self) -> None:
        """Raises ValueError naming the setting, for sizes or options the model refuses."""
        for name in ("vocab_size", "d_model", "d_ff", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_heads <= 0 or self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        choices = {
            "activation": ("relu", "gelu", "silu"),
            "positional": ("sinusoidal", "sinusoidal_fairseq", "learned", "rotary"),
            "tie_embeddings": ("none", "decoder", "all"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                options = ", ".join(repr(a) for a in allowed)
                raise ValueError(f"{name} must be one of {options}, got {getattr(self, name)!r}")
        if self.positional == "rotary" and (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"positional 'rotary' needs an even head width, got d_model / n_heads = "
                f"{self.d_model // self.n_heads}"
            )
        if self.positional == "sinusoidal_fairseq" and (self.d_model % 2 or self.d_model < 4):
            raise ValueError(
                f"positional 'sinusoidal_fairseq' needs an even d_model of at least 4, got "
                f"d_model = {self.d_model}"
            )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the fields, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TransformerConfig:
        """A config from a mapping that may hold other keys too (e.g. a checkpoint's
        ``model_config`` or hyperparameters): fields it lacks take their defaults.

        Raises:
            ValueError: as the constructor.
        """
        names = set(cls.field_names())
        return cls(**{k: v for k, v in values.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dictionary (what checkpoints store)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TransformerConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)
