"""Corpus-level scores through sacreBLEU, and DDP-safe gathering of hypotheses.

Scores are always computed by :mod:`sacrebleu` on detokenized hypotheses against the raw
reference lines of the held-out set, so the figures equal what the ``sacrebleu`` command
prints for the same files (Post, 2018, "A Call for Clarity in Reporting BLEU Scores").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
from sacrebleu.metrics import BLEU, CHRF, TER

from seq2seq.files import atomic_write

METRICS = ("bleu", "chrf", "ter")


@dataclass(frozen=True)
class Score:
    """One corpus-level score.

    Attributes:
        name: metric name, one of ``bleu``, ``chrf``, ``ter``.
        value: the score (BLEU and chrF in 0..100, higher is better; TER lower is better).
        text: sacreBLEU's formatted score line, e.g. ``BLEU = 36.12 68.1/43.2/...``.
        signature: sacreBLEU's signature, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|...``.
    """

    name: str
    value: float
    text: str
    signature: str


def _metric(name: str, tgt_lang: str | None):
    if name == "bleu":
        # trg_lang picks sacreBLEU's default tokenizer for that language (zh, ja-mecab, ko-mecab).
        return BLEU(trg_lang=tgt_lang or "")
    if name == "chrf":
        return CHRF()
    if name == "ter":
        return TER()
    raise ValueError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    metrics: Sequence[str] = METRICS,
    tgt_lang: str | None = None,
) -> dict[str, Score]:
    """Score detokenized hypotheses against one reference per sentence.

    Args:
        hypotheses: one detokenized hypothesis per sentence, in corpus order.
        references: the raw reference lines, same length and order.
        metrics: names from ``("bleu", "chrf", "ter")``.
        tgt_lang: target-language code; selects sacreBLEU's default BLEU tokenizer for it
            (``13a`` for most languages).

    Returns:
        A dict from metric name to :class:`Score`.

    Raises:
        ValueError: if the two lists differ in length, are empty, or a metric is unknown.
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "every reference line needs exactly one hypothesis"
        )
    if not references:
        raise ValueError("cannot score an empty set: no references")
    scores = {}
    for name in metrics:
        metric = _metric(name, tgt_lang)
        result = metric.corpus_score(list(hypotheses), [list(references)])
        scores[name] = Score(name, float(result.score), str(result), str(metric.get_signature()))
    return scores


def gather_in_order(items: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """Collect ``(index, hypothesis, reference)`` triples from every process, in corpus order.

    Under ``torch.distributed`` each process holds a disjoint share of a held-out set; this
    gathers all shares to every process (``all_gather_object``), sorts by sentence index and
    keeps one triple per index, so each sentence is scored exactly once even if a sampler
    repeated some to even out the shares.

    Args:
        items: this process's triples; ``index`` is the sentence's 0-based line number.

    Returns:
        All triples, sorted by index, without duplicate indices.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        shards: list[list[tuple[int, str, str]]] = [None] * dist.get_world_size()  # type: ignore[list-item]
        dist.all_gather_object(shards, items)
        items = [item for shard in shards for item in shard]
    unique = {index: (index, hyp, ref) for index, hyp, ref in items}
    return [unique[i] for i in sorted(unique)]


def write_lines(path: str | Path, lines: Sequence[str]) -> Path:
    """Write one line per entry (UTF-8, ``\\n`` endings), creating parent folders.

    The file is written to a temporary file beside it and renamed into place
    (:func:`seq2seq.files.atomic_write`), so a reader never sees a half-written file and a
    failed write leaves no temporary file behind. Newlines inside an entry are replaced by
    spaces to keep line alignment.
    """
    path = Path(path)
    with atomic_write(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line.replace("\n", " ").replace("\r", " ") + "\n")
    return path
