"""Tests of seq2seq.data.batching: the token-budget sampler and collate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import MULTI30K  # SEQ2SEQ_MULTI30K, else ../shared/data/multi30k

from seq2seq.data.batching import TokenBudgetBatchSampler, collate, over_budget
from seq2seq.data.corpus import read_parallel
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer


def _lengths(n: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 60, size=n)


def _flatten(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


# ---------------------------------------------------------------------- collate
def test_collate_pads_and_masks():
    examples = [
        {"index": 7, "src": [5, 6, EOS_ID], "tgt": [8, 9, 10], "src_text": "a", "ref_text": "x"},
        {"index": 2, "src": [EOS_ID], "tgt": [11], "src_text": "", "ref_text": "y"},
    ]
    batch = collate(examples)
    assert batch["index"].tolist() == [7, 2]
    assert batch["src"].tolist() == [[5, 6, EOS_ID], [EOS_ID, PAD_ID, PAD_ID]]
    assert batch["src_mask"].dtype == torch.bool and batch["src_mask"].shape == (2, 1, 1, 3)
    assert batch["src_mask"][:, 0, 0].tolist() == [[True] * 3, [True, False, False]]
    assert batch["tgt_in"].tolist() == [[BOS_ID, 8, 9, 10], [BOS_ID, 11, PAD_ID, PAD_ID]]
    assert batch["tgt_out"].tolist() == [[8, 9, 10, EOS_ID], [11, EOS_ID, PAD_ID, PAD_ID]]
    assert batch["n_tokens"] == 6 == int((batch["tgt_out"] != PAD_ID).sum())
    assert batch["src"].dtype == batch["tgt_in"].dtype == torch.long
    assert batch["src_text"] == ["a", ""] and batch["ref_text"] == ["x", "y"]


def test_collate_without_targets():
    batch = collate([{"index": 0, "src": [4, EOS_ID]}, {"index": 1, "src": [EOS_ID]}])
    assert "tgt_in" not in batch and "tgt_out" not in batch and "src_text" not in batch
    assert batch["n_tokens"] == 0
    with pytest.raises(ValueError, match="tgt"):
        collate([{"index": 0, "src": [3], "tgt": [4]}, {"index": 1, "src": [3]}])


# ---------------------------------------------------------------------- budget
def test_over_budget_counts_the_examples_that_get_a_batch_of_their_own():
    """``over_budget`` counts the examples the sampler cannot fit into ``max_tokens`` even
    alone (each then forms a batch of one, over the budget), and the largest such cost."""
    lengths = [3, 10, 7, 12, 8]
    assert over_budget(lengths, 8) == (2, 12)
    assert over_budget(lengths, 12) == (0, 0)
    assert over_budget([], 5) == (0, 0)
    batches = list(TokenBudgetBatchSampler(lengths, max_tokens=8, shuffle=False))
    alone = [b for b in batches if max(lengths[i] for i in b) * len(b) > 8]
    assert sorted(lengths[b[0]] for b in alone) == [10, 12] and all(len(b) == 1 for b in alone)


def test_batches_respect_budget_and_cover_everything():
    lengths = _lengths()
    lengths[10] = 5000  # longer than the budget on its own
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=500, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(_flatten(batches)) == list(range(len(lengths)))
    assert [10] in batches
    for batch in batches:
        if batch != [10]:
            assert len(batch) * lengths[batch].max() <= 500


def test_set_epoch_changes_order_deterministically():
    lengths = _lengths()
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=400, seed=5)
    epoch0 = list(sampler)
    following = list(sampler)  # after a complete pass, iterating again starts the next epoch
    sampler.set_epoch(0)
    assert list(sampler) == epoch0  # same epoch, same batches
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert following == epoch1
    assert epoch1 != epoch0 and sorted(_flatten(epoch1)) == sorted(_flatten(epoch0))
    other = TokenBudgetBatchSampler(lengths, max_tokens=400, seed=5)
    other.set_epoch(1)
    assert list(other) == epoch1
    # Batch contents (not only their order) change between epochs.
    assert {tuple(sorted(b)) for b in epoch0} != {tuple(sorted(b)) for b in epoch1}


def test_next_epoch_after_a_pass_the_trainer_did_not_exhaust():
    """Trainers stop after len(sampler) batches without exhausting the iterator or calling
    set_epoch; the next iteration must still be a full, reshuffled epoch."""
    sampler = TokenBudgetBatchSampler(_lengths(), max_tokens=400, seed=5)
    first = iter(sampler)
    epoch0 = [next(first) for _ in range(len(sampler))]
    epoch1 = list(sampler)
    assert len(epoch1) == len(epoch0) and epoch1 != epoch0
    assert sorted(_flatten(epoch1)) == sorted(_flatten(epoch0))


def test_unshuffled_is_sorted_and_stable():
    lengths = _lengths()
    batches = list(TokenBudgetBatchSampler(lengths, max_tokens=400, shuffle=False))
    flat = _flatten(batches)
    assert flat == sorted(range(len(lengths)), key=lambda i: lengths[i])


def test_buckets():
    lengths = _lengths(2000)
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=400, bucket_size=500)
    assert sorted(_flatten(list(sampler))) == list(range(2000))


# ---------------------------------------------------------------------- DDP
@pytest.mark.parametrize("world_size", [2, 3])
def test_train_shards_disjoint_complete_equal(world_size):
    lengths = _lengths(997)
    for epoch in range(3):
        shards = []
        for rank in range(world_size):
            sampler = TokenBudgetBatchSampler(
                lengths, max_tokens=450, seed=1, num_replicas=world_size, rank=rank
            )
            sampler.set_epoch(epoch)
            shards.append(list(sampler))
        assert len({len(s) for s in shards}) == 1
        flat = [i for shard in shards for i in _flatten(shard)]
        assert sorted(flat) == list(range(len(lengths)))  # disjoint and complete


def test_train_shards_repeat_only_when_nothing_can_be_split():
    lengths = [100, 100, 100]  # one example per batch: three batches for two ranks
    shards = [
        list(TokenBudgetBatchSampler(lengths, max_tokens=100, num_replicas=2, rank=r))
        for r in range(2)
    ]
    assert [len(s) for s in shards] == [2, 2]
    assert sorted(set(_flatten(shards[0] + shards[1]))) == [0, 1, 2]


def test_heldout_shards_exactly_once():
    lengths = _lengths(1013)
    shards = [
        list(
            TokenBudgetBatchSampler(
                lengths, 450, shuffle=False, num_replicas=2, rank=r, even_batches=False
            )
        )
        for r in range(2)
    ]
    flat = _flatten(shards[0]) + _flatten(shards[1])
    assert sorted(flat) == list(range(len(lengths))) and len(flat) == len(set(flat))
    assert abs(len(shards[0]) - len(shards[1])) <= 1


# ---------------------------------------------------------------------- resume
def test_resume_mid_epoch_continues_with_unseen_batches():
    lengths = _lengths()
    reference = TokenBudgetBatchSampler(lengths, max_tokens=400, seed=2)
    reference.set_epoch(4)
    full = list(reference)

    sampler = TokenBudgetBatchSampler(lengths, max_tokens=400, seed=2)
    sampler.set_epoch(4)
    iterator = iter(sampler)
    seen = [next(iterator) for _ in range(7)]
    state = sampler.state_dict()
    assert state["epoch"] == 4 and state["batches_yielded"] == 7

    resumed = TokenBudgetBatchSampler(lengths, max_tokens=400, seed=2)
    resumed.load_state_dict(state)
    resumed.set_epoch(4)  # as the trainer does at the epoch start: keeps the position
    assert len(resumed) == len(full)
    rest = list(resumed)
    assert seen + rest == full
    reference.set_epoch(5)
    assert list(resumed) == list(reference)  # the following pass is the whole next epoch
    resumed.set_epoch(6)
    assert resumed.state_dict()["batches_yielded"] == 0

    with pytest.raises(ValueError, match="seed"):
        TokenBudgetBatchSampler(lengths, max_tokens=400, seed=9).load_state_dict(state)
    two = TokenBudgetBatchSampler(lengths, max_tokens=400, seed=2, num_replicas=2, rank=0)
    with pytest.raises(
        ValueError,
        match=r"written by 1 data-parallel process\(es\), but this "
        r"run has 2 \(--trainer.devices x --trainer.num_nodes\)",
    ):
        two.load_state_dict(state)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBudgetBatchSampler([1], max_tokens=0)
    with pytest.raises(ValueError, match="rank"):
        TokenBudgetBatchSampler([1], max_tokens=10, num_replicas=2, rank=2)


# ---------------------------------------------------------------------- padding on Multi30k
def test_padding_fraction_on_multi30k_train(tmp_path):
    """Padding with max_tokens=4096 on all 29,000 Multi30k training pairs, vs random batches."""
    src, tgt = read_parallel(MULTI30K / "train.de.gz", MULTI30K / "train.en.gz")
    tok = Tokenizer.train(src[:2000] + tgt[:2000], tmp_path / "m.model", 1000)
    s = np.array([len(x) + 1 for x in tok.encode(src)])  # ids + EOS
    t = np.array([len(x) + 1 for x in tok.encode(tgt)])  # BOS/EOS + ids
    lengths = np.maximum(s, t)

    def padding(batches):
        cost = sum(len(b) * lengths[b].max() for b in batches)
        tensors = sum(len(b) * (s[b].max() + t[b].max()) for b in batches)
        return 1 - lengths.sum() / cost, 1 - (s.sum() + t.sum()) / tensors

    sampler = TokenBudgetBatchSampler(lengths, 4096, seed=1, tie_breaker=t * 1000 + s)
    sorted_cost, sorted_tensors = padding(list(sampler))
    random = TokenBudgetBatchSampler(lengths, 4096, shuffle=False)
    random_cost, random_tensors = padding(random._cut(np.random.default_rng(0).permutation(s.size)))
    print(
        f"\nMulti30k train, max_tokens=4096: padded fraction {sorted_cost:.2%} of batch cost "
        f"(src+tgt tensors: {sorted_tensors:.2%}); random batching: {random_cost:.2%} "
        f"({random_tensors:.2%})"
    )
    assert sorted_cost <= 0.05
    assert sorted_tensors <= 0.07 and sorted_tensors < random_tensors / 5


def test_held_out_passes_cut_short_restart_from_the_first_batch():
    """``limit_val_batches``: each validation takes the same first batches, not the next ones."""
    lengths = np.random.default_rng(0).integers(1, 40, size=300)
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=400, shuffle=False)
    full = list(sampler)
    for _ in range(3):
        it = iter(sampler)
        assert [next(it), next(it)] == full[:2]
    assert list(sampler) == full
