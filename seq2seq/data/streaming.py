"""Training pairs streamed from a corpus too large for memory, cut into token-budget batches.

The stream is read in *pools* of ``pool_size`` consecutive pairs (pool ``p`` holds pairs
``p * pool_size`` to ``(p + 1) * pool_size - 1`` of the stream, counted before filtering).
Each pool is tokenised, filtered like the cached training split (see
:func:`~seq2seq.data.batching.filter_training_pairs`) and cut into token-budget batches by a
:class:`~seq2seq.data.batching.TokenBudgetBatchSampler` whose seed is derived from
``(seed, epoch, p)``, so the batches of a pool are shuffled differently every epoch and
reproducibly for a seed. Shuffling mixes pairs within a pool, never across pools: the pool
size is the shuffle window, and pools follow the order of the stream.

Data parallel: every rank reads (and tokenises) the whole stream and takes rank ``r``'s share
of every pool's batches, which are disjoint between ranks, cover the pool, and are equal in
number on every rank (``even_batches``), so all ranks end an epoch after the same number of
batches.

DataLoader workers: with ``W`` workers, pool ``p`` is tokenised and batched by the worker
serving *class* ``p % W``; each worker reads the whole stream and skips the pools of other
classes without tokenising them. The DataLoader takes one batch from each worker in turn, so
the batch order depends on ``W`` (but not on timing).

Resuming: :class:`StreamingLoader` notes, for each batch it hands out, the position of every
class (pool and number of batches done in it) and which class is due next;
:meth:`StreamingPairs.state_dict` returns the position after a given number of batches, and
after :meth:`StreamingPairs.load_state_dict` the next pass re-reads the stream from the pools
in progress (skipping earlier pairs without tokenising them, by position where the format
allows) and continues with exactly the batches that had not been handed out, in the same
order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from seq2seq.data.batching import (
    TokenBudgetBatchSampler,
    collate,
    describe_filtering,
    describe_over_budget,
    filter_training_pairs,
    over_budget,
    replicas_mismatch_message,
    training_budget_advice,
)
from seq2seq.data.corpus import CorpusSplit
from seq2seq.data.mixed_stream import MixedStream, encode_by_pair, read_chunks
from seq2seq.data.stream_pass import Pass
from seq2seq.data.tokenizer import EOS_ID, PAD_ID, Tokenizer, flatten_ids, id_dtype

POSITION_KEY = "stream_position"
"""Key of the position tag that :class:`StreamingPairs` adds to each batch and
:class:`StreamingLoader` removes before handing the batch out."""


@dataclass
class _Pool:
    """The tokenised pairs of one pool: flat ids and offsets per side, and which are kept."""

    index: int
    first: int  # stream index of the pool's first pair
    src: tuple[np.ndarray, np.ndarray]  # (values, offsets) over every pair of the pool
    tgt: tuple[np.ndarray, np.ndarray]
    kept: np.ndarray  # pool-local positions of the pairs that passed the filter
    text: tuple[list[str], list[str]] | None  # raw lines, for subword sampling
    pair: np.ndarray | None  # each item's language pair, from a MixedStream


class StreamingPairs(IterableDataset):
    """Token-budget training batches from a stream of sentence pairs, pool by pool.

    Iterate it through :class:`StreamingLoader`, which prepares each pass (epoch, resume
    position, worker classes) and keeps the positions for :meth:`state_dict`. Batches are
    dicts from :func:`~seq2seq.data.batching.collate`; ``"index"`` is a pair's position in
    the stream (before filtering).

    Args:
        corpus: The training split (see :func:`~seq2seq.data.corpus.locate_split`), read
            with :meth:`~seq2seq.data.corpus.CorpusSplit.iter_chunks` (Hub datasets with
            ``streaming=True``), or several pairs' as a
            :class:`~seq2seq.data.mixed_stream.MixedStream` (whose batches carry ``"pair"``).
        tokenizer: Tokenizer of the source and target sides.
        max_tokens: Token budget of a batch (sentences x longest sequence, padded positions).
            A pair that needs more on its own forms a batch of its own, over the budget; the
            first time that happens it is warned about (see :meth:`warn_over_budget`), and the
            counts logged after every epoch give the number of such pairs.
        max_positions: Longest sequence, with EOS/BOS, the model accepts; longer pairs are
            dropped.
        max_length_ratio: Drop pairs whose longer side has more than this many times the
            tokens of the shorter side.
        pool_size: Pairs per pool: the shuffle window, and how many pairs a worker holds.
        seed: Base seed of the batch shuffling.
        num_replicas: Number of data-parallel ranks.
        rank: This process's rank.
        bucket_size: Sort within random buckets of this size inside a pool (see
            :class:`~seq2seq.data.batching.TokenBudgetBatchSampler`).
        subword_alpha: If > 0, re-segment every batch with SentencePiece sampling (subword
            regularisation); batching uses the deterministic lengths.
        pad_to_multiple_of: Round padded lengths up to a multiple of this.
        chunk_size: Pairs read and tokenised at a time.
        languages: ``tokenizer.encode``'s language keywords of each pair (one entry for one
            pair; :func:`~seq2seq.data.pairs.encode_languages`); None: none.

    Raises:
        ValueError: If ``pool_size`` or ``chunk_size`` is below 1.
    """

    def __init__(
        self,
        corpus: CorpusSplit | MixedStream,
        tokenizer: Tokenizer,
        max_tokens: int,
        max_positions: int,
        max_length_ratio: float = 3.0,
        pool_size: int = 100_000,
        seed: int = 1,
        num_replicas: int = 1,
        rank: int = 0,
        bucket_size: int | None = None,
        subword_alpha: float = 0.0,
        pad_to_multiple_of: int = 1,
        chunk_size: int = 10_000,
        languages: Sequence[Mapping[str, str]] | None = None,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}.")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
        self.corpus = corpus
        self.tokenizer = tokenizer
        n_pairs = len(corpus.names) if isinstance(corpus, MixedStream) else 1
        self.languages = list(languages) if languages else [{}] * n_pairs
        self.max_tokens = max_tokens
        self.max_positions = max_positions
        self.max_length_ratio = max_length_ratio
        self.pool_size = pool_size
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.bucket_size = bucket_size
        self.subword_alpha = subword_alpha
        self.pad_to_multiple_of = pad_to_multiple_of
        self.chunk_size = min(chunk_size, pool_size)
        self.epoch = 0
        self.last_counts: dict[str, int] | None = None
        """Filtering counts of the last complete pass (``pairs``, ``kept``, ``empty``,
        ``too_long``, ``skewed``); a resumed pass counts only the pools it read."""
        self._pass: Pass | None = None
        self._resume: dict[str, Any] | None = None
        self._over_budget_warned = False  # see warn_over_budget

    # ------------------------------------------------------------------ epochs and state
    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch of the next pass (and with it the shuffling)."""
        self.epoch = epoch

    def state_dict(self, batches: int | None = None, epoch: int | None = None) -> dict[str, Any]:
        """The position after ``batches`` batches of the current pass's epoch.

        Args:
            batches: Batches of the epoch consumed so far (e.g. a trainer's processed count,
                which lags behind what the loader has handed out, counted from the start of
                the epoch also when it was resumed, see :meth:`Pass.trained`); None: all
                handed out.
            epoch: The epoch being trained (a trainer's current epoch), if known: when the
                current pass has ended and belongs to another one, the next epoch has not
                started and ``{}`` (start from its beginning) is returned. A pass that has not
                ended is the one being trained whatever ``epoch`` says: a trainer stopped by
                ``max_steps`` or a stop request counts the epoch it cut short as complete
                before its last checkpoint, and a resumed trainer restarts the pass's epoch
                (then its position applies) or a later one (then it is dropped).

        Returns:
            ``{"epoch", "complete", "batches", "num_workers", "positions", "next_class",
            "seed", "num_replicas", "pool_size"}`` (``complete``: the epoch's last batch was
            consumed), or ``{}`` before the first pass.
        """
        plan = self._pass
        if plan is None:
            return dict(self._resume) if self._resume else {}
        if epoch is not None and epoch != plan.epoch and plan.ended:
            return {}
        wanted = plan.batches if batches is None else batches
        n, positions, next_class = plan.position(wanted)
        if n != wanted:
            rank_zero_warn(
                f"The stream position after {wanted} batches of epoch {plan.epoch} is no "
                f"longer known; saving the one after {n} batches, so a resumed run repeats "
                f"{wanted - n} batches."
            )
        return {
            "epoch": plan.epoch,
            "complete": plan.ended and n == plan.batches,
            "batches": n,
            "num_workers": plan.num_workers,
            "positions": [list(p) if p is not None else None for p in positions],
            "next_class": next_class,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "pool_size": self.pool_size,
            **self._mixture(),
        }

    def _mixture(self) -> dict[str, Any]:
        is_mixed = isinstance(self.corpus, MixedStream)
        return {"mixture": self.corpus.state()} if is_mixed else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next pass continue from a position saved by :meth:`state_dict`.

        Raises:
            ValueError: If the state was saved with another seed, number of replicas or pool
                size, which would give other batches.
        """
        if not state:
            return
        if state["num_replicas"] != self.num_replicas:
            raise ValueError(replicas_mismatch_message(state["num_replicas"], self.num_replicas))
        for key in ("seed", "pool_size"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"Stream state was saved with {key}={state[key]}, but this run has "
                    f"{key}={getattr(self, key)}; the remaining batches cannot be reproduced."
                )
        saved, mine = state.get("mixture"), self._mixture().get("mixture")
        if saved and mine and saved["sizes"] != mine["sizes"]:
            rank_zero_warn(
                f"The training splits held {saved['sizes']} sentence pairs when the stream "
                f"position was saved and hold {mine['sizes']} now ({', '.join(mine['pairs'])}): "
                "the pairs drawn from here on differ from the interrupted run's."
            )
        self._resume = dict(state)
        self.epoch = int(state["epoch"])

    @property
    def current_pass(self) -> Pass | None:
        """The latest pass started (by :class:`StreamingLoader`), or None before the first."""
        return self._pass

    def start_pass(self, num_workers: int, epoch: int | None = None) -> Pass:
        """Prepares a pass over the stream; called by :class:`StreamingLoader`.

        Args:
            num_workers: DataLoader workers (1 for none).
            epoch: The epoch (a trainer's current epoch); None: :attr:`epoch`. A resume
                position saved for another epoch is dropped; one saved after the last batch
                of this epoch starts the next epoch instead (a trainer resumed from there
                finishes the epoch without asking for batches, then continues with the
                iterator it has).

        Raises:
            ValueError: If a resume position was saved with another number of workers.
        """
        resume, self._resume = self._resume, None
        epoch = self.epoch if epoch is None else epoch
        pairs = len(self.languages)
        if resume is not None and resume["epoch"] != epoch:
            resume = None
        if resume is not None and resume.get("complete"):
            # Numbered on from the finished epoch's count, as such a trainer counts them.
            start = [None] * num_workers
            plan = Pass(epoch + 1, num_workers, start, 0, resume["batches"], False, pairs)
        elif resume is None:
            plan = Pass(epoch, num_workers, [None] * num_workers, 0, 0, False, pairs)
        else:
            if resume["num_workers"] != num_workers:
                raise ValueError(
                    f"Stream state was saved with {resume['num_workers']} DataLoader "
                    f"worker(s) but this run uses {num_workers}; set data.num_workers to "
                    f"{resume['num_workers']} (0 counts as 1) to resume mid-epoch."
                )
            positions = [tuple(p) if p is not None else None for p in resume["positions"]]
            next_class, done = resume["next_class"], resume["batches"]
            plan = Pass(epoch, num_workers, positions, next_class, done, True, pairs)
        self.epoch = plan.epoch
        self._pass = plan
        return plan

    def end_pass(self, plan: Pass) -> None:
        """Logs the filtering counts of a complete pass (and how many kept pairs exceed
        ``max_tokens`` on their own, if any) and moves on to the next epoch.

        Raises:
            ValueError: If a pass from the start of the stream found no pair, or kept none.
        """
        plan.ended = True
        counts = plan.total_counts()
        where = self.corpus.describe()
        if not plan.resumed and counts["pairs"] == 0:
            raise ValueError(f"The training split {self.corpus.split!r} is empty: {where}.")
        if not plan.resumed and counts["kept"] == 0:
            raise ValueError(
                f"Every training pair of {where} was filtered out (empty, longer than "
                f"max_positions={self.max_positions}, or length ratio above "
                f"max_length_ratio={self.max_length_ratio})."
            )
        self.last_counts = counts
        resumed = " (the pools read after resuming)" if plan.resumed else ""
        n_over, _ = plan.total_over_budget()
        over = f"; {n_over} kept pairs above max_tokens={self.max_tokens} on their own"
        rank_zero_info(
            f"Streamed training pairs from {where}, epoch {plan.epoch}{resumed}: "
            f"{describe_filtering(counts, self.max_positions, self.max_length_ratio)}"
            f"{over if n_over else ''}{self._pair_counts(plan, resumed)}."
        )
        if self.epoch == plan.epoch:
            self.epoch += 1

    def _pair_counts(self, plan: Pass, resumed: str) -> str:
        """``; per pair: de-en kept 1951 of 2000, ...`` for several pairs, each pair that kept
        none of the pairs it drew warned about (the epoch trained on the others alone)."""
        if not isinstance(self.corpus, MixedStream):
            return ""
        parts = []
        for k, name in enumerate(self.corpus.names):
            counts = plan.total_counts(k)
            parts.append(f"{name} kept {counts['kept']} of {counts['pairs']}")
            if counts["pairs"] and not counts["kept"]:
                why = describe_filtering(counts, self.max_positions, self.max_length_ratio)
                rank_zero_warn(
                    f"{name} kept none of its training pairs in epoch {plan.epoch}{resumed} "
                    f"({why}): the model trained on the other pairs alone"
                )
        return f"; per pair: {', '.join(parts)}"

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        plan = self._pass
        if plan is None or plan.started:
            plan = self.start_pass(num_workers)  # iterated directly, not by StreamingLoader
        plan.started = True  # in this process
        if plan.num_workers != num_workers:
            raise RuntimeError(
                f"The pass was prepared for {plan.num_workers} worker(s) but runs in "
                f"{num_workers}; iterate StreamingPairs through StreamingLoader."
            )
        cls = (worker + plan.start_class) % num_workers
        first_pool, done = plan.start_positions[cls] or (cls, 0)
        for index, src, tgt, pairs in self._read_pools(first_pool, num_workers, plan.epoch):
            pool, counts = self._tokenize(index, src, tgt, pairs)
            plan.add_counts(cls, counts)
            plan.add_over_budget(cls, *over_budget(self._costs(pool)[0], self.max_tokens))
            if info is None:  # in this process; StreamingLoader warns for its workers
                self.warn_over_budget(plan)
            batches = self.pool_batches(pool, plan.epoch)
            for k in range(done if index == first_pool else 0, len(batches)):
                batch = self._collate(pool, batches[k])
                batch[POSITION_KEY] = {"class": cls, "pool": index, "batch": k + 1}
                yield batch

    def _read_pools(
        self, first_pool: int, step: int, epoch: int
    ) -> Iterator[tuple[int, list, list, np.ndarray | None]]:
        """``(pool, src_lines, tgt_lines, pairs)`` of pools ``first_pool``, ``first_pool +
        step``, ... of ``epoch`` (``pairs``: each item's pair, None for one pair's split).

        Pairs of the pools in between are read but neither kept nor tokenised.
        """
        size = self.pool_size
        pool, filled, src_buf, tgt_buf, pair_buf = first_pool, 0, [], [], []
        chunks = read_chunks(self.corpus, self.chunk_size, first_pool * size, epoch)
        for src, tgt, pairs in chunks:
            i = 0
            while i < len(src):
                take = min(size - filled, len(src) - i)
                mine = (pool - first_pool) % step == 0
                if mine:
                    src_buf += src[i : i + take]
                    tgt_buf += tgt[i : i + take]
                    pair_buf += [] if pairs is None else [pairs[i : i + take]]
                filled += take
                i += take
                if filled == size:
                    if mine:
                        yield pool, src_buf, tgt_buf, _joined(pair_buf)
                    pool, filled, src_buf, tgt_buf, pair_buf = pool + 1, 0, [], [], []
        if filled and (pool - first_pool) % step == 0:
            yield pool, src_buf, tgt_buf, _joined(pair_buf)

    def _encode(
        self, texts: list[str], pairs: np.ndarray | None, side: str = "source"
    ) -> tuple[np.ndarray, np.ndarray]:
        """Flat ids and offsets of ``texts`` (``side``'s text, see ``Tokenizer.encode``,
        with each text's pair's languages), tokenised ``chunk_size`` lines at a time."""
        dtype = id_dtype(self.tokenizer.vocab_size)
        values, offsets, base = [], [np.zeros(1, dtype=np.int64)], 0
        for start in range(0, len(texts), self.chunk_size):
            chunk = texts[start : start + self.chunk_size]
            chunk_pairs = None if pairs is None else pairs[start : start + self.chunk_size]
            ids = encode_by_pair(self.tokenizer, chunk, chunk_pairs, self.languages, side=side)
            v, o = flatten_ids(ids, dtype)
            values.append(v)
            offsets.append(o[1:] + base)
            base += int(o[-1])
        return np.concatenate(values or [np.zeros(0, dtype)]), np.concatenate(offsets)

    def _tokenize(
        self, index: int, src: list[str], tgt: list[str], pairs: np.ndarray | None
    ) -> tuple[_Pool, list[dict[str, int]]]:
        """The pool's ids and kept pairs, and the filtering counts of each language pair."""
        src_ids, tgt_ids = self._encode(src, pairs), self._encode(tgt, pairs, side="target")
        lengths = np.diff(src_ids[1]), np.diff(tgt_ids[1])
        n_pairs = len(self.languages)
        groups = [slice(None)] if pairs is None else [pairs == k for k in range(n_pairs)]
        keep, counts = np.zeros(len(src), dtype=bool), []
        for group in groups:  # each language pair's items, filtered and counted once
            kept, group_counts = filter_training_pairs(
                *(side[group] for side in lengths), self.max_positions, self.max_length_ratio
            )
            keep[group] = kept
            counts.append(group_counts)
        text = (src, tgt) if self.subword_alpha > 0 else None
        first = index * self.pool_size
        return _Pool(index, first, src_ids, tgt_ids, np.flatnonzero(keep), text, pairs), counts

    def _costs(self, pool: _Pool) -> tuple[np.ndarray, np.ndarray]:
        """``(cost, tie_breaker)`` of the pool's kept pairs, each (K,): the padded positions a
        pair needs, ``max(src_len + 1, tgt_len + 1)``, and the sampler's secondary key."""
        s = np.diff(pool.src[1])[pool.kept] + 1  # with EOS
        t = np.diff(pool.tgt[1])[pool.kept] + 1  # with BOS (input) or EOS (output)
        return np.maximum(s, t), t * (self.max_positions + 1) + s

    def warn_over_budget(self, plan: Pass) -> None:
        """Warns, the first time it happens, that pairs read so far need more than
        ``max_tokens`` on their own (each becomes a batch of its own); called in the main
        process, by :class:`StreamingLoader` for its workers."""
        if self._over_budget_warned:
            return
        count, longest = plan.total_over_budget()
        if not count:
            return
        self._over_budget_warned = True
        advice = (
            f"{training_budget_advice(longest)} Warned once; the counts logged after every "
            "epoch give their number."
        )
        what = f"sentence pairs of {self.corpus.split!r} read so far (epoch {plan.epoch})"
        rank_zero_warn(
            describe_over_budget(count, longest, "max_tokens", self.max_tokens, what, advice)
        )

    def pool_batches(self, pool: _Pool, epoch: int) -> list[list[int]]:
        """This rank's batches of a pool in an epoch, as positions into ``pool.kept``."""
        if pool.kept.size == 0:
            return []
        costs, tie_breaker = self._costs(pool)
        entropy = [self.seed % (1 << 64), epoch, pool.index]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
        sampler = TokenBudgetBatchSampler(
            costs,
            self.max_tokens,
            shuffle=True,
            seed=seed,
            num_replicas=self.num_replicas,
            rank=self.rank,
            bucket_size=self.bucket_size,
            even_batches=True,
            tie_breaker=tie_breaker,
        )
        return list(sampler)

    def _collate(self, pool: _Pool, batch: list[int]) -> dict[str, Any]:
        positions = pool.kept[batch].tolist()
        if pool.text is None:
            (src_values, src_offsets), (tgt_values, tgt_offsets) = pool.src, pool.tgt
            src = [src_values[src_offsets[i] : src_offsets[i + 1]] for i in positions]
            tgt = [tgt_values[tgt_offsets[i] : tgt_offsets[i + 1]] for i in positions]
        else:
            limit, pairs = (
                self.max_positions - 1,
                None if pool.pair is None else pool.pair[positions],
            )
            src_text, tgt_text = ([text[i] for i in positions] for text in pool.text)
            options = {"sample": True, "alpha": self.subword_alpha}
            src = encode_by_pair(self.tokenizer, src_text, pairs, self.languages, **options)
            tgt = encode_by_pair(self.tokenizer, tgt_text, pairs, self.languages,
                                 side="target", **options)  # fmt: skip
            src, tgt = [ids[:limit] for ids in src], [ids[:limit] for ids in tgt]
        examples = [
            {"index": pool.first + i, "src": np.append(s, EOS_ID).astype(np.int64), "tgt": t}
            for i, s, t in zip(positions, src, tgt, strict=True)
        ]
        if pool.pair is not None:
            for example, i in zip(examples, positions, strict=True):
                example["pair"] = int(pool.pair[i])
        return collate(
            examples,
            pad_id=PAD_ID,
            bos_id=self.tokenizer.bos_id,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )


def _as_is(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


def _joined(parts: list[np.ndarray]) -> np.ndarray | None:
    return np.concatenate(parts) if parts else None


class StreamingLoader(DataLoader):
    """DataLoader of a :class:`StreamingPairs`: one pass per iteration, positions noted.

    Each iteration first prepares the pass (epoch from ``epoch_source``, resume position,
    worker classes) and starts fresh workers (never persistent ones, so that they get the
    pass's settings), then removes each batch's position tag and notes it, and after a
    complete pass logs the filtering counts. It has no length: an epoch ends when the stream
    ends.

    Args:
        dataset: The streamed training pairs.
        num_workers: Worker processes; each reads the whole stream and handles every
            ``num_workers``-th pool.
        epoch_source: Returns the epoch of the next pass (e.g. a trainer's current epoch), or
            None to use the dataset's own, which advances after every complete pass.
        processed_source: Returns the number of training batches a trainer has processed in
            all (or None), noted when a pass starts: see :meth:`Pass.trained`.
        **kwargs: Other DataLoader arguments (e.g. ``prefetch_factor``).
    """

    def __init__(
        self,
        dataset: StreamingPairs,
        num_workers: int = 0,
        epoch_source: Callable[[], int | None] | None = None,
        processed_source: Callable[[], int | None] | None = None,
        **kwargs: Any,
    ) -> None:
        # A generator of its own (unless given): starting a pass then draws the workers' base
        # seed from it, leaving the global random state (dropout masks) untouched.
        kwargs.setdefault("generator", torch.Generator().manual_seed(0))
        super().__init__(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            collate_fn=_as_is,
            persistent_workers=False,
            **kwargs,
        )
        self.epoch_source = epoch_source
        self.processed_source = processed_source

    def __iter__(self) -> Iterator[dict[str, Any]]:
        dataset: StreamingPairs = self.dataset
        epoch = self.epoch_source() if self.epoch_source is not None else None
        plan = dataset.start_pass(max(1, self.num_workers), epoch)
        if self.processed_source is not None:
            plan.trained_base = self.processed_source()
        for batch in super().__iter__():
            plan.record(batch.pop(POSITION_KEY))
            if self.num_workers > 0:
                dataset.warn_over_budget(plan)
            yield batch
        dataset.end_pass(plan)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch of the next pass (when ``epoch_source`` gives None)."""
        self.dataset.set_epoch(epoch)
