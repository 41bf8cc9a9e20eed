"""User symbols (``data.user_symbols``): strings a SentencePiece model keeps as one piece
wherever they occur, its user-defined pieces, such as the tag ``<BT>`` that marks
back-translated sources (tagged back-translation, Caswell et al. 2019, "Tagged
Back-Translation"). The target-language tags ``>>xx<<`` of several pairs are user-defined
pieces too, kept by :mod:`seq2seq.data.language_tags`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seq2seq.data.language_tags import LANGUAGE_TAG

_SPACE = "\u2581"  # ▁, which SentencePiece writes for the space before a word

#: The special pieces of every model (:mod:`seq2seq.data.tokenizer`), which a text never holds.
_SPECIAL = ("<pad>", "<unk>", "<s>", "</s>")


def check_user_symbols(symbols: Sequence[str]) -> None:
    """Raises ``ValueError`` naming ``data.user_symbols`` for a symbol that is empty, holds
    whitespace (SentencePiece splits text at it first) or ``▁`` (its word boundary, which as
    a piece of its own would split every word off), is a special piece or a
    target-language tag (``data.pairs`` adds those), or is given twice."""
    for symbol in symbols:
        why = None
        if not isinstance(symbol, str) or not symbol:
            why = "an empty one"
        elif any(c.isspace() for c in symbol):
            why = f"{symbol!r}, which holds whitespace, where SentencePiece splits a text first"
        elif _SPACE in symbol:
            why = f"{symbol!r}, which holds {_SPACE}, SentencePiece's mark of a word boundary"
        elif symbol in _SPECIAL:
            why = f"{symbol!r}, a special piece of every model"
        elif LANGUAGE_TAG.fullmatch(symbol):
            why = f"{symbol!r}, a target-language tag, which data.pairs adds where it is needed"
        elif symbols.count(symbol) > 1:
            why = f"{symbol!r} twice"
        if why:
            raise ValueError(
                f"data.user_symbols must be strings SentencePiece keeps as one piece (such as "
                f"<BT>), got {why}."
            )


def check_model_symbols(tokenizer: Any, symbols: Sequence[str], where: str) -> None:
    """Raises ``ValueError`` if ``tokenizer`` (described by ``where``, e.g.
    ``"data.tokenizer_path x.model"``) splits one of ``symbols`` when it stands inside a
    word: a model trained without it as a user symbol."""
    missing = []
    for symbol in symbols:
        ids = tokenizer.encode([f"a{symbol}a"], side="target")[0]
        if symbol not in tokenizer.id_to_piece(ids):
            missing.append(symbol)
    if missing:
        them = "it" if len(missing) == 1 else "them"
        way_out = (
            f"unset data.tokenizer_path to train a model with {them}"
            if where.startswith("data.tokenizer_path")
            else "a model's vocabulary cannot grow; train a new model with "
            f"{them} (a new run, without --init_from)"
        )
        raise ValueError(
            f"data.user_symbols {' '.join(missing)}: {where} does not keep {them} as one piece "
            f"(its SentencePiece model was trained without); {way_out}, or leave {them} out "
            "of data.user_symbols."
        )
