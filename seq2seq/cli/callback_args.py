"""The callbacks of a ``fit`` config: ``--patience`` (EarlyStopping's patience), the check of
each ``EarlyStopping``'s and ``ModelCheckpoint``'s monitor (a metric the validation logs, in a
mode that goes its way), and of callbacks that cannot run twice."""

from __future__ import annotations

import importlib
import sys

from lightning.pytorch import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from seq2seq.evaluation import METRICS
from seq2seq.optim import check_validation_key, mode_against_metric


def configured_callbacks(trainer_config) -> list:
    """``trainer.callbacks`` of a parsed config as a list: ``--trainer.callbacks=X`` gives one
    callback, not a list of them."""
    callbacks = trainer_config.get("callbacks") or []
    return callbacks if isinstance(callbacks, list) else [callbacks]


def _class_path(callback) -> str | None:
    return getattr(callback, "class_path", None) or (
        callback.get("class_path") if isinstance(callback, dict) else None
    )


def callback_init_args(config, kind: str = "ModelCheckpoint") -> list:
    """The ``init_args`` of each configured callback of the class named ``kind``
    (``ModelCheckpoint``, ``EarlyStopping``; ``None`` where it has none)."""
    found = []
    for callback in configured_callbacks(config.get("trainer", {})):
        class_path = _class_path(callback)
        if class_path and class_path.rsplit(".", 1)[-1] == kind:
            init_args = getattr(callback, "init_args", None) or (
                callback.get("init_args") if isinstance(callback, dict) else None
            )
            found.append(init_args)
    return found


def set_patience(config, patience: int) -> None:
    """``--patience N``: the ``patience`` of every ``EarlyStopping`` callback (fairseq's
    ``--patience``: validations without improvement before training stops).

    Raises:
        ValueError: if the config has no ``EarlyStopping`` callback, or N is below 1.
    """
    if patience < 1:
        raise ValueError(f"--patience must be >= 1, got {patience}")
    targets = [init_args for init_args in callback_init_args(config, "EarlyStopping")]
    if not targets or None in targets:
        raise ValueError(
            f"--patience {patience}: the config has no EarlyStopping in trainer.callbacks whose "
            "patience it could set; add one: --trainer.callbacks+=EarlyStopping "
            f"--trainer.callbacks.monitor val/bleu --trainer.callbacks.mode max "
            f"--trainer.callbacks.patience {patience}"
        )
    for init_args in targets:
        init_args["patience"] = patience


def warn_callback_modes(config) -> None:
    """Warns (global rank 0) of an ``EarlyStopping`` or ``ModelCheckpoint`` whose ``mode``
    goes against its ``monitor`` (:func:`~seq2seq.optim.mode_against_metric`; ``min``, their
    default, on ``val/bleu``): it would stop, or keep checkpoints, the wrong way round."""
    for kind in ("EarlyStopping", "ModelCheckpoint"):
        for init_args in callback_init_args(config, kind):
            monitor = init_args.get("monitor") if hasattr(init_args, "get") else None
            against = monitor and mode_against_metric(monitor, init_args.get("mode") or "min")
            if against and rank_zero_only.rank == 0:
                mode = "min" if init_args.get("mode") == "max" else "max"
                print(f"seq2seq: warning: {kind} {against}: give it mode {mode}", file=sys.stderr)


def check_callback_monitors(config) -> None:
    """Checks, before any data is read, that each ``EarlyStopping`` and ``ModelCheckpoint``
    monitoring a ``val/`` key names one the validation logs (``val/<name>`` for the loss,
    ``nll``, ``ppl`` and ``model.metrics``, a language pair possibly between): otherwise
    Lightning finds out at the first validation, minutes into training. Other keys
    (``train/loss``, ``step``) are left to Lightning.

    Raises:
        ValueError: naming the callback, the key and what the validation logs.
    """
    model = config.get("model") or {}
    metrics = model.get("metrics") if hasattr(model, "get") else None
    for kind in ("EarlyStopping", "ModelCheckpoint"):
        for init_args in callback_init_args(config, kind):
            monitor = init_args.get("monitor") if hasattr(init_args, "get") else None
            if monitor and monitor.startswith("val/"):
                check_validation_key(kind, monitor, METRICS if metrics is None else metrics)


def check_single_callbacks(config) -> None:
    """Raises ValueError for a callback class configured twice whose checkpoint state is kept
    under its class name (``seq2seq.callbacks.EMA``): Lightning refuses the pair with a
    traceback. Adding one with ``--trainer.callbacks+=`` to a config that has it already is
    the usual way to get there."""
    seen = set()
    for callback in configured_callbacks(config.get("trainer", {})):
        class_path = _class_path(callback)
        module, _, name = (class_path or "").rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            continue  # jsonargparse names a class that cannot be imported itself
        if not (isinstance(cls, type) and issubclass(cls, Callback)):
            continue
        # Lightning's rule: a callback with a state_dict of its own, keyed by its class name
        if cls.state_dict is Callback.state_dict or cls.state_key is not Callback.state_key:
            continue
        if cls in seen:
            raise ValueError(
                f"trainer.callbacks holds {class_path} twice (a config with one, and "
                f"--trainer.callbacks+={class_path} adding another, say), and a run keeps one: "
                "change the settings of the config's in a copy of the config instead"
            )
        seen.add(cls)
