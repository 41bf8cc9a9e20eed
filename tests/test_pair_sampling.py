"""Tests of temperature sampling over language pairs (seq2seq.data.batching) and of the resume
rules for ``data.pairs`` / ``data.pair_temperature`` (seq2seq.data.resume)."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import other_batching_warning

from seq2seq.data.batching import TokenBudgetBatchSampler, temperature_probs
from seq2seq.data.resume import batching_differences, batching_settings, resume_refusal

SIZES = (1000, 300, 50)
MAX_TOKENS = 200


def _corpus(sizes=SIZES, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths, groups)`` of a corpus of ``sum(sizes)`` examples, groups interleaved."""
    rng = np.random.default_rng(seed)
    groups = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    return rng.integers(1, 30, size=groups.size), groups


def _sampler(lengths, groups, temperature: float | None, **kwargs) -> TokenBudgetBatchSampler:
    probs = None
    if temperature is not None:
        probs = temperature_probs(np.bincount(groups), temperature)
    kwargs.setdefault("max_tokens", MAX_TOKENS)
    return TokenBudgetBatchSampler(
        lengths, groups=None if probs is None else groups, group_probs=probs, **kwargs
    )


def _flatten(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def _chi2_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's goodness-of-fit p-value: the chi-square survival function with G - 1 degrees
    of freedom, Q(k / 2, x / 2) (regularised upper incomplete gamma)."""
    expected = observed.sum() * probs
    x = float(((observed - expected) ** 2 / expected).sum())
    k = observed.size - 1
    half = torch.tensor([k / 2, x / 2], dtype=torch.float64)
    return float(torch.special.gammaincc(half[0], half[1]))


def _expected(temperature: float) -> np.ndarray:
    p = np.asarray(SIZES, dtype=np.float64) ** (1 / temperature)
    return p / p.sum()


# ---------------------------------------------------------------------- temperature_probs
def test_temperature_probs():
    """p_i = n_i^(1/T) / sum_j n_j^(1/T); an empty pair gets 0; T = inf is uniform over the
    non-empty pairs; a tiny T neither overflows nor gives NaN (it favours the largest)."""
    assert np.allclose(temperature_probs(SIZES, 1.0), np.array(SIZES) / sum(SIZES))
    assert np.allclose(temperature_probs(SIZES, 5.0), _expected(5.0))
    assert temperature_probs(SIZES, 5.0).dtype == np.float64
    assert temperature_probs([10, 0, 30], 2.0).tolist()[1] == 0.0
    assert np.allclose(temperature_probs([10, 0, 30], math.inf), [0.5, 0.0, 0.5])
    sharp = temperature_probs([10**6, 10**6 - 1, 5], 0.001)
    assert np.isfinite(sharp).all() and sharp[0] > sharp[1] > sharp[2] == 0.0
    assert math.isclose(sharp.sum(), 1.0)


@pytest.mark.parametrize(
    ("sizes", "temperature", "message"),
    [
        (SIZES, 0.0, r"^data\.pair_temperature must be > 0, got 0\.0\.$"),
        (SIZES, -1.0, r"^data\.pair_temperature must be > 0, got -1\.0\.$"),
        (SIZES, math.nan, r"^data\.pair_temperature must be > 0, got nan\.$"),
        ([0, 0], 1.0, r"^data\.pair_temperature: .* positive total, got \[0, 0\]\.$"),
        ([5, -1], 1.0, r"^data\.pair_temperature: .*sizes >= 0.*, got \[5, -1\]\.$"),
        ([], 1.0, r"^data\.pair_temperature: .* positive total, got \[\]\.$"),
    ],
)
def test_temperature_probs_refuses_bad_input(sizes, temperature, message):
    with pytest.raises(ValueError, match=message):
        temperature_probs(sizes, temperature)


# ---------------------------------------------------------------------- the draw
@pytest.mark.parametrize("temperature", [1.0, 5.0])
def test_pair_counts_follow_the_temperature_distribution(temperature):
    """Over 200 epochs the examples yielded per pair fit n_i^(1/T) (chi-square, p > 0.001),
    while the other temperature's distribution is rejected (p < 1e-6), so the test has the
    power to fail. Every epoch yields N examples."""
    lengths, groups = _corpus()
    sampler = _sampler(lengths, groups, temperature)
    observed = np.zeros(len(SIZES))
    for epoch in range(200):
        sampler.set_epoch(epoch)
        drawn = _flatten(list(sampler))
        assert len(drawn) == lengths.size
        observed += np.bincount(groups[drawn], minlength=len(SIZES))
    assert _chi2_pvalue(observed, _expected(temperature)) > 0.001
    other = 5.0 if temperature == 1.0 else 1.0
    assert _chi2_pvalue(observed, _expected(other)) < 1e-6


def test_chi2_pvalue_is_the_chi_square_tail():
    """With 2 degrees of freedom the tail is exp(-x / 2); a perfect fit gives 1."""
    observed, probs = np.array([60.0, 20.0, 20.0]), np.array([0.5, 0.25, 0.25])
    x = (60 - 50) ** 2 / 50 + 2 * (20 - 25) ** 2 / 25  # 4.0
    assert math.isclose(_chi2_pvalue(observed, probs), math.exp(-x / 2), rel_tol=1e-12)
    assert _chi2_pvalue(np.array([50.0, 25.0, 25.0]), probs) == 1.0


def test_upsampled_pairs_repeat_evenly_and_downsampled_ones_never():
    """Within an epoch a pair drawn c times from its n examples shows each of them
    floor(c / n) or ceil(c / n) times (fresh permutations, not draws with replacement); a
    probability-0 pair (here empty or not) is never drawn."""
    lengths, groups = _corpus((1000, 300, 50, 20))
    probs = temperature_probs(SIZES, 5.0).tolist() + [0.0]
    sampler = TokenBudgetBatchSampler(lengths, MAX_TOKENS, groups=groups, group_probs=probs)
    for epoch in range(5):
        times = Counter(_flatten(sampler.epoch_batches(epoch)))
        for g, n in enumerate((1000, 300, 50, 20)):
            members = np.flatnonzero(groups == g)
            c = sum(times[int(i)] for i in members)
            counts = {times[int(i)] for i in members}
            assert counts <= {c // n, -(-c // n)}, (g, c, counts)
        assert sum(times[int(i)] for i in np.flatnonzero(groups == 3)) == 0
    assert max(times[int(i)] for i in np.flatnonzero(groups == 2)) > 1  # 50 examples, ~317 draws
    empty = TokenBudgetBatchSampler([3, 4], 10, groups=[0, 0], group_probs=[1.0, 0.0])
    assert sorted(_flatten(list(empty))) == [0, 1]


def test_sampling_is_a_function_of_seed_and_epoch():
    lengths, groups = _corpus()
    a = _sampler(lengths, groups, 5.0, seed=3)
    b = _sampler(lengths, groups, 5.0, seed=3)
    assert a.epoch_batches(2) == b.epoch_batches(2)
    assert a.epoch_batches(2) != a.epoch_batches(3)
    assert a.epoch_batches(2) != _sampler(lengths, groups, 5.0, seed=4).epoch_batches(2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"groups": [0, 1, 0]}, r"^groups and group_probs go together"),
        ({"group_probs": [1.0]}, r"^groups and group_probs go together"),
        ({"groups": [0, 1], "group_probs": [0.5, 0.5]}, r"^groups has 2 entries for 3 lengths"),
        ({"groups": [0, 2, 1], "group_probs": [0.5, 0.5]}, r"^groups must be in \[0, 2\)"),
        ({"groups": [0, -1, 1], "group_probs": [0.5, 0.5]}, r"^groups must be in \[0, 2\)"),
        ({"groups": [0.0, 1.0, 0.0], "group_probs": [0.5, 0.5]}, r"^groups must be integers"),
        ({"groups": [0, 1, 0], "group_probs": [0.5, 0.6]}, r"^group_probs must be >= 0 and sum"),
        ({"groups": [0, 1, 0], "group_probs": [1.5, -0.5]}, r"^group_probs must be >= 0 and sum"),
        ({"groups": [0, 0, 0], "group_probs": [0.9, 0.1]}, r"^group 1 has probability 0\.1 in"),
    ],
)
def test_invalid_groups_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TokenBudgetBatchSampler([3, 4, 5], max_tokens=10, **kwargs)


# ---------------------------------------------------------------------- DDP
@pytest.mark.parametrize("bucket_size", [None, 256])
def test_ranks_share_one_plan_by_position(bucket_size):
    """Two ranks build the same plan; rank r yields its batches r, r + 2, ...: equal lengths,
    disjoint positions that together are the whole plan, which holds the same draw (as a
    multiset of examples) as the single-process plan of that epoch."""
    lengths, groups = _corpus()
    ranks = [
        _sampler(lengths, groups, 5.0, num_replicas=2, rank=r, bucket_size=bucket_size)
        for r in range(2)
    ]
    single = _sampler(lengths, groups, 5.0, bucket_size=bucket_size)
    for epoch in range(3):
        plan = ranks[0].epoch_batches(epoch)
        assert ranks[1].epoch_batches(epoch) == plan
        shares = []
        for sampler in ranks:
            sampler.set_epoch(epoch)
            shares.append(list(sampler))
            assert len(sampler) == len(shares[-1])
        assert len(shares[0]) == len(shares[1]) == len(plan) // 2
        rebuilt = [shares[i % 2][i // 2] for i in range(len(plan))]
        assert rebuilt == plan
        assert Counter(_flatten(plan)) == Counter(_flatten(single.epoch_batches(epoch)))
        assert all(len(b) * max(lengths[b]) <= MAX_TOKENS for b in plan)


# ---------------------------------------------------------------------- resume
@pytest.mark.parametrize("num_replicas", [1, 2])
def test_resume_mid_epoch_yields_exactly_the_remaining_batches(num_replicas):
    lengths, groups = _corpus()
    kwargs = {"seed": 2, "num_replicas": num_replicas, "rank": num_replicas - 1}
    reference = _sampler(lengths, groups, 5.0, **kwargs)
    reference.set_epoch(4)
    full = list(reference)

    sampler = _sampler(lengths, groups, 5.0, **kwargs)
    sampler.set_epoch(4)
    iterator = iter(sampler)
    seen = [next(iterator) for _ in range(5)]
    state = sampler.state_dict()

    resumed = _sampler(lengths, groups, 5.0, **kwargs)
    resumed.load_state_dict(state)
    resumed.set_epoch(4)  # as the trainer does at the epoch start: keeps the position
    assert len(resumed) == len(full)
    assert seen + list(resumed) == full
    reference.set_epoch(5)
    assert list(resumed) == list(reference)  # then the whole next epoch


# ---------------------------------------------------------------------- without groups
def _reference_plan(lengths, tie, max_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """The plan of a shuffled single-process sampler without groups, written out plainly:
    random permutation, stable sort by (length, tie), greedy cut, shuffled batch order."""
    rng = np.random.default_rng(seed + epoch)
    perm = rng.permutation(len(lengths))
    order = perm[np.lexsort((tie[perm], lengths[perm]))]
    batches, batch, longest = [], [], 0
    for i in order.tolist():
        if batch and (len(batch) + 1) * max(longest, lengths[i]) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, lengths[i])
    batches.append(batch)
    return [batches[i] for i in rng.permutation(len(batches))]


def test_without_groups_every_example_once_as_before():
    """groups=None: the plan of a sampler built without the new arguments, the plainly written
    reference plan, and every example exactly once per epoch."""
    lengths, _ = _corpus()
    tie = np.random.default_rng(1).integers(0, 5, size=lengths.size)
    kwargs = {"max_tokens": MAX_TOKENS, "seed": 5, "tie_breaker": tie}
    plain = TokenBudgetBatchSampler(lengths, **kwargs)
    explicit = TokenBudgetBatchSampler(lengths, groups=None, group_probs=None, **kwargs)
    for epoch in range(3):
        plan = explicit.epoch_batches(epoch)
        assert plan == plain.epoch_batches(epoch)
        assert plan == _reference_plan(lengths, tie, MAX_TOKENS, 5, epoch)
        assert sorted(_flatten(plan)) == list(range(lengths.size))


# ---------------------------------------------------------------------- resume rules
PAIRS = ["de-en", "fr-en"]
POSITION = {"epoch": 0, "batches_yielded": 3, "seed": 1, "num_replicas": 1}
BILINGUAL = {
    "streaming": False,
    "max_tokens": 1024,
    "bucket_size": None,
    "max_positions": 128,
    "max_length_ratio": 3.0,
    "seed": 1,
}


def _state(**batching) -> dict:
    return {"batching": {**BILINGUAL, **batching}, "train_sampler": dict(POSITION)}


def test_batching_settings_hold_pairs_and_temperature():
    """Saved with the other batching settings; a data module without them is bilingual."""
    values = {**BILINGUAL, "pairs": PAIRS, "pair_temperature": 5.0, "vocab_size": 8000}
    assert batching_settings(values) == {**BILINGUAL, "pairs": PAIRS, "pair_temperature": 5.0}
    assert batching_settings(BILINGUAL) == {**BILINGUAL, "pairs": None, "pair_temperature": 1.0}


def test_other_pairs_are_refused_in_one_line():
    """Other pairs than the checkpoint's (when either is set) are refused, also without a
    saved position, naming --data.pairs and both values; the same pairs (a tuple from a
    checkpoint, a list from the command line) resume."""
    multilingual = _state(pairs=tuple(PAIRS), pair_temperature=5.0)
    run = {**BILINGUAL, "pairs": PAIRS, "pair_temperature": 5.0}
    assert resume_refusal(multilingual, run) is None
    assert batching_differences(multilingual, run, streaming=False) == []
    refusal = resume_refusal(multilingual, {**run, "pairs": ["de-en"]})
    assert refusal == (
        "The checkpoint was written with --data.pairs=[de-en, fr-en], but this run has "
        "--data.pairs=[de-en]: other pairs are other training examples, another vocabulary "
        "and other language tags; resume with --data.pairs=[de-en, fr-en]."
    )
    assert "\n" not in refusal
    no_position = {"batching": multilingual["batching"]}
    bilingual_run = {**run, "pairs": None}
    assert "--data.pairs=null: other pairs" in resume_refusal(no_position, bilingual_run)
    assert resume_refusal(multilingual, {**run, "pairs": PAIRS[::-1]}) == (
        "The checkpoint was written with --data.pairs=[de-en, fr-en], but this run has "
        "--data.pairs=[fr-en, de-en]: the same pairs in another order, which numbers the "
        "training examples otherwise, so the batches that follow would differ; resume with "
        "--data.pairs=[de-en, fr-en]."
    )  # another order: other group indices, other batches


def test_other_pair_temperature_is_warned_about():
    """Like max_tokens: one warning naming the option and both values, only where there is
    sampling over several pairs."""
    state = _state(pairs=PAIRS, pair_temperature=1.0)
    run = {**BILINGUAL, "pairs": PAIRS, "pair_temperature": 5.0}
    assert resume_refusal(state, run) is None
    (warning,) = batching_differences(state, run, streaming=False)
    assert re.match(other_batching_warning("pair_temperature", 5.0, 1.0), warning)
    one_pair = _state(pairs=["de-en"], pair_temperature=1.0)
    assert batching_differences(one_pair, {**run, "pairs": ["de-en"]}, streaming=False) == []


def test_checkpoints_before_pairs_count_as_bilingual():
    """A state saved without the keys: pairs=None, pair_temperature=1.0; a bilingual run
    resumes silently, a multilingual one is refused."""
    old = _state()
    run = batching_settings(BILINGUAL)
    assert resume_refusal(old, run) is None
    assert batching_differences(old, run, streaming=False) == []
    assert batching_differences(old, {**run, "pair_temperature": 5.0}, streaming=False) == []
    refusal = resume_refusal(old, {**run, "pairs": PAIRS})
    assert refusal.startswith(
        "The checkpoint was written with --data.pairs=null, but this run has "
        "--data.pairs=[de-en, fr-en]:"
    )
    older = {"train_sampler": dict(POSITION)}  # written before "batching" was saved
    assert resume_refusal(older, run) is None
    assert batching_differences(older, run, streaming=False) == []
