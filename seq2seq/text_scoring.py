"""Teacher-forced log-probabilities of given translations ("forced decoding"): what
:meth:`seq2seq.translator.Translator.score` and ``seq2seq score`` report, as fairseq-generate's
``--score-reference``, Marian's ``marian-scorer`` and CTranslate2's ``score_batch`` do.

A target is scored as the model would produce it: the decoder reads BOS and then the target's
pieces, and each piece and the final EOS count ``log p(y_t | y_<t, x)`` under the model's
softmax (an :class:`~seq2seq.nn.Ensemble`: the renormalised mean of its models'
log-probabilities, as its searches score a step). No decoding rule applies (length limits,
``min_len``, n-gram blocking, the repetition penalty, the unknown-token ban): the score is the
model's probability of the text, which a search with ``length_penalty 0`` and none of those
rules reports for its own hypothesis. A target-language code forced first (NLLB's, M2M-100's)
is not scored, as ``translate`` leaves it out of its scores; a target too long for the model
scores ``nan`` (:func:`target_ids`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seq2seq.data.batching import collate
from seq2seq.data.tokenizer import check_sentences

__all__ = [
    "LOGITS_BUDGET",
    "TranslationScore",
    "check_pairs",
    "forced_batch",
    "pair_batches",
    "translation_score",
    "target_ids",
    "token_log_probs",
]

#: Elements of the ``(positions, vocabulary)`` logits computed at once (256 MiB in float32):
#: an NLLB vocabulary of 256,206 pieces takes 261 target positions per batch, ours of 8,000
#: take 8,388.
LOGITS_BUDGET = 1 << 26


@dataclass(frozen=True)
class TranslationScore:
    """The log-probability a model gives one translation of one source.

    Attributes:
        log_prob: the sum of the natural-log probabilities of the target's pieces and its EOS
            (``nan`` for a target too long for the model).
        pieces: the scored pieces, ``</s>`` (EOS) last.
        token_log_probs: the log-probability of each piece, in order.
    """

    log_prob: float
    pieces: tuple[str, ...]
    token_log_probs: tuple[float, ...]

    @property
    def per_token(self) -> float:
        """``log_prob`` per scored piece (EOS included): Marian's ``--normalize``, fairseq's
        reported score."""
        return self.log_prob / len(self.pieces) if self.pieces else math.nan


def check_pairs(sources: Sequence[str], targets: Sequence[str]) -> tuple[list, list]:
    """``sources`` and ``targets`` (one translation per source) as lists, checked.

    Raises:
        TypeError: for a str or no iterable instead of a list, or an entry that is no str
            (naming the list and index).
        ValueError: for lists of different lengths, or an entry holding a line break.
    """
    lists = {"sources": sources, "targets": targets}
    for name, texts in lists.items():
        if isinstance(texts, str | bytes) or not isinstance(texts, Iterable):
            raise TypeError(
                f"{name} must be a list of str (one sentence each), not {type(texts).__name__}"
            )
        lists[name] = check_sentences(texts, name)
    sources, targets = lists["sources"], lists["targets"]
    if len(sources) != len(targets):
        raise ValueError(
            f"{len(sources)} sources but {len(targets)} targets; give one target per source"
        )
    return sources, targets


def target_ids(
    tokenizer: Any, targets: list[str], tgt_lang: str | None, max_positions: int, first_line: int
) -> tuple[list[list[int]], list[int]]:
    """The target ids of each translation (a forced target-language token first, as
    ``tokenizer.encode(side="target")`` gives them) and the indices of those a model of
    ``max_positions`` can score: a longer one is warned about, naming its line (``first_line``
    the first target's), and scores ``nan``."""
    ids = tokenizer.encode(targets, side="target", tgt_lang=tgt_lang)
    limit = max_positions - 1
    too_long = [i for i, row in enumerate(ids) if len(row) > limit]
    if too_long:
        lines = ", ".join(str(first_line + i) for i in too_long[:10])
        warnings.warn(
            f"{len(too_long)} target(s) of more than the model's max_positions - 1 = {limit} "
            f"tokens (a forced language code included) score nan (line(s) {lines}"
            f"{', ...' if len(too_long) > 10 else ''})",
            UserWarning,
            stacklevel=3,
        )
    return ids, [i for i, row in enumerate(ids) if len(row) <= limit]


def translation_score(
    tokenizer: Any, ids: Sequence[int], log_probs: Sequence[float], forced: int
) -> TranslationScore:
    """The :class:`TranslationScore` of target ``ids`` (without EOS) from the log-probabilities
    of each and of EOS, leaving out the ``forced`` target-language tokens first."""
    kept = tuple(float(value) for value in log_probs[forced:])
    pieces = tuple(tokenizer.id_to_piece([*ids, tokenizer.eos_id][forced:]))
    return TranslationScore(sum(kept), pieces, kept)


def pair_batches(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int, vocab_size: int
) -> list[list[int]]:
    """Indices of pairs in batches, sorted by length: each batch holds at most ``max_tokens``
    padded source or target positions, and its logits at most :data:`LOGITS_BUDGET` elements
    (``vocab_size`` per target position); a pair above either forms a batch of its own.

    Args:
        src_lengths, tgt_lengths: per pair, its source ids (EOS included) and decoder inputs
            (BOS and the target's pieces).
        max_tokens: padded positions per batch.
        vocab_size: the model's output size.
    """
    order = sorted(range(len(src_lengths)), key=lambda i: (tgt_lengths[i], src_lengths[i]))
    batches: list[list[int]] = []
    batch: list[int] = []
    longest_src = longest_tgt = real_tgt = 0
    for i in order:
        src, tgt = max(longest_src, src_lengths[i]), max(longest_tgt, tgt_lengths[i])
        rows = len(batch) + 1
        fits = rows * max(src, tgt) <= max_tokens
        fits &= (real_tgt + tgt_lengths[i]) * vocab_size <= LOGITS_BUDGET
        if batch and not fits:
            batches.append(batch)
            batch, src, tgt, real_tgt = [], src_lengths[i], tgt_lengths[i], 0
        batch.append(i)
        longest_src, longest_tgt, real_tgt = src, tgt, real_tgt + tgt_lengths[i]
    if batch:
        batches.append(batch)
    return batches


def forced_batch(
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    tokenizer: Any,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """A teacher-forcing batch of source ids (EOS included) and target ids (without BOS or
    EOS), as training collates one (:func:`seq2seq.data.collate`), on ``device``."""
    examples = [
        {"index": i, "src": src, "tgt": tgt}
        for i, (src, tgt) in enumerate(zip(sources, targets, strict=True))
    ]
    batch = collate(examples, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@torch.no_grad()
def token_log_probs(model: torch.nn.Module, batch: dict[str, Any]) -> list[list[float]]:
    """``log p(y_t | y_<t, x)`` of each target id and of the EOS after it, teacher-forced.

    Args:
        model: a :class:`~seq2seq.nn.Transformer` or :class:`~seq2seq.nn.Ensemble`, in the
            mode the caller chose (``eval()`` for scores without dropout).
        batch: :func:`forced_batch`'s (``src``, ``src_mask``, ``tgt_in``, ``tgt_out`` and
            ``tgt_index``, the real target positions of ``(B * T)``).

    Returns:
        Per row, ``len(target) + 1`` log-probabilities (natural log; the log-softmax in
        float32 whatever the model computes in).

    Raises:
        ValueError: as the model, for a source or decoder input longer than its
            ``max_positions``.
    """
    index = batch["tgt_index"]
    # The output projection (and an ensemble's mean) at the real target positions only.
    output = model(batch["src"], batch["tgt_in"], batch["src_mask"], output_index=index)
    output = output.float()
    gold = batch["tgt_out"].flatten().index_select(0, index)
    scores = output.gather(1, gold.unsqueeze(1)).squeeze(1) - output.logsumexp(dim=-1)
    lengths = torch.bincount(index // batch["tgt_out"].size(1), minlength=len(batch["tgt_out"]))
    return [row.tolist() for row in scores.cpu().split(lengths.tolist())]
