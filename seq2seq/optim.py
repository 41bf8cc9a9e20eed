"""Learning-rate schedules for Transformer training, the module's default optimizer and
schedule, and how the module checks and steps them (a resumed run's optimizer and schedule are
checked in :mod:`seq2seq.checkpoint.restore`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from seq2seq.evaluation import HIGHER_IS_BETTER, KNOWN_METRICS
from seq2seq.spelling import did_you_mean


class InverseSqrtLR(LambdaLR):
    """Linear warmup, then decay proportional to the inverse square root of the step.

    The factor applied to each parameter group's base learning rate at optimizer step ``s``
    (counted from 1) is ``min(s / warmup_steps, sqrt(warmup_steps / s))``: it rises linearly to
    1 at ``warmup_steps`` and then decays as ``s ** -0.5``. This is the schedule of Vaswani et
    al. (2017), "Attention Is All You Need", Section 5.3, eq. 3, with the peak learning rate
    given by the optimizer's ``lr`` instead of ``d_model ** -0.5`` (fairseq's
    ``inverse_sqrt``).

    Step it once per optimizer step (Lightning: ``"interval": "step"``).

    Args:
        optimizer: the wrapped optimizer; its ``lr`` is the peak learning rate.
        warmup_steps: number of optimizer steps of linear warmup; 0 disables warmup.

    Raises:
        ValueError: if ``warmup_steps`` is negative.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 4000) -> None:
        if warmup_steps < 0:
            raise ValueError(f"lr_scheduler warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, lr_lambda=self._factor)

    def _factor(self, step: int) -> float:
        step = step + 1  # LambdaLR counts from 0; the first optimizer step is step 1.
        if self.warmup_steps == 0:
            return 1.0 / math.sqrt(step)
        return min(step / self.warmup_steps, math.sqrt(self.warmup_steps / step))


class CosineLR(LambdaLR):
    """Linear warmup, then half a cosine from the peak down to a floor at ``max_steps``.

    The factor applied to each parameter group's base learning rate at optimizer step ``s``
    (counted from 1, as :class:`InverseSqrtLR` counts) is ``s / warmup_steps`` up to
    ``warmup_steps``, then ``r + (1 - r) * (1 + cos(pi * p)) / 2`` with ``r = min_lr_ratio``
    and ``p = min(1, (s - warmup_steps) / (max_steps - warmup_steps))``: 1 at ``warmup_steps``,
    ``r`` from ``max_steps`` on. This is SGDR's cosine (Loshchilov and Hutter, 2017, eq. 5,
    one cycle) after a linear warmup, as Hugging Face's ``get_cosine_schedule_with_warmup``
    (``min_lr_ratio`` as the ``min_lr_rate`` of its ``..._with_min_lr``) one step ahead: that
    counts steps from 0, so its first step trains at rate 0 and its peak comes one step late.

    Step it once per optimizer step (Lightning: ``"interval": "step"``).

    Args:
        optimizer: the wrapped optimizer; its ``lr`` is the peak learning rate.
        warmup_steps: number of optimizer steps of linear warmup; 0 disables warmup.
        max_steps: the optimizer step at which the rate reaches its floor and stays. ``None``
            (the default): the run's length, set by the module when training starts
            (:func:`set_schedule_length`: ``trainer.max_steps``, else ``trainer.max_epochs``
            full epochs); one other than ``trainer.max_steps`` is warned about.
        min_lr_ratio: the floor, as a fraction of the peak, in [0, 1].

    Raises:
        ValueError: if ``warmup_steps`` is negative, ``max_steps`` not above it, or
            ``min_lr_ratio`` outside [0, 1].
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        max_steps: int | None = None,
        warmup_steps: int = 4000,
        min_lr_ratio: float = 0.0,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"lr_scheduler warmup_steps must be >= 0, got {warmup_steps}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"lr_scheduler min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.warmup_steps, self.min_lr_ratio, self.max_steps = warmup_steps, min_lr_ratio, None
        if max_steps is not None:
            self._check_length(max_steps)
        self.max_steps = max_steps
        super().__init__(optimizer, lr_lambda=self._factor)

    def set_max_steps(self, max_steps: int) -> None:
        """Sets ``max_steps`` (as the constructor would have) and the rates of the current
        step by it.

        Raises:
            ValueError: if ``max_steps`` is not above ``warmup_steps``.
        """
        self._check_length(max_steps)
        self.max_steps = max_steps
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base_lr * self._factor(self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _check_length(self, max_steps: int) -> None:
        if max_steps <= self.warmup_steps:
            raise ValueError(  # "lr_scheduler": not trainer.max_steps
                f"lr_scheduler max_steps must be > warmup_steps ({self.warmup_steps}), got "
                f"{max_steps}"
            )

    def _factor(self, step: int) -> float:
        step = step + 1  # LambdaLR counts from 0; the first optimizer step is step 1.
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if self.max_steps is None:  # no length yet (set_max_steps): the peak
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / (self.max_steps - self.warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def default_optimizer(params) -> torch.optim.Optimizer:
    """The module's optimizer where a config names none: AdamW, lr 5e-4, betas (0.9, 0.98) of
    Vaswani et al. (2017), Section 5.3 (as fairseq's Transformer recipes), eps 1e-8, no weight
    decay."""
    return torch.optim.AdamW(params, lr=5e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)


def default_scheduler(optimizer: torch.optim.Optimizer) -> InverseSqrtLR:
    """The module's schedule where a config names none: :class:`InverseSqrtLR`, 4,000 warm-up
    steps."""
    return InverseSqrtLR(optimizer, warmup_steps=4000)


def check_optimizer_settings(optimizer, lr_scheduler, metrics: list[str]) -> tuple | None:
    """Builds the optimizer and schedule once over a stand-in parameter, so that settings they
    refuse with ``ValueError`` (a negative ``lr`` or ``warmup_steps``, a plateau schedule's
    metric that validation does not log) fail when the module is built, before any data is
    prepared, not when training starts. Other errors (an optimizer that takes no CPU
    parameter, say) are left to ``configure_optimizers``.

    Returns:
        The stand-in optimizer and schedule (``None`` for none), which a resume compares with
        the checkpoint's; ``None`` if they could not be built.

    Raises:
        ValueError: as the optimizer or the schedule raises it.
    """
    try:
        built = optimizer([torch.nn.Parameter(torch.zeros(1))])
        defaults = dict(built.defaults)  # before a schedule sets the first step's rate
        schedule = None if lr_scheduler is None else lr_scheduler(built)
        if schedule is not None:
            lightning_schedule(schedule, metrics)
        built.defaults = defaults
        return built, schedule
    except ValueError:
        raise
    except Exception:  # only the settings' own errors are reported here
        return None


def lightning_schedule(scheduler: object, metrics: Iterable[str]) -> dict[str, Any]:
    """Lightning's ``lr_scheduler`` entry for ``scheduler``: stepped after every optimizer step;
    a ``ReduceLROnPlateau`` after each validation of a fit instead, by the module
    (:func:`step_plateau_schedules`), as fairseq and JoeyNMT step it; Lightning would step it at
    epoch ends only, and fail at the first one that no validation preceded.

    Its metric: Lightning's subclass names its ``monitor``; torch's is ``val/loss`` for its mode
    ``min``, ``val/bleu`` for ``max``. A schedule of a set length (:class:`CosineLR`) other
    than ``max_steps``, the run's ``trainer.max_steps``, is warned about.

    Raises:
        ValueError: for a monitor that the validation does not log (``val/`` and ``loss``,
            ``nll``, ``ppl`` or one of ``metrics``, possibly with a language pair between).
    """
    if not isinstance(scheduler, ReduceLROnPlateau):
        return {"scheduler": scheduler, "interval": "step", "frequency": 1}
    monitor = getattr(scheduler, "monitor", None)
    monitor = monitor or ("val/loss" if scheduler.mode == "min" else "val/bleu")
    check_validation_key(f"lr_scheduler {type(scheduler).__name__}", monitor, metrics)
    for name in ("patience", "cooldown"):  # torch takes a negative one
        if getattr(scheduler, name, 0) < 0:
            raise ValueError(f"lr_scheduler {name} must be >= 0, got {getattr(scheduler, name)}")
    # reduce_on_plateau False: Lightning calls lr_scheduler_step, which leaves it to the module.
    plateau = {"interval": "epoch", "reduce_on_plateau": False, "monitor": monitor}
    return {"scheduler": scheduler, **plateau}


def check_validation_key(owner: str, monitor: str, metrics: Iterable[str]) -> None:
    """Checks that the key ``monitor``, which ``owner`` (``"ModelCheckpoint"``) watches, is
    one the validation logs, the language pair left aside: ``val/<name>`` or
    ``val/<pair>/<name>`` for ``name`` among ``loss``, ``nll``, ``ppl`` and ``metrics``.

    Raises:
        ValueError: naming ``owner``, the key and the names logged (and ``model.metrics``
            where the key is a metric the run does not compute).
    """
    logged = ("loss", "nll", "ppl", *metrics)
    name = monitor.rsplit("/", 1)[-1]
    if monitor.startswith("val/") and name in logged:
        return
    left_out = monitor.startswith("val/") and name in KNOWN_METRICS  # not chosen
    known = [f"val/{name}" for name in logged]
    raise ValueError(
        f"{owner} monitors {monitor!r}{'' if left_out else did_you_mean(monitor, known)}, "
        f"which the validation does not log; it logs val/<name> for {', '.join(logged)} "
        f"(model.metrics{f'; add {name}' if left_out else ''})"
    )


def set_schedule_length(scheduler: object, trainer: Any) -> int | None:
    """Gives a :class:`CosineLR` without ``max_steps`` the length of ``trainer``'s fit:
    ``trainer.max_steps``, else Lightning's ``estimated_stepping_batches`` (``max_epochs``
    epochs of the training set's optimizer steps; the first epoch's count where epochs vary,
    as a multilingual run's draws do), said in a line as it is a guess where ``max_time``
    stops the run first. As Hugging Face's Trainer takes ``num_training_steps`` and fairseq's
    cosine schedule ``--max-update``.

    Returns:
        The length set, or ``None`` where none was set (another schedule, one with its
        length, or no trainer).

    Raises:
        ValueError: where the run's length is not known (neither ``max_steps`` nor
            ``max_epochs``, or a streamed corpus, whose epochs have no known size), or not
            above ``warmup_steps``.
    """
    if not isinstance(scheduler, CosineLR) or scheduler.max_steps is not None or trainer is None:
        return None
    steps = trainer.estimated_stepping_batches
    if not 0 < steps < math.inf:
        raise ValueError(
            "lr_scheduler CosineLR has no max_steps, and the run no known length (trainer."
            f"max_steps {trainer.max_steps}, trainer.max_epochs {trainer.max_epochs}, or a "
            "streamed corpus, whose epochs have no known size): give "
            "--model.lr_scheduler.init_args.max_steps N or --trainer.max_steps N"
        )
    steps = int(steps)
    scheduler.set_max_steps(steps)
    if steps != trainer.max_steps:
        timed = any(isinstance(c, Timer) for c in trainer.callbacks)  # max_time
        stop = "; trainer.max_time may stop the run before" if timed else ""
        per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        rank_zero_info(
            f"lr_scheduler CosineLR max_steps {steps}: trainer.max_epochs {trainer.max_epochs} "
            f"x {per_epoch} optimizer steps an epoch{stop}"
        )
    return steps


def warn_other_length(scheduler: object, max_steps: int | None, name: str) -> None:
    """Warns where a schedule of a set length (:class:`CosineLR`'s ``max_steps``) is not the
    run's length ``max_steps`` (``None`` or -1: not known), ``name`` saying which it is
    (``"trainer.max_steps"``): a resumed run keeps its checkpoint's length."""
    length = getattr(scheduler, "max_steps", None)
    if length is None or max_steps is None or max_steps < 0 or length == max_steps:
        return
    if max_steps > length:
        after = f"stays at its floor for the last {max_steps - length} steps"
    else:
        after = f"stops {length - max_steps} steps before its floor"
    rank_zero_warn(
        f"lr_scheduler {type(scheduler).__name__} max_steps {length} is not {name} "
        f"{max_steps}: the learning rate {after}"
    )


def check_plateau_monitor(schedule: dict[str, Any], pairs: Iterable[str]) -> None:
    """Checks a plateau schedule's monitor (``schedule``: :func:`lightning_schedule`'s entry)
    against the run's language pairs (:func:`check_pair_key`), before training, and warns of a
    mode that goes against its metric (:func:`mode_against_metric`).

    Raises:
        ValueError: for another pair, or a pair's metric in a run of one pair.
    """
    monitor = schedule.get("monitor")
    if not isinstance(schedule["scheduler"], ReduceLROnPlateau) or monitor is None:
        return
    check_pair_key("lr_scheduler ReduceLROnPlateau", monitor, pairs)
    against = mode_against_metric(monitor, schedule["scheduler"].mode)
    if against:
        rank_zero_warn(
            f"lr_scheduler ReduceLROnPlateau {against}: the rate falls while it improves; give "
            f"mode {'min' if schedule['scheduler'].mode == 'max' else 'max'}"
        )


def check_pair_key(owner: str, monitor: str, pairs: Iterable[str]) -> None:
    """Checks the language pair of a key ``monitor`` that ``owner`` watches against the run's
    pairs (the data module's ``pair_names``): a pair's metric ``val/<pair>/<name>`` is logged
    with several pairs only.

    Raises:
        ValueError: for another pair, or a pair's metric in a run of one pair.
    """
    parts, pairs = monitor.split("/"), list(pairs)
    if parts[0] == "val" and len(parts) == 3 and (len(pairs) < 2 or parts[1] not in pairs):
        logged = (
            f"val/<pair>/{parts[2]} for {', '.join(pairs)}"
            if len(pairs) > 1
            else (f"val/{parts[2]} (one language pair)")
        )
        raise ValueError(
            f"{owner} monitors {monitor!r}, which the validation of this run does not log; it "
            f"logs {logged}"
        )


def mode_against_metric(monitor: str, mode: str) -> str | None:
    """``monitors val/bleu in mode min, but a higher bleu is better`` where ``mode`` goes
    against the metric ``monitor`` names (``min`` on BLEU, chrF, chrF++:
    :data:`~seq2seq.evaluation.HIGHER_IS_BETTER`; ``max`` on the others: loss, ``nll``,
    ``ppl``, TER), else None."""
    metric = monitor.rsplit("/", 1)[-1]
    higher = metric in HIGHER_IS_BETTER
    if mode != ("min" if higher else "max"):
        return None
    better = "higher" if higher else "lower"
    return f"monitors {monitor} in mode {mode}, but a {better} {metric} is better"


def step_plateau_schedules(configs: Iterable[Any], logged: Mapping[str, float]) -> None:
    """Steps each ``ReduceLROnPlateau`` of Lightning's ``trainer.lr_scheduler_configs`` on its
    monitor's value among ``logged``, the metrics a validation logged.

    Raises:
        ValueError: if the monitor is not among them.
    """
    for config in configs:
        if isinstance(config.scheduler, ReduceLROnPlateau):
            if config.monitor not in logged:
                raise ValueError(
                    f"lr_scheduler {type(config.scheduler).__name__} monitors "
                    f"{config.monitor!r}, which the validation did not log; it logged "
                    + ", ".join(sorted(logged))
                )
            config.scheduler.step(logged[config.monitor])
