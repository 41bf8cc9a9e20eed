"""Book-keeping of one pass of :class:`~seq2seq.data.streaming.StreamingPairs` over its
stream: the position of every worker class after each batch handed out, and the filtering
counts its workers add up."""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Sequence

COUNTS = ("pairs", "kept", "empty", "too_long", "skewed")
"""The filtering counts of a pass (see :func:`~seq2seq.data.batching.filter_training_pairs`)."""
_HISTORY = 256  # positions remembered by a pass (Lightning and workers prefetch a few batches)


class Pass:
    """Book-keeping of one pass over the stream (one epoch, or its rest after a resume).

    Created in the main process before DataLoader workers start, so the workers get a copy
    of its starting positions and share its counters (a ``multiprocessing`` array), which
    count per worker class and, for a stream of ``num_pairs`` language pairs, per pair.
    """

    def __init__(
        self,
        epoch: int,
        num_workers: int,
        positions: list[tuple[int, int] | None],
        next_class: int,
        batches: int,
        resumed: bool,
        num_pairs: int = 1,
    ) -> None:
        self.epoch = epoch
        self.num_pairs = num_pairs
        self.num_workers = num_workers
        self.start_positions = list(positions)
        self.positions = list(positions)
        self.start_class = next_class
        self.next_class = next_class
        self.batches = batches
        self.start_batches = batches
        self.trained_base: int | None = None  # a trainer's processed count at the start
        self.resumed = resumed
        self.started = False
        self.ended = False
        self.counts = multiprocessing.RawArray("q", len(COUNTS) * num_workers * num_pairs)
        # Per class: kept pairs above the token budget on their own, and the largest cost.
        self.over_budget = multiprocessing.RawArray("q", 2 * num_workers)
        self.history: deque[tuple[int, tuple, int]] = deque(maxlen=_HISTORY)
        self.history.append((batches, tuple(positions), next_class))

    def record(self, tag: dict[str, int]) -> None:
        """Notes that the batch tagged ``tag`` was handed out."""
        self.positions[tag["class"]] = (tag["pool"], tag["batch"])
        self.next_class = (tag["class"] + 1) % self.num_workers
        self.batches += 1
        self.history.append((self.batches, tuple(self.positions), self.next_class))

    def trained(self, processed: int) -> int | None:
        """Batches of the epoch trained (in this pass's numbering) once a trainer has
        processed ``processed`` training batches in all, or None when the pass did not note
        the trainer's count at its start (see :class:`StreamingLoader`).

        Counting the trainer's processed batches, rather than those the loader handed out
        less those it still holds, stays right whatever happens between the two: a batch the
        trainer took from its prefetch buffer, or one the loader had just handed over, when
        Ctrl-C stopped the fetching of the next one is not trained and not counted.
        """
        if self.trained_base is None:
            return None
        return self.start_batches + processed - self.trained_base

    def add_counts(self, cls: int, counts: Sequence[dict[str, int]]) -> None:
        """Adds the filtering counts of a pool read by worker class ``cls``, one dict per
        language pair."""
        for pair, pair_counts in enumerate(counts):
            base = (cls * self.num_pairs + pair) * len(COUNTS)
            for k, key in enumerate(COUNTS):
                self.counts[base + k] += pair_counts[key]

    def add_over_budget(self, cls: int, count: int, longest: int) -> None:
        """Adds ``count`` pairs above the token budget, the largest costing ``longest``."""
        self.over_budget[2 * cls] += count
        self.over_budget[2 * cls + 1] = max(self.over_budget[2 * cls + 1], longest)

    def total_over_budget(self) -> tuple[int, int]:
        """``(count, longest)`` of the pairs above the token budget in the pools read so far."""
        counts, longest = self.over_budget[0::2], self.over_budget[1::2]
        return sum(counts), max(longest, default=0)

    def total_counts(self, pair: int | None = None) -> dict[str, int]:
        """The filtering counts of the pools read so far, of one language pair or of all."""
        pairs = range(self.num_pairs) if pair is None else [pair]
        n = len(COUNTS)
        return {
            key: sum(
                self.counts[(c * self.num_pairs + p) * n + k]
                for c in range(self.num_workers)
                for p in pairs
            )
            for k, key in enumerate(COUNTS)
        }

    def position(self, batches: int) -> tuple[int, tuple, int]:
        """``(n, positions, next_class)`` after ``n`` batches of the epoch: ``n == batches``
        if remembered, else the closest earlier position remembered (or the oldest)."""
        for n, positions, next_class in reversed(self.history):
            if n <= batches:
                return n, positions, next_class
        return self.history[0]
