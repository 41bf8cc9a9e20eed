"""The decoding settings of :mod:`seq2seq.nn.search` and :mod:`seq2seq.nn.sampling`, written once.

:class:`DecodingConfig` is the twin of :class:`~seq2seq.nn.config.TransformerConfig`: its
fields, defaults and documentation are the only place a decoding option is declared, and
``__post_init__`` the only place it is validated. The searches take it, checkpoints store it
(:meth:`DecodingConfig.to_dict`), ``TranslationModule`` exposes it as ``--model.decoding.*``
and ``seq2seq translate`` builds one flag per field from it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DecodingConfig"]

LENGTH_PENALTY_FORMS = ("fairseq", "gnmt")


@dataclass(frozen=True)
class DecodingConfig:
    """How hypotheses are searched for (or sampled) and scored.

    Attributes:
        beam_size: beams per sentence; 1 is greedy search.
        length_penalty: exponent alpha of the length penalty that scores are divided by.
        length_penalty_form: ``"fairseq"`` (len ** alpha) or ``"gnmt"``
            (((5 + len) / 6) ** alpha, Wu et al. 2016, Eq. 14).
        max_len_a: a hypothesis has at most ``max_len_a * src_len + max_len_b`` tokens (at
            least 1, at most ``max_positions``).
        max_len_b: see ``max_len_a``.
        min_len: EOS is banned before this many tokens (the maximum length wins over it).
        no_repeat_ngram_size: ban a token that would repeat an n-gram of this size in its
            hypothesis (fairseq's ``--no-repeat-ngram-size``); 0 = off.
        repetition_penalty: before the log-softmax, the logit of every token id already in
            the hypothesis (generated or forced by the prefix; BOS is none of them) is divided
            by it where positive and multiplied by it where negative, once per id (Keskar et
            al. 2019, Eq. 2); 1 = off, > 1 penalises, < 1 rewards. CTranslate2's
            ``repetition_penalty`` counts the same tokens; Hugging Face's also counts the
            decoder start token, and its beam search penalises log-probabilities (after its
            log-softmax) instead of logits. How the searches apply it:
            :mod:`seq2seq.nn.rules`.
        disable_unk: ban the unknown token (``<unk>``, written ``⁇``) from every hypothesis
            (CTranslate2's ``disable_unk``, fairseq's ``--unkpen`` of infinity); a target
            prefix may still hold it.
        sampling: sample (:func:`seq2seq.nn.sample`) instead of searching.
        sampling_topk: with sampling, keep the k most probable tokens; 0 = off.
        sampling_topp: with sampling, keep the smallest set of most probable tokens whose
            probability reaches p (Holtzman et al. 2020); in (0, 1], 1 = off.
        temperature: with sampling, divides the logits before the cuts; > 0.
        n_samples: with sampling, samples per sentence.
        sampling_seed: with sampling, the seed of the draws: a sentence's samples depend on
            it and on the sentence only.
    """

    beam_size: int = 5
    length_penalty: float = 1.0
    length_penalty_form: str = "fairseq"
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    disable_unk: bool = False
    sampling: bool = False
    sampling_topk: int = 0
    sampling_topp: float = 1.0
    temperature: float = 1.0
    n_samples: int = 1
    sampling_seed: int = 0

    #: The fields that only sampling reads: giving one asks for sampling.
    SAMPLING_FIELDS = (
        "sampling_topk",
        "sampling_topp",
        "temperature",
        "n_samples",
        "sampling_seed",
    )

    def __post_init__(self) -> None:
        """Raises ValueError naming the field and its value, for a value out of range."""
        for name in ("beam_size", "n_samples"):
            _check_int(name, getattr(self, name), 1)
        for name in ("max_len_b", "min_len", "no_repeat_ngram_size", "sampling_topk"):
            _check_int(name, getattr(self, name), 0)
        if not 0.0 <= self.max_len_a < math.inf:
            raise ValueError(f"max_len_a must be >= 0, got {self.max_len_a}")
        if self.length_penalty_form not in LENGTH_PENALTY_FORMS:
            raise ValueError(
                f"length_penalty_form must be 'fairseq' or 'gnmt', got {self.length_penalty_form!r}"
            )
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty}")
        if not 0.0 < self.repetition_penalty < math.inf:
            raise ValueError(
                f"repetition_penalty must be a finite number > 0 (1 = off), "
                f"got {self.repetition_penalty}"
            )
        if not 0.0 < self.sampling_topp <= 1.0:
            raise ValueError(
                f"sampling_topp must lie in (0, 1] (1 = off), got {self.sampling_topp}"
            )
        if not 0.0 < self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
        _check_int("sampling_seed", self.sampling_seed, None)
        for name in ("disable_unk", "sampling"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the fields, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DecodingConfig:
        """A config from a mapping that may hold other keys too: a checkpoint's
        hyperparameters, whose decoding settings are a ``"decoding"`` dictionary or, in
        checkpoints written before it existed, flat keys. Missing fields take their defaults.

        Raises:
            ValueError: as the constructor.
        """
        nested = values.get("decoding")
        if isinstance(nested, DecodingConfig):
            return nested
        source = nested if isinstance(nested, Mapping) else values
        names = set(cls.field_names())
        return cls(**{k: v for k, v in source.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dictionary (what checkpoints store)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> DecodingConfig:
        """A copy with some fields changed.

        Raises:
            TypeError: for a name that is no field.
            ValueError: as the constructor.
        """
        return dataclasses.replace(self, **changes)


def _check_int(name: str, value: Any, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
