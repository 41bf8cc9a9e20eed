"""Token-budget batching of length-sorted examples, and padding into tensors.

Shapes: B batch, S source length, T target length (see ``seq2seq/nn/attention.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Sampler

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Groups examples of similar length into batches of at most ``max_tokens`` padded tokens.

    Each epoch the examples are sorted by length, cut greedily into batches whose cost
    ``n_sentences * longest`` stays within ``max_tokens``, and the order of the batches is
    shuffled, so few positions are padding while every batch still mixes ``max_tokens`` worth
    of data. With ``shuffle=True`` the sort breaks ties between equal lengths at random, or
    (with ``bucket_size``) sorts only within random buckets of ``bucket_size`` examples, so
    batch contents differ between epochs; all randomness comes from ``seed + epoch``. An
    example longer than ``max_tokens`` on its own becomes a batch of one.

    Distributed data parallel: rank ``r`` of ``num_replicas`` takes batches ``r``,
    ``r + num_replicas``, ... of the epoch's list, so shares are disjoint and together cover
    every example once. With ``even_batches=True`` (for training) every rank also gets the
    same number of batches, which collective operations need: the batch list is lengthened
    to a multiple of ``num_replicas`` by splitting its largest batches in two (still disjoint
    and within budget); only when no batch has two examples left to split are batches
    repeated. With ``even_batches=False`` (for held-out sets) ranks may get one batch more or
    fewer and each example is seen exactly once; only when there are fewer batches than ranks
    are the largest batches split (or, with fewer examples than ranks, repeated) so that every
    rank gets at least one batch: a rank without batches would skip evaluation altogether and
    leave the others waiting in its collective operations.

    Temperature sampling over pairs (``groups``, ``group_probs``; Arivazhagan et al. 2019,
    "Massively Multilingual Neural Machine Translation in the Wild"; fairseq's
    ``--sampling-method temperature``): each epoch first draws its N = ``len(lengths)``
    examples, counts ~ Multinomial(N, ``group_probs``) from the epoch's generator, group ``g``
    giving ``counts[g]`` examples from random permutations of its own (a fresh permutation
    each time they run out, so an upsampled group repeats its examples evenly); that list,
    repeats included, is sorted, cut and shuffled as above. Probabilities:
    :func:`temperature_probs`.

    Resuming: the sampler counts the batches it has yielded in the current epoch;
    :meth:`state_dict` / :meth:`load_state_dict` carry that count (and the epoch), so the next
    iteration continues with exactly the batches not yet yielded.

    Args:
        lengths: Cost of each example in padded positions, e.g. ``max(src_len, tgt_len + 1)``
            with the source's EOS counted in ``src_len``.
        max_tokens: Budget of ``n_sentences * longest`` per batch.
        shuffle: Randomise tie order and batch order per epoch (training). If False, examples
            are sorted by length (stable, so equal lengths keep index order) and batches are
            yielded shortest first.
        seed: Base seed; epoch ``e`` uses ``seed + e``.
        num_replicas: Number of data-parallel ranks.
        rank: This process's rank, in ``[0, num_replicas)``.
        bucket_size: If set (with ``shuffle``), sort within random buckets of this many
            examples instead of globally; more varied batches, a little more padding, and the
            number of batches may then differ slightly between epochs.
        even_batches: Give every rank the same number of batches (see above).
        tie_breaker: Secondary sort key for examples of equal length (remaining ties stay
            random when shuffling). ``lengths`` only bounds the longer side of each pair;
            ordering equal-cost pairs by e.g. ``tgt_len * (max_len + 1) + src_len`` also keeps
            the shorter side's padding low.
        groups: The group (language pair) of each example, ints in ``[0, len(group_probs))``;
            None: every example once per epoch (no sampling over groups).
        group_probs: Sampling probability of each group (sum 1), with ``groups``.

    Raises:
        ValueError: If ``max_tokens`` < 1, ``rank`` is outside ``[0, num_replicas)``, a
            length is negative, ``tie_breaker`` or ``groups`` and ``lengths`` differ in size,
            or ``groups`` / ``group_probs`` are invalid (see :func:`_group_members`).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        bucket_size: int | None = None,
        even_batches: bool = True,
        tie_breaker: Sequence[int] | None = None,
        groups: Sequence[int] | None = None,
        group_probs: Sequence[float] | None = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}.")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}.")
        if bucket_size is not None and bucket_size < 1:
            raise ValueError(f"bucket_size must be >= 1 or None, got {bucket_size}.")
        self.lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if self.lengths.size and self.lengths.min() < 0:
            raise ValueError("lengths must be non-negative.")
        if tie_breaker is None:
            self.tie_breaker = np.zeros_like(self.lengths)
        else:
            self.tie_breaker = np.asarray(tie_breaker, dtype=np.int64).reshape(-1)
            if self.tie_breaker.shape != self.lengths.shape:
                raise ValueError(
                    f"tie_breaker has {self.tie_breaker.size} entries for "
                    f"{self.lengths.size} lengths."
                )
        self.group_probs, self._members = _group_members(groups, group_probs, self.lengths.size)
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.bucket_size = bucket_size
        self.even_batches = even_batches
        self.epoch = 0
        self._yielded = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    # ------------------------------------------------------------------ epoch plan
    def _sorted(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` stably sorted by (length, tie_breaker)."""
        return indices[np.lexsort((self.tie_breaker[indices], self.lengths[indices]))]

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        """The epoch's (N,) examples under sampling over groups (see the class)."""
        counts = rng.multinomial(self.lengths.size, self.group_probs)
        drawn = [np.empty(0, dtype=np.int64)]
        for members, count in zip(self._members, counts.tolist(), strict=True):
            if count:  # a group of probability 0 may be empty
                # A fresh permutation per round: an example comes again only after all the
                # others of its group.
                rounds = -(-count // members.size)
                cycle = [members[rng.permutation(members.size)] for _ in range(rounds)]
                drawn.append(np.concatenate(cycle)[:count])
        return np.concatenate(drawn)

    def _order(self, rng: np.random.Generator, items: np.ndarray | None = None) -> np.ndarray:
        """``items`` (default: every example once; may repeat) in the order they are cut."""
        items = np.arange(self.lengths.size) if items is None else items
        if not self.shuffle:
            return self._sorted(items)
        n = items.size
        perm = items[rng.permutation(n)]
        if self.bucket_size is None:
            return self._sorted(perm)
        chunks = [perm[i : i + self.bucket_size] for i in range(0, n, self.bucket_size)]
        return np.concatenate([self._sorted(c) for c in chunks] or [perm])

    def _cut(self, order: np.ndarray) -> list[list[int]]:
        batches: list[list[int]] = []
        batch: list[int] = []
        longest = 0
        for index, length in zip(order.tolist(), self.lengths[order].tolist(), strict=True):
            new_longest = max(longest, length)
            if batch and (len(batch) + 1) * new_longest > self.max_tokens:
                batches.append(batch)
                batch, new_longest = [], length
            batch.append(index)
            longest = new_longest
        if batch:
            batches.append(batch)
        return batches

    def _add_batches(self, batches: list[list[int]], missing: int) -> list[list[int]]:
        """``missing`` more batches, by splitting the largest ones, else by repeating."""
        while missing:
            largest = max(range(len(batches)), key=lambda i: len(batches[i]))
            if len(batches[largest]) < 2:
                break
            batch = batches[largest]
            batches[largest : largest + 1] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
            missing -= 1
        return batches + [batches[i % len(batches)] for i in range(missing)]

    def epoch_batches(self, epoch: int | None = None) -> list[list[int]]:
        """All batches of an epoch, over every rank, in yield order (before sharding).

        Args:
            epoch: The epoch; defaults to the current one.

        Returns:
            Lists of example indices.
        """
        epoch = self.epoch if epoch is None else epoch
        rng = np.random.default_rng(self.seed + epoch)
        items = None if self.group_probs is None else self._draw(rng)
        batches = self._cut(self._order(rng, items))
        if self.num_replicas > 1 and batches:
            if self.even_batches:
                missing = -len(batches) % self.num_replicas
            else:
                missing = max(0, self.num_replicas - len(batches))
            batches = self._add_batches(batches, missing)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _rank_batches(self) -> list[list[int]]:
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self.epoch_batches()[self.rank :: self.num_replicas])
        return self._cache[1]

    # ------------------------------------------------------------------ Sampler protocol
    def __iter__(self) -> Iterator[list[int]]:
        if not self.shuffle:
            # Held-out sets: every pass is the whole, fixed plan from its first batch, also after
            # a pass cut short (``limit_val_batches``), so every validation scores the same
            # sentences.
            self._yielded = 0
        batches = self._rank_batches()
        if batches and self._yielded >= len(batches):
            # The previous pass was complete: this one is the next epoch. Trainers that stop
            # after len(self) batches never exhaust the iterator and, without a distributed
            # sampler, never call set_epoch, so the sampler advances by itself.
            self.epoch += 1
            self._yielded = 0
            batches = self._rank_batches()
        for position in range(self._yielded, len(batches)):
            self._yielded = position + 1
            yield list(batches[position])

    def __len__(self) -> int:
        """Number of batches this rank yields in a full pass of the current epoch."""
        return len(self._rank_batches())

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch (and with it the shuffling); a new epoch starts from its beginning.

        Setting the epoch the sampler is already in keeps a position restored by
        :meth:`load_state_dict`.
        """
        if epoch != self.epoch:
            self.epoch = epoch
            self._yielded = 0

    def state_dict(self) -> dict[str, int]:
        """The position in the epoch: ``{"epoch", "batches_yielded", "seed", "num_replicas"}``."""
        return {
            "epoch": self.epoch,
            "batches_yielded": self._yielded,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restores a position saved by :meth:`state_dict`.

        The next iteration yields the batches of ``state["epoch"]`` that follow the first
        ``state["batches_yielded"]``.

        Raises:
            ValueError: If the state was saved with a different seed or number of replicas,
                which would give a different batch plan.
        """
        if "num_replicas" in state and state["num_replicas"] != self.num_replicas:
            raise ValueError(replicas_mismatch_message(state["num_replicas"], self.num_replicas))
        for key in ("seed",):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"Sampler state was saved with {key}={state[key]}, but this sampler has "
                    f"{key}={getattr(self, key)}; the remaining batches cannot be reproduced."
                )
        self.epoch = int(state["epoch"])
        self._yielded = int(state["batches_yielded"])


def temperature_probs(sizes: Sequence[int], temperature: float) -> np.ndarray:
    """Sampling probability of each language pair, ``p_i`` proportional to ``n_i ** (1 / T)``.

    Temperature sampling (Arivazhagan et al. 2019, "Massively Multilingual Neural Machine
    Translation in the Wild"; fairseq's ``--sampling-method temperature``): T = 1 samples in
    proportion to the pairs' sizes, a larger T flattens towards uniform (fairseq uses 5), a
    T below 1 sharpens towards the largest pair. An empty pair gets probability 0.

    Args:
        sizes: (G,) number of training examples of each pair, >= 0, with a positive total.
        temperature: T > 0 (``data.pair_temperature``); ``inf``: uniform over non-empty pairs.

    Returns:
        (G,) float64 probabilities summing to 1.

    Raises:
        ValueError: Naming ``data.pair_temperature``, if T is not > 0, or a size is negative
            or none is positive.
    """
    n = np.asarray(sizes, dtype=np.float64).reshape(-1)
    if not temperature > 0:
        raise ValueError(f"data.pair_temperature must be > 0, got {temperature}.")
    if not (n >= 0).all() or not n.sum() > 0:
        raise ValueError(
            "data.pair_temperature: sampling over pairs needs pair sizes >= 0 with a positive "
            f"total, got {np.asarray(sizes).tolist()}."
        )
    # In log space: n ** (1 / T) overflows float64 for a small T.
    log_p = np.full(n.shape, -np.inf)
    log_p[n > 0] = np.log(n[n > 0]) / temperature
    p = np.exp(log_p - log_p.max())
    return p / p.sum()


def _group_members(
    groups: Sequence[int] | None, group_probs: Sequence[float] | None, n: int
) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """``(group_probs, members)`` for :class:`TokenBudgetBatchSampler`: the probabilities as
    float64 renormalised to sum exactly 1 (``None`` without groups), and each group's example
    indices in index order.

    Raises:
        ValueError: If only one of ``groups`` and ``group_probs`` is given, ``groups`` has
            another size than ``n`` or a value outside ``[0, len(group_probs))``, a probability
            is negative, the probabilities do not sum to 1 (within 1e-6), or a group of
            positive probability has no examples.
    """
    if groups is None and group_probs is None:
        return None, []
    if groups is None or group_probs is None:
        raise ValueError("groups and group_probs go together: give both or neither.")
    probs = np.asarray(group_probs, dtype=np.float64).reshape(-1)
    ids = np.asarray(groups).reshape(-1)
    if ids.size != n:
        raise ValueError(f"groups has {ids.size} entries for {n} lengths.")
    if not probs.size or not (probs >= 0).all() or not abs(probs.sum() - 1) <= 1e-6:
        raise ValueError(f"group_probs must be >= 0 and sum to 1, got {probs.tolist()}.")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"groups must be integers, got dtype {ids.dtype}.")
    if ids.size and not 0 <= ids.min() <= ids.max() < probs.size:
        raise ValueError(
            f"groups must be in [0, {probs.size}) (one group per entry of group_probs), got "
            f"values from {ids.min()} to {ids.max()}."
        )
    ids = ids.astype(np.int64)
    sizes = np.bincount(ids, minlength=probs.size)
    empty = np.flatnonzero((sizes == 0) & (probs > 0))
    if empty.size:
        g = int(empty[0])
        raise ValueError(f"group {g} has probability {probs[g]} in group_probs but no examples.")
    members = np.split(np.argsort(ids, kind="stable"), np.cumsum(sizes)[:-1])
    return probs / probs.sum(), members


def replicas_mismatch_message(saved: int, current: int) -> str:
    """Why a training position saved by ``saved`` data-parallel processes cannot be resumed by
    ``current`` of them."""
    return (
        f"The checkpoint was written by {saved} data-parallel process(es), but this run has "
        f"{current} (--trainer.devices x --trainer.num_nodes): each process's share of the "
        f"batches that follow depends on their number; resume with {saved} process(es)."
    )


def filter_training_pairs(
    src_len: np.ndarray, tgt_len: np.ndarray, max_positions: int, max_length_ratio: float
) -> tuple[np.ndarray, dict[str, int]]:
    """Which training pairs to keep, and how many were dropped for which reason.

    A pair is dropped when either side is empty; otherwise when a side with its EOS/BOS is
    longer than ``max_positions``; otherwise when the longer side has more than
    ``max_length_ratio`` times the tokens of the shorter one.

    Args:
        src_len: (N,) source lengths in subword tokens, without EOS.
        tgt_len: (N,) target lengths in subword tokens, without BOS/EOS.
        max_positions: Longest sequence, with EOS/BOS, the model accepts.
        max_length_ratio: Largest allowed ratio of the longer to the shorter side.

    Returns:
        ``(keep, counts)``: (N,) bool mask, and a dict with ``"pairs"``, ``"kept"``,
        ``"empty"``, ``"too_long"`` and ``"skewed"``.
    """
    s = np.asarray(src_len, dtype=np.int64)
    t = np.asarray(tgt_len, dtype=np.int64)
    empty = (s == 0) | (t == 0)
    too_long = ~empty & ((s + 1 > max_positions) | (t + 1 > max_positions))
    ratio = np.maximum(s, t) / np.maximum(np.minimum(s, t), 1)
    skewed = ~empty & ~too_long & (ratio > max_length_ratio)
    keep = ~(empty | too_long | skewed)
    counts = {
        "pairs": int(s.size),
        "kept": int(keep.sum()),
        "empty": int(empty.sum()),
        "too_long": int(too_long.sum()),
        "skewed": int(skewed.sum()),
    }
    return keep, counts


def describe_filtering(counts: dict[str, int], max_positions: int, max_length_ratio: float) -> str:
    """``"kept K of N; dropped ..."``: the counts of :func:`filter_training_pairs` in words."""
    return (
        f"kept {counts['kept']} of {counts['pairs']}; dropped {counts['empty']} with an empty "
        f"side, {counts['too_long']} longer than max_positions={max_positions}, "
        f"{counts['skewed']} with a length ratio above max_length_ratio={max_length_ratio}"
    )


def over_budget(lengths: Sequence[int] | np.ndarray, max_tokens: int) -> tuple[int, int]:
    """How many examples need more than ``max_tokens`` padded positions on their own.

    :class:`TokenBudgetBatchSampler` puts each such example in a batch of its own, which then
    holds more than ``max_tokens`` positions.

    Args:
        lengths: (N,) cost of each example in padded positions, as the sampler counts it
            (e.g. ``max(src_len, tgt_len + 1)`` with the source's EOS counted in ``src_len``).
        max_tokens: Token budget of a batch.

    Returns:
        ``(count, longest)``: the number of examples costing more than ``max_tokens``, and
        the largest cost among them (0 when there are none).
    """
    costs = np.asarray(lengths, dtype=np.int64).reshape(-1)
    over = costs[costs > max_tokens]
    return int(over.size), int(over.max()) if over.size else 0


def training_budget_advice(longest: int) -> str:
    """What to do about training pairs above ``max_tokens`` (``longest``: the largest's cost)."""
    return (
        f"Raise --data.max_tokens to at least {longest}, or lower --data.max_positions "
        "(longer training pairs are dropped) or filter such pairs out of the corpus."
    )


def describe_over_budget(
    count: int,
    longest: int,
    option: str,
    budget: int,
    what: str,
    advice: str,
    counted: str | None = None,
) -> str:
    """The warning about examples that exceed the token budget on their own, in one line.

    Args:
        count: Number of examples above the budget (see :func:`over_budget`).
        longest: Cost of the largest one, in padded positions.
        option: Name of the ``data.*`` option that sets the budget, e.g. ``"max_tokens"``.
        budget: Its value, in padded positions.
        what: Which examples, e.g. ``"sentence pairs of 'train'"``.
        advice: What to do about it, a sentence.
        counted: How an example's cost is counted; default: the longer of source + EOS and
            target + BOS.

    Returns:
        ``"--data.max_tokens=64 is below what 3 sentence pairs of 'train' need ..."``.
    """
    counted = counted or "the longer of source + EOS and target + BOS"
    return (
        f"--data.{option}={budget} is below what {count} {what} need on their own (the longest: "
        f"{longest} tokens, counted as {counted}); each of "
        f"them forms a batch of its own, over the token budget. {advice}"
    )


def split_costs(
    src_len: np.ndarray, tgt_len: np.ndarray, max_positions: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(cost, tie_breaker)`` of a cached split's examples, each (N,), for
    :class:`TokenBudgetBatchSampler`: the lengths (source + EOS, target + BOS) clipped to
    ``max_positions`` (held-out sequences are truncated to it), the longer one as the cost,
    and ties broken by target, then source length."""
    src_len = np.minimum(src_len, max_positions)
    tgt_len = np.minimum(tgt_len, max_positions)
    return np.maximum(src_len, tgt_len), tgt_len * (max_positions + 1) + src_len


def split_over_budget(
    costs: np.ndarray,
    budget: int,
    option: str,
    split: str,
    train: bool,
    predict_file: str | None = None,
) -> str | None:
    """The warning about a cached split's examples that exceed its token budget on their own
    (see :func:`describe_over_budget`), or ``None`` when there are none.

    Args:
        costs: (N,) padded positions each example needs, as the sampler counts them.
        budget: The split's token budget.
        option: The ``data.*`` option that sets it (``"max_tokens"`` or ``"eval_max_tokens"``).
        split: The split (``"predict"`` for ``predict_file``).
        train: Whether ``split`` is the training split.
        predict_file: The file of the ``"predict"`` split, for the message.
    """
    count, longest = over_budget(costs, budget)
    if not count:
        return None
    if train:
        advice = training_budget_advice(longest)
    else:
        unset = " (unset, it follows max_tokens)" if option == "max_tokens" else ""
        advice = (
            f"Raise --data.eval_max_tokens{unset} to at least {longest} (held-out "
            "sentences are never dropped)."
        )
    if split == "predict":
        what, counted = f"sentences of {str(predict_file)!r}", "source + EOS"
    else:
        what, counted = f"sentence pairs of {split!r}", None
    return describe_over_budget(count, longest, option, budget, what, advice, counted)


def collate(
    examples: list[dict[str, Any]],
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_to_multiple_of: int = 1,
) -> dict[str, Any]:
    """Pads a list of examples into a batch of tensors.

    Args:
        examples: Dicts with ``"index"`` (int), ``"src"`` (list[int], ending with EOS),
            optionally ``"tgt"`` (list[int], without BOS/EOS; in every example or in none),
            ``"src_text"`` and ``"ref_text"`` (str), ``"pair"`` (int, a multilingual run's
            pair index).
        pad_id: Padding id; ``bos_id`` / ``eos_id``: begin ``tgt_in`` / end ``tgt_out``.
        pad_to_multiple_of: Round S and T up to a multiple of this (1: none), for fewer shapes.

    Returns:
        ``"index"``: (B,) long; ``"src"``: (B, S) long, padded with ``pad_id``;
        ``"src_mask"``: (B, 1, 1, S) bool, True at real source positions; ``"src_index"``:
        (M,) long, their positions in ``(B * S)`` (see ``Transformer.encode``); with targets,
        ``"tgt_in"`` / ``"tgt_out"``: (B, T) long, ``[BOS] + tgt`` / ``tgt + [EOS]`` padded,
        and ``"tgt_index"``: (N,) long, the real ``tgt_out`` positions in ``(B * T)`` (made on
        the host, so a step on an accelerator never synchronises); ``"n_tokens"``: int, N (0
        without targets); ``"src_text"`` / ``"ref_text"``: list[str], and ``"pair"``: (B,)
        long, when in the examples.

    Raises:
        ValueError: If ``examples`` is empty, only some examples have ``"tgt"``, or
            ``pad_to_multiple_of`` < 1.
    """
    if not examples:
        raise ValueError("Cannot collate an empty list of examples.")
    if pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}.")
    src = [torch.as_tensor(e["src"], dtype=torch.long) for e in examples]
    src_lengths = torch.tensor([len(s) for s in src])
    batch: dict[str, Any] = {
        "index": torch.tensor([e["index"] for e in examples], dtype=torch.long),
        "src": _pad(src, pad_id, pad_to_multiple_of),
    }
    positions = torch.arange(batch["src"].size(1))
    batch["src_mask"] = (positions[None, :] < src_lengths[:, None])[:, None, None, :]
    batch["src_index"] = batch["src_mask"].flatten().nonzero().squeeze(1)
    with_tgt = ["tgt" in e for e in examples]
    if any(with_tgt) and not all(with_tgt):
        raise ValueError("Either every example or none must have a 'tgt' field.")
    batch["n_tokens"] = 0
    if all(with_tgt):
        tgt = [torch.as_tensor(e["tgt"], dtype=torch.long) for e in examples]
        bos, eos = torch.tensor([bos_id]), torch.tensor([eos_id])
        tgt_in = [torch.cat([bos, t]) for t in tgt]
        tgt_out = [torch.cat([t, eos]) for t in tgt]
        batch["tgt_in"] = _pad(tgt_in, pad_id, pad_to_multiple_of)
        batch["tgt_out"] = _pad(tgt_out, pad_id, pad_to_multiple_of)
        batch["n_tokens"] = sum(len(t) for t in tgt_out)
        width = batch["tgt_out"].size(1)
        batch["tgt_index"] = torch.cat(
            [torch.arange(len(t)) + i * width for i, t in enumerate(tgt_out)]
        )
    for key in ("src_text", "ref_text"):
        if key in examples[0]:
            batch[key] = [e[key] for e in examples]
    if "pair" in examples[0]:
        batch["pair"] = torch.tensor([e["pair"] for e in examples], dtype=torch.long)
    return batch


def _pad(sequences: list[torch.Tensor], pad_id: int, multiple: int) -> torch.Tensor:
    """``(B, L)`` right-padded with ``pad_id``, L rounded up to a multiple of ``multiple``."""
    padded = pad_sequence(sequences, batch_first=True, padding_value=pad_id)
    extra = -padded.size(1) % multiple
    return torch.nn.functional.pad(padded, (0, extra), value=pad_id) if extra else padded
