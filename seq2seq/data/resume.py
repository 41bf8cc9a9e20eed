"""Resuming mid-epoch: the batching settings a training position needs, checked against the
run's before any data is read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Start of Lightning's warning on resuming mid-epoch; see TranslationDataModule.load_state_dict.
NOT_RESUMABLE = "You're resuming from a checkpoint that ended before the epoch ended"
# End of the warning on resuming with other batching settings from mid-epoch.
_MID_EPOCH = " (in the epoch under way, pairs may be skipped or trained twice)"


def _value_text(value: Any) -> str:
    """A setting's value as the messages show it: ``true``, ``null``, ``4096``."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def saved_batching(state_dict: dict[str, Any], streaming: bool) -> tuple[dict, dict | None]:
    """The batching settings a data module state was saved with, and its training position
    (``None`` if none). A position carries the settings it cannot be reproduced without (also
    in checkpoints written before ``"batching"`` was saved)."""
    saved = dict(state_dict.get("batching") or {})
    position = state_dict.get("train_stream" if streaming else "train_sampler")
    if position:
        if "seed" in position:
            saved["seed"] = position["seed"]
        if streaming and "pool_size" in position:
            saved["stream_pool_size"] = position["pool_size"]
    return saved, position


def resume_refusal(state_dict: dict[str, Any], settings: Mapping[str, Any]) -> str | None:
    """Why a run with these ``data.*`` settings cannot resume from this saved state, or
    ``None``: a saved training position needs the ``seed`` (and, streaming,
    ``stream_pool_size``) it was written with. Needs no data, so a command line can be
    checked before any is read (``seq2seq fit --ckpt_path``).

    Args:
        state_dict: the data module's state from a checkpoint (:meth:`state_dict`).
        settings: the run's ``data.*`` values by name (``streaming``, ``seed``,
            ``stream_pool_size``, ``num_workers`` — a streamed position mid-epoch is kept
            per worker, 0 counting as 1; others are ignored).

    Returns:
        A message naming the option and both values, or ``None``.
    """
    streaming = bool(settings.get("streaming"))
    saved, position = saved_batching(state_dict, streaming)
    if not position:
        return None
    for name in ("seed", "stream_pool_size") if streaming else ("seed",):
        if name in saved and name in settings and settings[name] != saved[name]:
            mine, value = _value_text(settings[name]), _value_text(saved[name])
            return (
                f"The checkpoint was written with --data.{name}={value}, but this run has "
                f"--data.{name}={mine}: the batches that follow cannot be reproduced; resume "
                f"with --data.{name}={value}."
            )
    workers = position.get("num_workers") if streaming else None
    if workers and not position.get("complete") and "num_workers" in settings:
        mine = settings["num_workers"]
        if max(1, int(mine)) != workers:
            value = f"{workers} (or 0)" if workers == 1 else str(workers)
            return (
                f"The checkpoint was written with --data.num_workers={value}, but this run "
                f"has --data.num_workers={mine}: the stream position is kept per worker, so "
                f"the batches that follow cannot be reproduced; resume with "
                f"--data.num_workers={workers}."
            )
    return None


def batching_differences(
    state_dict: dict[str, Any], current: Mapping[str, Any], streaming: bool
) -> list[str]:
    """One warning per batching setting in ``current`` (the run's, see
    ``TranslationDataModule._batching``) that differs from the one the saved state
    ``state_dict`` was written with: the resumed run trains on other batches."""
    saved, position = saved_batching(state_dict, streaming)
    mid_epoch = bool(position) and not position.get("complete")
    mid_epoch = mid_epoch and bool(position.get("batches_yielded", position.get("batches")))
    warnings = []
    for name, value in saved.items():
        if name not in current or current[name] == value:
            continue
        mine, value = _value_text(current[name]), _value_text(value)
        warnings.append(
            f"Resuming with --data.{name}={mine}, but the checkpoint was written with "
            f"--data.{name}={value}: training continues with other batches than the "
            f"interrupted run would have had{_MID_EPOCH if mid_epoch else ''}."
        )
    return warnings
