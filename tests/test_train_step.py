"""StepWindow on its own: per-token gradients over every micro-batch and process, the logged
training loss of the step, one host synchronisation, and the non-finite guard."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from seq2seq.train_step import StepWindow


def _trainer(world_size: int = 1, reduce=None):
    strategy = SimpleNamespace(reduce=reduce or (lambda t, reduce_op: t))
    return SimpleNamespace(
        world_size=world_size, strategy=strategy, global_step=7, current_epoch=2, global_rank=0
    )


def _micro_batch(weight: torch.nn.Parameter, x: torch.Tensor, n: int):
    """A loss summed over ``n`` "tokens" and an NLL below it."""
    loss_sum = (weight * x).sum() * n
    return loss_sum, loss_sum.detach() * 0.5, torch.tensor(n)


def test_gradients_and_logged_loss_are_per_token_over_the_whole_step():
    weight = torch.nn.Parameter(torch.ones(3))
    window = StepWindow()
    inputs = [(torch.tensor([1.0, 2.0, 3.0]), 4), (torch.tensor([0.5, 0.0, -1.0]), 12)]
    sums = []
    for i, (x, n) in enumerate(inputs):
        loss_sum, nll_sum, n_tokens = _micro_batch(weight, x, n)
        sums.append((float(loss_sum.detach()), float(nll_sum)))
        out = window.add(loss_sum, nll_sum, n_tokens, i, torch.arange(2), accumulate_grad_batches=2)
        assert float(out) == pytest.approx(2 * float(loss_sum))  # Lightning halves it again
        (out / 2).backward()
    values = window.close([weight], _trainer())
    tokens = 4 + 12
    expected_grad = (4 * inputs[0][0] + 12 * inputs[1][0]) / tokens
    torch.testing.assert_close(weight.grad, expected_grad)
    assert float(values["train/loss"]) == pytest.approx(sum(s for s, _ in sums) / tokens)
    assert float(values["train/nll"]) == pytest.approx(sum(s for _, s in sums) / tokens)
    assert float(values["train/ppl"]) == pytest.approx(float(values["train/nll"].exp()))
    assert float(values["train/grad_norm"]) == pytest.approx(float(expected_grad.norm()))
    # The next step starts from nothing.
    loss_sum, nll_sum, n_tokens = _micro_batch(weight, inputs[0][0], 4)
    window.add(loss_sum, nll_sum, n_tokens, 0, torch.arange(2), accumulate_grad_batches=1)
    values = window.close([weight], _trainer())
    assert float(values["train/loss"]) == pytest.approx(float(loss_sum.detach()) / 4)


def test_several_processes_reduce_once_and_undo_ddps_mean():
    """Under DDP the window goes through one sum over processes (one tensor, one call), and the
    gradients, which DDP has averaged, are multiplied back by the world size."""
    calls = []

    def reduce(tensor, reduce_op):
        calls.append(reduce_op)
        return tensor * 2  # two processes with the same window

    weight = torch.nn.Parameter(torch.ones(2))
    window = StepWindow()
    loss_sum, nll_sum, n_tokens = _micro_batch(weight, torch.tensor([1.0, 3.0]), 5)
    window.add(loss_sum, nll_sum, n_tokens, 0, torch.arange(1), accumulate_grad_batches=1)
    loss_sum.backward()  # as DDP leaves it: the mean over processes of d(sum)
    values = window.close([weight], _trainer(world_size=2, reduce=reduce))
    assert calls == ["sum"]
    torch.testing.assert_close(weight.grad, torch.tensor([1.0, 3.0]))  # d(sum) * 2 / 10
    assert float(values["train/loss"]) == pytest.approx(float(loss_sum.detach()) / 5)


def test_parameters_without_a_gradient_are_left_out():
    used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    window = StepWindow()
    loss_sum, nll_sum, n_tokens = _micro_batch(used, torch.tensor([3.0, 4.0]), 5)
    window.add(loss_sum, nll_sum, n_tokens, 0, torch.arange(1), accumulate_grad_batches=1)
    loss_sum.backward()
    values = window.close([unused, used], _trainer())
    assert unused.grad is None
    assert float(values["train/grad_norm"]) == pytest.approx(5.0)


def test_sums_are_at_least_float32_and_as_wide_as_a_float64_loss():
    weight = torch.nn.Parameter(torch.ones((), dtype=torch.float64))
    window = StepWindow()
    loss = weight / 3
    window.add(loss, loss, torch.tensor(1), 0, torch.arange(1), accumulate_grad_batches=1)
    loss.backward()
    values = window.close([weight], _trainer())
    assert values["train/loss"].dtype == torch.float64
    assert float(values["train/loss"]) == float(torch.tensor(1 / 3, dtype=torch.float32))


def test_a_non_finite_loss_raises_naming_the_batch_and_leaves_the_gradients():
    weight = torch.nn.Parameter(torch.ones(2))
    window = StepWindow()
    for i, scale in enumerate([1.0, float("inf")]):
        loss_sum, nll_sum, n_tokens = _micro_batch(weight, torch.tensor([scale, 1.0]), 3)
        window.add(loss_sum, nll_sum, n_tokens, 4 + i, torch.arange(10, 20), 2)
    weight.grad = torch.ones(2)
    with pytest.raises(FloatingPointError) as info:
        window.close([weight], _trainer(), checkpoint_dir="runs/a")
    message = str(info.value)
    assert message.startswith(
        "non-finite training loss at step 7: batch 5 of epoch 2 (sentences at 0-based lines "
        "[10, 11, 12, 13, 14, 15, 16, 17] ... of the training split). The optimizer step was "
        "not taken"
    )
    assert "batch 4 " not in message and "runs/a" in message
    torch.testing.assert_close(weight.grad, torch.ones(2))


def test_a_non_finite_loss_of_another_process_names_this_rank():
    window = StepWindow()
    loss = torch.tensor(1.0)
    window.add(loss, loss, torch.tensor(1), 0, torch.arange(1), accumulate_grad_batches=1)

    def reduce(tensor, reduce_op):  # the other process's flag
        return tensor + torch.tensor([0.0, 1.0, 0.0, 0.0])

    trainer = _trainer(world_size=2, reduce=reduce)
    trainer.global_rank = 1
    with pytest.raises(FloatingPointError, match=r"a batch of another process \(this is rank 1\)"):
        window.close([], trainer)
