"""Corpus-level scores through sacreBLEU, DDP-safe gathering of hypotheses, and the held-out
sets' losses, score lines and hypothesis files of an evaluation.

A held-out set is named by its key: ``val`` and ``test/<set>`` in a run of one language pair,
``val/<pair>`` and ``test/<pair>/<set>`` (``val/de-en``) in a run of several, as the data
module's ``heldout_keys(stage)`` lists them, one per loader.

Scores are always computed by :mod:`sacrebleu` on detokenized hypotheses against the raw
reference lines of the held-out set, so the figures equal what the ``sacrebleu`` command
prints for the same files (Post, 2018, "A Call for Clarity in Reporting BLEU Scores").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from sacrebleu.metrics import BLEU, CHRF, TER

from seq2seq.data.language_tags import base_language
from seq2seq.files import atomic_write

#: The metrics that ``model.metrics`` names, by their logged name (``val/chrfpp``): sacreBLEU's
#: BLEU, chrF (``CHRF()``, character n-grams), chrF++ (``CHRF(word_order=2)``: word unigrams and
#: bigrams too; Popović, 2017, "chrF++: words helping character n-grams") and TER.
KNOWN_METRICS = ("bleu", "chrf", "chrfpp", "ter")
#: The metrics a run scores when ``model.metrics`` is left out.
METRICS = ("bleu", "chrf", "ter")
#: The metrics of :data:`KNOWN_METRICS` whose higher score is better (TER: lower).
HIGHER_IS_BETTER = frozenset({"bleu", "chrf", "chrfpp"})


@dataclass(frozen=True)
class Score:
    """One corpus-level score.

    Attributes:
        name: metric name, one of :data:`KNOWN_METRICS`.
        value: the score (0..100 for BLEU, chrF and chrF++; :data:`HIGHER_IS_BETTER`).
        text: sacreBLEU's formatted score line, e.g. ``BLEU = 36.12 68.1/43.2/...``.
        signature: sacreBLEU's signature, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|...``.
    """

    name: str
    value: float
    text: str
    signature: str


def check_metrics(names: Iterable[str]) -> list[str]:
    """``names`` as a list, checked to be of :data:`KNOWN_METRICS`.

    Raises:
        ValueError: naming the first unknown one and those known.
    """
    names = list(names)
    for name in names:
        if name not in KNOWN_METRICS:
            raise ValueError(
                f"unknown metric {name!r} in metrics; choose from {', '.join(KNOWN_METRICS)}"
            )
    return names


def _metric(name: str, tgt_lang: str | None):
    if name == "bleu":
        # trg_lang picks sacreBLEU's default tokenizer for that language (zh, ja-mecab, ko-mecab).
        return BLEU(trg_lang=base_language(tgt_lang) if tgt_lang else "")
    if name == "chrf":
        return CHRF()
    if name == "chrfpp":
        return CHRF(word_order=2)
    if name == "ter":
        return TER()
    raise ValueError(f"unknown metric {name!r}; choose from {', '.join(KNOWN_METRICS)}")


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
        metrics: names from :data:`KNOWN_METRICS`.
        tgt_lang: target-language code (``zh``; ``zho_Hans`` too); selects sacreBLEU's default
            BLEU tokenizer for it (``13a`` for most languages).

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


class HeldOutScores:
    """One evaluation's held-out sets (by key): per set, the summed losses and real target
    tokens, and each sentence's (index, hypothesis, reference)."""

    def __init__(self) -> None:
        self._outputs: dict[str, list[tuple[int, str, str]]] = {}
        self._sums: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        """Forgets every set (at the start of an evaluation and once it is scored)."""
        self._outputs, self._sums = {}, {}

    def add(
        self,
        key: str,
        sums: Sequence[torch.Tensor],
        indices: Sequence[int],
        hypotheses: Sequence[str],
        references: Sequence[str],
    ) -> None:
        """Adds a batch of set ``key``: ``sums`` = (loss sum, NLL sum, real target tokens),
        0-dim tensors, and one index, hypothesis and reference per sentence."""
        # Summed here and reduced once per set in loss(): the loss is exactly sum / tokens over
        # the whole set, on any number of processes.
        total = torch.stack([s.detach() for s in sums]).double()
        self._sums[key] = self._sums.get(key, 0) + total
        self._outputs.setdefault(key, []).extend(zip(indices, hypotheses, references, strict=True))

    def gathered(self, keys: Sequence[str]) -> Iterator[tuple[str, list[tuple[int, str, str]]]]:
        """Each set's triples from every process in corpus order (:func:`gather_in_order`), in
        the order of ``keys`` (the evaluation's held-out keys), then any other set by name: the
        same order on every process, whichever set's batches came first. Every key of ``keys``
        is gathered, so a process that saw no batch of a set still takes part; sets without
        a sentence on any process are left out."""
        order = {key: i for i, key in enumerate(keys)}
        others = sorted(key for key in self._outputs if key not in order)
        for key in [*order, *others]:
            items = gather_in_order(self._outputs.get(key, []))
            if items:
                yield key, items

    def loss(
        self, key: str, reduce: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The label-smoothed loss and the NLL per real target token of set ``key`` over all
        processes (float64); ``reduce`` sums a tensor over them (``trainer.strategy.reduce``)."""
        sums = reduce(self._sums[key])
        return sums[0] / sums[2].clamp(min=1), sums[1] / sums[2].clamp(min=1)


def write_report(
    trainer: Any,
    key: str,
    ordered: Sequence[tuple[int, str, str]],
    scores: dict[str, Score],
    checkpoint_label: str | None,
    print_fn: Callable[[str], None],
) -> None:
    """On global rank 0, prints the score lines of held-out set ``key`` and writes its
    hypotheses to ``<log_dir>/hypotheses/<key>.step<N>.txt`` (``.step<N>.avg<K>.txt`` for an
    average of K checkpoints) and the score lines beside them (``.scores``); in a
    ``fast_dev_run``, which writes no files, prints only.

    Where ``limit_*_batches`` left sentences out, the line numbers (1-based) in the set of those
    decoded are written beside the hypotheses (``.lines``), one per hypothesis.

    Args:
        trainer: the Lightning trainer; its logger's ``log_dir`` (else ``default_root_dir``)
            holds the files, and its data module's ``val_set`` / ``test_sets`` tell whether
            ``limit_*_batches`` left sentences out.
        ordered: the set's ``(index, hypothesis, reference)`` triples in corpus order
            (:meth:`HeldOutScores.gathered`; ``index`` 0-based in the set).
        checkpoint_label: outside ``fit``, the checkpoint's
            :func:`~seq2seq.checkpoint.format.checkpoint_label`, which names the files (else
            the trainer's step does).
        print_fn: prints through the progress bar (``LightningModule.print``), on lines of
            their own.
    """
    if trainer.global_rank != 0:
        return
    hypotheses = [hyp for _, hyp, _ in ordered]
    lines = [f"{key}: {score.text}\n  signature: {score.signature}" for score in scores.values()]
    total, partial = _heldout_size(trainer, key), []
    if total is not None and len(hypotheses) < total:
        limit = "limit_val_batches" if is_validation_key(key) else "limit_test_batches"
        if trainer.fast_dev_run:  # it sets the limits itself: the flag the user gave
            limit = "fast_dev_run"
        partial = [
            f"scored on {len(hypotheses)} of the {total} sentences (--trainer.{limit}): not "
            "the whole set's score"
        ]
        lines.append(f"  {partial[0]}")
    if hypotheses and not any(h.strip() for h in hypotheses):  # not a scoring fault
        lines.append(
            "  every hypothesis is empty: the model ends each at once (too little training?)"
        )
    if trainer.fast_dev_run:  # a smoke run writes no files (no logs, no checkpoints)
        print_fn("\n".join(lines))
        return
    logger = trainer.logger
    directory = getattr(logger, "log_dir", None) if logger is not None else None
    log_dir = Path(directory or trainer.default_root_dir)
    name = key.replace("/", ".")  # val, test.<set>, val.de-en, test.de-en.<set>
    label = f"step{trainer.global_step}"
    if trainer.state.fn != "fit" and checkpoint_label is not None:
        label = checkpoint_label
    hyp_path = write_lines(log_dir / "hypotheses" / f"{name}.{label}.txt", hypotheses)
    shown = f"\n  hypotheses: {hyp_path}"
    if partial:  # which sentences they are, to score them again
        numbers = write_lines(hyp_path.with_suffix(".lines"), [str(i + 1) for i, _, _ in ordered])
        shown += f" (their line numbers in the set: {numbers.name})"
    print_fn("\n".join(lines) + shown)
    score_lines = [f"{s.text}\t{s.signature}" for s in scores.values()]
    write_lines(hyp_path.with_suffix(".scores"), score_lines + partial)


def is_validation_key(key: str) -> bool:
    """Whether held-out key ``key`` names a validation set (``val``, ``val/<pair>``)."""
    return key == "val" or key.startswith("val/")


def split_test_key(key: str, pairs: Sequence[str]) -> tuple[str | None, str]:
    """``("de-en", set)`` for test key ``test/de-en/<set>`` when ``de-en`` is one of ``pairs``
    (the data module's ``pair_names``), ``(None, set)`` for ``test/<set>``."""
    rest = key.removeprefix("test/")
    pair, sep, name = rest.partition("/")
    return (pair, name) if sep and pair in pairs else (None, rest)


def heldout_sets(trainer: Any, stage: str) -> dict[str, Any]:
    """The held-out datasets of ``stage`` (``"validate"`` or ``"test"``) by key.

    A data module with ``heldout_keys(stage)`` names its loaders, and each key's dataset is
    that of the trainer's loader of the same index; otherwise (a data module of one pair) its
    ``val_set`` is ``val`` and its ``test_sets[<set>]`` are ``test/<set>``. Empty when the
    trainer has no such data module or loaders.
    """
    datamodule = getattr(trainer, "datamodule", None)
    keys = getattr(datamodule, "heldout_keys", None)
    if keys is None:
        if stage == "validate":
            val_set = getattr(datamodule, "val_set", None)
            return {} if val_set is None else {"val": val_set}
        test_sets = getattr(datamodule, "test_sets", None) or {}
        return {f"test/{name}": dataset for name, dataset in test_sets.items()}
    attribute = "val_dataloaders" if stage == "validate" else "test_dataloaders"
    loaders = getattr(trainer, attribute, None)
    if loaders is None:
        return {}
    loaders = list(loaders) if isinstance(loaders, list | tuple) else [loaders]
    names = keys(stage)
    if len(names) != len(loaders):  # loaders the data module did not make
        return {}
    return {
        key: getattr(loader, "dataset", None) for key, loader in zip(names, loaders, strict=True)
    }


def _heldout_size(trainer: Any, key: str) -> int | None:
    """Sentences in the held-out set ``key`` of the trainer's data module, if it says."""
    stage = "validate" if is_validation_key(key) else "test"
    dataset = heldout_sets(trainer, stage).get(key)
    try:
        return len(dataset) if dataset is not None else None
    except TypeError:
        return None


def score_table(scores: dict[str, dict[str, Score]], pairs: Sequence[str] = ()) -> str:
    """One row per test set (keys ``test/<set>``, in ``data.test_splits`` order), one column
    per metric::

    set               BLEU  chrF2    TER
    newstest2013     26.41  54.12  58.30
    newstest2014     27.02  55.60  57.11
    (test/bleu, test/chrf, test/ter: newstest2013's)

    With keys ``test/<pair>/<set>`` (``pairs``: the data module's ``pair_names``), one row
    per pair and set, in the keys' order, a column ``pair`` before ``set``, and with several
    pairs one ``mean`` row per set (the unweighted mean over the pairs); the last line says
    that ``test/<metric>`` are the means of the first set.
    """
    parts = [split_test_key(key, pairs) for key in scores]
    first = next(iter(scores.values()))
    metrics = ", ".join(f"test/{m}" for m in first)
    header = [score.text.split(" = ")[0] for score in first.values()]
    values = [[score.value for score in sets.values()] for sets in scores.values()]
    if all(pair is None for pair, _ in parts):
        rows = [["set", *header]]
        rows += [[name, *_cells(v)] for (_, name), v in zip(parts, values, strict=True)]
        return _table(rows, 1) + f"\n({metrics}: {parts[0][1]}'s)"
    rows = [["pair", "set", *header]]
    rows += [[pair or "-", name, *_cells(v)] for (pair, name), v in zip(parts, values, strict=True)]
    if len({pair for pair, _ in parts}) > 1:
        rows += [
            ["mean", name, *_cells(m.values())] for name, m in set_means(scores, pairs).items()
        ]
    return _table(rows, 2) + f"\n({metrics}: the mean over the pairs of {parts[0][1]})"


def _cells(values: Iterable[float]) -> list[str]:
    return [f"{value:.2f}" for value in values]


def _table(rows: list[list[str]], text_columns: int) -> str:
    """Rows as aligned columns: the first ``text_columns`` left-aligned, numbers right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < text_columns else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def set_means(
    scores: dict[str, dict[str, Score]], pairs: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Per test set, in the keys' order, each metric's unweighted mean over the set's keys:
    over its pairs for keys ``test/<pair>/<set>``, the set's own score for ``test/<set>``."""
    by_set: dict[str, list[dict[str, Score]]] = {}
    for key, sets in scores.items():
        by_set.setdefault(split_test_key(key, pairs)[1], []).append(sets)
    return {
        name: {m: sum(s[m].value for s in group) / len(group) for m in group[0]}
        for name, group in by_set.items()
    }
