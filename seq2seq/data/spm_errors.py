"""SentencePiece's refusals to build a vocabulary, said in the settings' terms: the bound its
trainer reported and the setting to change (``data.vocab_size``, ``data.character_coverage``)."""

from __future__ import annotations

import re

__all__ = ["SPM_CHARACTER_COVERAGE", "VocabularyError", "vocabulary_error"]

SPM_CHARACTER_COVERAGE = (0.98, 1.0)
"""The ``character_coverage`` values SentencePiece accepts (its trainer checks this range)."""

# Parts of the trainer's errors: its source location and failed check ("INTERNAL:
# src/trainer_interface.cc(638) [...] "), and the bounds it reports for a vocabulary below the
# corpus's characters or beyond what the corpus can fill.
_SPM_LOCATION = re.compile(r"^\w+: \S+\(\d+\) \[[^\]]*\]\s*")
_TOO_SMALL = re.compile(r"smaller than required_chars\. (\d+) vs (\d+)")
_TOO_HIGH = re.compile(r"too high \((\d+)\)\. Please set it to a value <= (\d+)")


class VocabularyError(ValueError):
    """SentencePiece refused to build a vocabulary of the size asked for. ``max_pieces`` is
    the most pieces it said the corpus allows, where the vocabulary was too large for it (a
    caller that sampled the corpus can then say what bounded the sample); None otherwise."""

    def __init__(self, message: str, max_pieces: int | None = None) -> None:
        super().__init__(message)
        self.max_pieces = max_pieces


def _problem(error: str, byte_fallback: bool, character_coverage: float) -> str:
    """Why SentencePiece's trainer refused to build a vocabulary with ``error``, and what to
    change; it names a bound only where SentencePiece reported one."""
    setting = "(set `data.vocab_size`; `model.vocab_size` follows it)"
    if match := _TOO_SMALL.search(error):
        needed = match.group(2)
        parts = "the 4 special pieces" + (
            ", 256 byte pieces (byte_fallback)" if byte_fallback else ""
        )
        low = SPM_CHARACTER_COVERAGE[0]
        lower = (
            f", or lower character_coverage (down to {low}) so that its rarest characters map "
            "to <unk>"
            if character_coverage > low
            else ""
        )
        return (
            f"SentencePiece needs at least {needed} pieces for it ({parts} and one per "
            f"character of the corpus that character_coverage={character_coverage} keeps, the "
            f"word boundary ▁ included). Set vocab_size to {needed} or more {setting}{lower}."
        )
    if match := _TOO_HIGH.search(error):
        return (
            f"SentencePiece can build at most {match.group(2)} pieces from it. Set vocab_size "
            f"to at most {match.group(2)} {setting} or train on more text."
        )
    if "character_coverage" in error:
        low, high = SPM_CHARACTER_COVERAGE
        return (
            f"character_coverage={character_coverage} is outside [{low}, {high}], which "
            "SentencePiece accepts (`data.character_coverage`)."
        )
    reason = _SPM_LOCATION.sub("", error).strip().rstrip(".") or error
    return (
        f"{reason}. Check vocab_size {setting} and the other SentencePiece settings, or train "
        "on more text."
    )


def vocabulary_error(
    error: str, model_type: str, vocab_size: int, byte_fallback: bool, character_coverage: float
) -> VocabularyError:
    """The error for SentencePiece's trainer failing with ``error`` to build a ``model_type``
    vocabulary of ``vocab_size`` pieces under the given settings."""
    too_high = _TOO_HIGH.search(error)
    return VocabularyError(
        f"SentencePiece could not build a {model_type} vocabulary of exactly "
        f"vocab_size={vocab_size} pieces from the training corpus: "
        f"{_problem(error, byte_fallback, character_coverage)}",
        max_pieces=int(too_high.group(2)) if too_high else None,
    )
