"""The training splits of several language pairs read as one stream (``data.streaming`` with
several ``data.pairs``), each pair's share set by temperature sampling.

Epoch ``e`` of the mixed stream has N items, N the sum of the pairs' sizes (as an epoch of the
cached path draws N examples, :class:`~seq2seq.data.batching.TokenBudgetBatchSampler`). The
pair of each item is drawn with the probabilities of
:func:`~seq2seq.data.batching.temperature_probs` (Arivazhagan et al. 2019; fairseq's
``--sampling-method temperature``), :data:`BLOCK` items at a time: block ``b`` of epoch ``e``
draws its counts per pair ~ Multinomial(block length, probs) and then their order from a
generator seeded by ``(seed, e, b)``. Any position of any epoch is so found again from the
seed alone, without reading data: by a resumed run, by each DataLoader worker (which skips the
pools of the others) and by each data-parallel rank.

Each pair's split is read as a cycle that goes on across epochs: epoch ``e`` of pair ``i``
starts after the items it gave in the earlier epochs (modulo its size), so a large pair drawn
less often than its size goes on where it stopped instead of repeating its head, and a small
one drawn more often comes round again, as ``datasets.interleave_datasets(...,
stopping_strategy="all_exhausted")`` restarts an exhausted source.

:class:`~seq2seq.data.streaming.StreamingPairs` reads a :class:`MixedStream` in place of one
:class:`~seq2seq.data.corpus.CorpusSplit`, in pools, as it reads one pair (:func:`read_chunks`),
and encodes each pool's items with their pair's language tags (:func:`encode_by_pair`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from seq2seq.data.corpus import CorpusSplit

BLOCK = 1 << 16
"""Items whose pairs are drawn at once; part of what decides the stream (do not change it)."""


class MixedStream:
    """The items of several pairs' training splits in the order of temperature sampling.

    Args:
        corpora: Each pair's training split.
        names: Each pair's name (``"de-en"``), for messages and checkpoints.
        sizes: Each pair's number of sentence pairs (:meth:`CorpusSplit.count`), before
            filtering.
        probs: (P,) float, each pair's sampling probability (sum 1).
        seed: Seed of the draws (``data.seed``).

    Raises:
        ValueError: If the lists differ in length, a size is below 0, the sizes sum to 0, or
            a pair of positive probability has no items.
    """

    def __init__(
        self,
        corpora: Sequence[CorpusSplit],
        names: Sequence[str],
        sizes: Sequence[int],
        probs: Sequence[float],
        seed: int,
    ) -> None:
        if not len(corpora) == len(names) == len(sizes) == len(probs):
            raise ValueError("corpora, names, sizes and probs need one entry per pair each.")
        self.corpora = list(corpora)
        self.names = list(names)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.probs = np.asarray(probs, dtype=np.float64)
        self.probs = self.probs / self.probs.sum()
        self.seed = seed
        if self.sizes.min() < 0 or self.sizes.sum() == 0:
            raise ValueError(f"Pair sizes must be >= 0 with a positive total: {sizes}.")
        chances = zip(self.names, self.sizes, self.probs, strict=True)
        empty = [name for name, size, p in chances if p > 0 and not size]
        if empty:
            raise ValueError(f"The training split of {', '.join(empty)} is empty.")
        self._epoch_counts: dict[int, np.ndarray] = {}

    @property
    def split(self) -> str:
        """The training split's name."""
        return self.corpora[0].split

    def __len__(self) -> int:
        """N, the items of an epoch."""
        return int(self.sizes.sum())

    def describe(self) -> str:
        """Where the pairs are, for messages: ``de-en: a.de + a.en; en-fr: ...``."""
        places = zip(self.names, self.corpora, strict=True)
        return "; ".join(f"{name}: {corpus.describe()}" for name, corpus in places)

    def state(self) -> dict[str, Any]:
        """What decides the stream besides the seed: ``{"pairs", "sizes", "probs"}``."""
        return {"pairs": self.names, "sizes": self.sizes.tolist(), "probs": self.probs.tolist()}

    # ------------------------------------------------------------------ the draws
    def _generator(self, epoch: int, block: int) -> np.random.Generator:
        # spawn_key apart from the pools' shuffling seeds, (seed, epoch, pool)
        entropy = [self.seed % (1 << 64), epoch, block]
        return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(1,)))

    def _blocks(self) -> int:
        return -(-len(self) // BLOCK)

    def _block_counts(self, epoch: int, block: int) -> tuple[np.random.Generator, np.ndarray]:
        rng = self._generator(epoch, block)
        length = min(BLOCK, len(self) - block * BLOCK)
        return rng, rng.multinomial(length, self.probs)

    def block_pairs(self, epoch: int, block: int) -> np.ndarray:
        """(L,) int64: the pair of each item of a block (L = :data:`BLOCK`, less for the
        epoch's last block)."""
        rng, counts = self._block_counts(epoch, block)
        return rng.permutation(np.repeat(np.arange(len(counts), dtype=np.int64), counts))

    def epoch_counts(self, epoch: int) -> np.ndarray:
        """(P,) int64: the items each pair gives in an epoch."""
        if epoch not in self._epoch_counts:
            blocks = [self._block_counts(epoch, b)[1] for b in range(self._blocks())]
            self._epoch_counts[epoch] = np.sum(blocks, axis=0, dtype=np.int64)
        return self._epoch_counts[epoch]

    def line_positions(self, epoch: int, start: int) -> np.ndarray:
        """(P,) int64: where each pair's split is read at item ``start`` of ``epoch``."""
        given = np.zeros(len(self.sizes), dtype=np.int64)
        for earlier in range(epoch):
            given += self.epoch_counts(earlier)
        block = start // BLOCK
        for b in range(block):
            given += self._block_counts(epoch, b)[1]
        if start % BLOCK:
            given += np.bincount(self.block_pairs(epoch, block)[: start % BLOCK],
                                 minlength=len(self.sizes))  # fmt: skip
        return np.where(self.sizes > 0, given % np.maximum(self.sizes, 1), 0)

    # ------------------------------------------------------------------ reading
    def iter_chunks(
        self, size: int, start: int = 0, epoch: int = 0
    ) -> Iterator[tuple[list[str], list[str], np.ndarray]]:
        """Items ``start`` to N - 1 of ``epoch``, ``size`` at a time.

        Yields:
            ``(src_lines, tgt_lines, pairs)``: equal-length lists and (L,) int64, each item's
            pair index.

        Raises:
            ValueError: If a pair's split turns out empty; as :meth:`CorpusSplit.iter_chunks`.
        """
        positions = self.line_positions(epoch, start)
        readers = [_Cycle(c, int(p), size) for c, p in zip(self.corpora, positions, strict=True)]
        block, offset = divmod(start, BLOCK)
        pending = np.zeros(0, dtype=np.int64)
        while block < self._blocks() or pending.size:
            while pending.size < size and block < self._blocks():
                pending = np.concatenate([pending, self.block_pairs(epoch, block)[offset:]])
                block, offset = block + 1, 0
            pairs, pending = pending[:size], pending[size:]
            src: list[Any] = [None] * len(pairs)
            tgt: list[Any] = [None] * len(pairs)
            for k in np.unique(pairs).tolist():
                where = np.flatnonzero(pairs == k).tolist()
                s, t = readers[k].take(len(where))
                for i, a, b in zip(where, s, t, strict=True):
                    src[i], tgt[i] = a, b
            yield src, tgt, pairs


class _Cycle:
    """One pair's split read from a position, starting over at its end."""

    def __init__(self, corpus: CorpusSplit, start: int, chunk_size: int) -> None:
        self.corpus = corpus
        self.chunk_size = chunk_size
        self._chunks = corpus.iter_chunks(chunk_size, start=start, streaming=True)
        self._src: list[str] = []
        self._tgt: list[str] = []

    def take(self, k: int) -> tuple[list[str], list[str]]:
        """The next ``k`` sentence pairs."""
        fresh = False  # the split was started over and has given nothing since
        while len(self._src) < k:
            chunk = next(self._chunks, None)
            if chunk is None:
                if fresh:
                    raise ValueError(f"The training split {self.corpus.describe()} is empty.")
                self._chunks = self.corpus.iter_chunks(self.chunk_size, streaming=True)
                fresh = True
                continue
            fresh = False
            self._src += chunk[0]
            self._tgt += chunk[1]
        src, tgt = self._src[:k], self._tgt[:k]
        del self._src[:k], self._tgt[:k]
        return src, tgt


def read_chunks(
    corpus: CorpusSplit | MixedStream, size: int, start: int, epoch: int
) -> Iterator[tuple[list[str], list[str], np.ndarray | None]]:
    """``(src_lines, tgt_lines, pairs)`` from item ``start`` of ``epoch``, ``size`` at a time;
    ``pairs`` is None for one pair's split (the same items in every epoch)."""
    if isinstance(corpus, MixedStream):
        yield from corpus.iter_chunks(size, start, epoch)
        return
    for src, tgt in corpus.iter_chunks(size, start=start, streaming=True):
        yield src, tgt, None


def encode_by_pair(
    tokenizer: Any,
    texts: list[str],
    pairs: np.ndarray | None,
    languages: Sequence[Mapping[str, str]],
    **options: Any,
) -> list[list[int]]:
    """``tokenizer.encode(texts, **options)`` with each text's pair's language keywords
    (``languages[pair]``, see :func:`~seq2seq.data.pairs.encode_languages`); ``pairs`` None:
    every text with ``languages[0]``."""
    if pairs is None:
        return tokenizer.encode(texts, **options, **languages[0])
    ids: list[Any] = [None] * len(texts)
    for k in np.unique(pairs).tolist():
        where = np.flatnonzero(pairs == k).tolist()
        encoded = tokenizer.encode([texts[i] for i in where], **options, **languages[k])
        for i, piece_ids in zip(where, encoded, strict=True):
            ids[i] = piece_ids
    return ids
