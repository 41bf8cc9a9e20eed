import logging
import math

import pytest
import torch

from seq2seq.optim import CosineLR, InverseSqrtLR


def _lrs(warmup, steps, peak=1e-3, schedule=InverseSqrtLR, **settings):
    """The learning rate of each of ``steps`` optimizer steps, from 1."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=peak)
    schedule = schedule(optimizer, warmup_steps=warmup, **settings)
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


def _cosine(step: int, warmup: int, max_steps: int, floor: float = 0.0) -> float:
    """CosineLR's factor at optimizer step ``step`` (from 1), written out."""
    if step <= warmup:
        return step / warmup
    progress = min(1.0, (step - warmup) / (max_steps - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize(("warmup", "floor"), [(10, 0.0), (10, 0.1), (0, 0.0)])
def test_cosine_warmup_then_half_a_cosine_to_the_floor_at_max_steps(warmup, floor):
    lrs = _lrs(warmup, 60, schedule=CosineLR, max_steps=50, min_lr_ratio=floor)
    for step, lr in enumerate(lrs, start=1):
        assert lr == pytest.approx(1e-3 * _cosine(step, warmup, 50, floor), rel=1e-12), step
    if warmup:
        assert lrs[0] == pytest.approx(1e-4) and lrs[warmup - 1] == pytest.approx(1e-3)
    assert lrs[29] == pytest.approx(1e-3 * (floor + (1 - floor) * 0.5 * (1 + math.cos(
        math.pi * (30 - warmup) / (50 - warmup)))))  # fmt: skip
    assert lrs[49:] == [pytest.approx(1e-3 * floor, abs=1e-18)] * 11  # the floor, and it stays


@pytest.mark.parametrize("warmup", [10, 0])
def test_cosine_is_hugging_faces_one_step_ahead(warmup):
    """transformers' ``get_cosine_schedule_with_warmup`` counts steps from 0: its rate of step
    ``s + 1`` is ours of step ``s``, to ``max_steps``."""
    transformers = pytest.importorskip("transformers")
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    theirs = transformers.get_cosine_schedule_with_warmup(optimizer, warmup, 50)
    hf = []
    for _ in range(51):
        hf.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        theirs.step()
    ours = _lrs(warmup, 50, schedule=CosineLR, max_steps=50)
    assert ours == pytest.approx(hf[1:], rel=1e-12, abs=1e-18)


def test_cosine_resumes_exactly_from_its_state_dict():
    """A schedule built afresh (as a resumed run's, of other settings even) and given the
    state dict of one stopped at step 17 goes on as the uninterrupted one: the settings are
    state, restored with the step count (a resume warns of configured ones that differ)."""
    uninterrupted = _lrs(10, 60, schedule=CosineLR, max_steps=50, min_lr_ratio=0.1)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    schedule = CosineLR(optimizer, warmup_steps=10, max_steps=50, min_lr_ratio=0.1)
    for _ in range(17):
        optimizer.step()
        schedule.step()
    state = {"optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()}
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=5e-4)
    resumed = CosineLR(optimizer, warmup_steps=3, max_steps=20)
    optimizer.load_state_dict(state["optimizer"])
    resumed.load_state_dict(state["schedule"])
    lrs = []
    for _ in range(60 - 17):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        resumed.step()
    assert lrs == uninterrupted[17:]
    assert (resumed.warmup_steps, resumed.max_steps, resumed.min_lr_ratio) == (10, 50, 0.1)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"warmup_steps": -1, "max_steps": 10},
         r"^lr_scheduler warmup_steps must be >= 0, got -1$"),
        ({"warmup_steps": 10, "max_steps": 10},
         r"^lr_scheduler max_steps must be > warmup_steps \(10\), got 10$"),
        ({"max_steps": 10, "warmup_steps": 0, "min_lr_ratio": 1.5},
         r"^lr_scheduler min_lr_ratio must be in \[0, 1\], got 1.5$"),
    ],
)  # fmt: skip
def test_cosine_settings_out_of_range_are_refused(settings, message):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=message):
        CosineLR(optimizer, **settings)


def test_a_cosine_of_another_length_than_the_run_is_warned_about(recwarn):
    """CosineLR's max_steps against the run's length: equal, or not known (-1), is silent."""
    from seq2seq.optim import warn_other_length

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = CosineLR(optimizer, max_steps=100, warmup_steps=10)
    for run in (100, -1, None):
        warn_other_length(schedule, run, "trainer.max_steps")
    warn_other_length(InverseSqrtLR(optimizer, warmup_steps=10), 50, "trainer.max_steps")
    warn_other_length(CosineLR(optimizer, warmup_steps=10), 50, "trainer.max_steps")
    assert not recwarn.list
    for run, after in ((150, "stays at its floor for the last 50 steps"),
                       (60, "stops 40 steps before its floor")):  # fmt: skip
        with pytest.warns(UserWarning) as caught:
            warn_other_length(schedule, run, "trainer.max_steps")
        assert str(caught[0].message) == (
            f"lr_scheduler CosineLR max_steps 100 is not trainer.max_steps {run}: the learning "
            f"rate {after}"
        )


@pytest.mark.parametrize("warmup", [10, 0])
def test_a_cosine_given_its_length_later_rates_every_step_as_one_built_with_it(warmup):
    """``max_steps=None`` (the default) until ``set_max_steps``, as the module sets it when
    training starts: from then on (the rate of the current step too) it is the schedule built
    with that length; before, the warmup, then the peak."""
    built = _lrs(warmup, 60, schedule=CosineLR, max_steps=50, min_lr_ratio=0.1)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    schedule = CosineLR(optimizer, warmup_steps=warmup, min_lr_ratio=0.1)
    assert schedule.max_steps is None
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 if warmup else 1e-3)
    schedule.set_max_steps(50)
    lrs = []
    for _ in range(60):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert lrs == built and schedule.get_last_lr() == [built[-1]]
    with pytest.raises(ValueError, match=r"^lr_scheduler max_steps must be > warmup_steps"):
        CosineLR(optimizer, warmup_steps=10).set_max_steps(10)


class _Trainer:
    """What :func:`set_schedule_length` reads of a Lightning trainer."""

    def __init__(self, max_steps=-1, max_epochs=3, batches=7.0, timed=False):
        from lightning.pytorch.callbacks import Timer

        self.max_steps, self.max_epochs, self.accumulate_grad_batches = max_steps, max_epochs, 2
        self.num_training_batches = batches
        self.callbacks = [Timer(duration="00:00:01:00")] if timed else []
        if batches == math.inf or max_epochs == -1:
            self.estimated_stepping_batches = math.inf if max_steps == -1 else max_steps
        else:  # Lightning's formula
            steps = math.ceil(batches / 2) * max_epochs
            self.estimated_stepping_batches = steps if max_steps == -1 else min(steps, max_steps)


def test_a_cosine_without_a_length_takes_the_runs(caplog):
    """trainer.max_steps, else max_epochs of the epoch's optimizer steps, said in a line
    (with max_time, as a guess); a run of no known length is refused naming both flags; a
    schedule with a length, or of another kind, is left as it is."""
    from seq2seq.optim import set_schedule_length

    caplog.set_level(logging.INFO)

    def schedule(**settings):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return CosineLR(optimizer, warmup_steps=2, **settings)

    given, trainer = schedule(), _Trainer(max_steps=40, max_epochs=-1)
    assert set_schedule_length(given, trainer) == 40 == given.max_steps
    assert caplog.messages == []
    assert set_schedule_length(given := schedule(), _Trainer()) == 12 == given.max_steps
    assert caplog.messages == [
        "lr_scheduler CosineLR max_steps 12: trainer.max_epochs 3 x 4 optimizer steps an epoch"
    ]
    set_schedule_length(schedule(), _Trainer(timed=True))
    assert caplog.messages[-1].endswith("epoch; trainer.max_time may stop the run before")
    for trainer in (_Trainer(max_epochs=-1), _Trainer(batches=math.inf)):
        with pytest.raises(ValueError, match=(
            r"^lr_scheduler CosineLR has no max_steps, and the run no known length \(trainer"
            r"\.max_steps -1, .*give --model.lr_scheduler.init_args.max_steps N or "
            r"--trainer.max_steps N$"
        )):  # fmt: skip
            set_schedule_length(schedule(), trainer)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    for other in (schedule(max_steps=30), InverseSqrtLR(optimizer, 10)):
        assert set_schedule_length(other, _Trainer()) is None
    assert set_schedule_length(schedule(), None) is None
