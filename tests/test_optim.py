import math

import pytest
import torch

from seq2seq.optim import InverseSqrtLR


def _lrs(warmup, steps, peak=1e-3):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=peak)
    schedule = InverseSqrtLR(optimizer, warmup_steps=warmup)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def test_linear_warmup_then_inverse_sqrt_decay():
    lrs = _lrs(warmup=10, steps=40)
    assert lrs[0] == pytest.approx(1e-4)  # step 1 of 10
    assert lrs[9] == pytest.approx(1e-3)  # peak at step 10
    for step in (20, 40):
        assert lrs[step - 1] == pytest.approx(1e-3 * math.sqrt(10 / step))
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10], strict=True))
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:], strict=False))


def test_negative_warmup_is_refused():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        InverseSqrtLR(optimizer, warmup_steps=-1)
