"""The callbacks of a ``fit`` config: ``--patience`` (EarlyStopping's patience), and the check
of each ``EarlyStopping``'s and ``ModelCheckpoint``'s mode against the metric it monitors."""

from __future__ import annotations

import sys

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from seq2seq.optim import mode_against_metric


def configured_callbacks(trainer_config) -> list:
    """``trainer.callbacks`` of a parsed config as a list: ``--trainer.callbacks=X`` gives one
    callback, not a list of them."""
    callbacks = trainer_config.get("callbacks") or []
    return callbacks if isinstance(callbacks, list) else [callbacks]


def callback_init_args(config, kind: str = "ModelCheckpoint") -> list:
    """The ``init_args`` of each configured callback of the class named ``kind``
    (``ModelCheckpoint``, ``EarlyStopping``; ``None`` where it has none)."""
    found = []
    for callback in configured_callbacks(config.get("trainer", {})):
        class_path = getattr(callback, "class_path", None) or (
            callback.get("class_path") if isinstance(callback, dict) else None
        )
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
