"""Resuming mid-epoch, with or without streaming: the epoch continues with exactly the
batches not yet trained on (one that Ctrl-C cut short included; streaming: with
``num_workers`` unchanged).

A data module's state holds the training position (:func:`sampler_position`,
:func:`stream_position`) and the settings that decide the batches
(:func:`batching_settings`). Other ``max_tokens``, ``bucket_size``, ``max_positions``,
``max_length_ratio``, ``streaming`` or (with several pairs) ``pair_temperature`` than the
checkpoint's give other batches and are warned about (:func:`batching_differences`), each in
one line naming the option and both values; another ``seed`` or ``stream_pool_size`` is
refused once a position is saved (and only warned about otherwise), and so is another
``num_workers`` with a stream position mid-epoch; other ``pairs`` are always refused: other
examples, vocabulary and language tags (:func:`resume_refusal`; it needs no data, so it is
checked before any is read). A state saved before ``pairs`` existed counts as bilingual
(:data:`PAIR_DEFAULTS`). Training or validation splits that hold other pairs than the
checkpoint's record of them (:func:`data_record`) are warned about (:func:`data_changes`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from seq2seq.data.batching import TokenBudgetBatchSampler
    from seq2seq.data.streaming import StreamingPairs

#: Start of Lightning's warning on resuming mid-epoch; see TranslationDataModule.load_state_dict.
NOT_RESUMABLE = "You're resuming from a checkpoint that ended before the epoch ended"
# End of the warning on resuming with other batching settings from mid-epoch.
_MID_EPOCH = " (in the epoch under way, pairs may be skipped or trained twice)"


#: The multilingual batching settings, and the values of a state saved without them.
PAIR_DEFAULTS: dict[str, Any] = {"pairs": None, "pair_temperature": 1.0}


def _value_text(value: Any) -> str:
    """A setting's value as the messages show it: ``true``, ``null``, ``4096``, ``[de-en]``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(map(str, value))}]"
    return "null" if value is None else str(value)


def _pairs(value: Any) -> list[str] | None:
    """``data.pairs`` as a list (a checkpoint may hold a tuple), ``None`` if unset."""
    return None if value is None else [str(pair) for pair in value]


def saved_batching(state_dict: dict[str, Any], streaming: bool) -> tuple[dict, dict | None]:
    """The batching settings a data module state was saved with, and its training position
    (``None`` if none). A position carries the settings it cannot be reproduced without (also
    in checkpoints written before ``"batching"`` was saved)."""
    saved = {**PAIR_DEFAULTS, **(state_dict.get("batching") or {})}
    position = state_dict.get("train_stream" if streaming else "train_sampler")
    if position:
        if "seed" in position:
            saved["seed"] = position["seed"]
        if streaming and "pool_size" in position:
            saved["stream_pool_size"] = position["pool_size"]
    return saved, position


def resume_refusal(state_dict: dict[str, Any], settings: Mapping[str, Any]) -> str | None:
    """Why a run with these ``data.*`` settings cannot resume from this saved state, or
    ``None``: the run needs a ``tokenizer_path`` that exists where one is named, the
    checkpoint's ``pairs``, and a saved training position the ``seed`` (and, streaming,
    ``stream_pool_size``) it was written with. Needs no data, so a
    command line can be checked before any is read (``seq2seq fit --ckpt_path``).

    Args:
        state_dict: the data module's state from a checkpoint (:meth:`state_dict`).
        settings: the run's ``data.*`` values by name (``tokenizer_path``, ``streaming``,
            ``pairs``, ``seed``, ``stream_pool_size``, ``num_workers`` — a streamed position
            mid-epoch is kept per worker, 0 counting as 1; others are ignored).

    Returns:
        A message naming the option and both values, or ``None``.
    """
    tokenizer = settings.get("tokenizer_path")
    if tokenizer and not Path(tokenizer).is_file():  # a typo would train a new model there
        return (
            f"--data.tokenizer_path {tokenizer} does not exist: a resumed run tokenises with "
            "the checkpoint's SentencePiece model (leave data.tokenizer_path out), or with the "
            "same model saved as a file that data.tokenizer_path names."
        )
    streaming = bool(settings.get("streaming"))
    saved, position = saved_batching(state_dict, streaming)
    if "pairs" in settings and _pairs(settings["pairs"]) != _pairs(saved["pairs"]):
        mine, value = _value_text(settings["pairs"]), _value_text(saved["pairs"])
        reordered = sorted(_pairs(settings["pairs"]) or []) == sorted(_pairs(saved["pairs"]) or [])
        why = (
            "the same pairs in another order, which numbers the training examples otherwise, "
            "so the batches that follow would differ"
            if reordered
            else "other pairs are other training examples, another vocabulary and other "
            "language tags"
        )
        return (
            f"The checkpoint was written with --data.pairs={value}, but this run has "
            f"--data.pairs={mine}: {why}; resume with --data.pairs={value}."
        )
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
            # 0 workers (the default) and 1 read the stream alike and are saved as 1
            value = "0 (or 1)" if workers == 1 else str(workers)
            return (
                f"The checkpoint was written with --data.num_workers={value}, but this run "
                f"has --data.num_workers={mine}: the stream position is kept per worker, so "
                f"the batches that follow cannot be reproduced; resume with "
                f"--data.num_workers={value}."
            )
    return None


def batching_differences(
    state_dict: dict[str, Any], current: Mapping[str, Any], streaming: bool
) -> list[str]:
    """One warning per batching setting in ``current`` (the run's, see
    :func:`batching_settings`) that differs from the one the saved state
    ``state_dict`` was written with: the resumed run trains on other batches."""
    saved, position = saved_batching(state_dict, streaming)
    mid_epoch = bool(position) and not position.get("complete")
    mid_epoch = mid_epoch and bool(position.get("batches_yielded", position.get("batches")))
    warnings = []
    for name, value in saved.items():
        if name == "pairs" or name not in current or current[name] == value:
            continue  # other pairs: refused by resume_refusal
        if name == "pair_temperature" and len(saved["pairs"] or ()) < 2:
            continue  # without several pairs nothing is sampled over pairs
        mine, value = _value_text(current[name]), _value_text(value)
        warnings.append(
            f"Resuming with --data.{name}={mine}, but the checkpoint was written with "
            f"--data.{name}={value}: training continues with other batches than the "
            f"interrupted run would have had{_MID_EPOCH if mid_epoch else ''}."
        )
    return warnings


def data_record(lengths: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, list]:
    """``{split: [pairs, digest]}`` of each split the data module prepared (``train``,
    ``val``, with several pairs ``val/de-en`` ...; ``lengths``: its source and target token
    lengths): the number of sentence pairs and a digest of their lengths, by which a resumed
    run tells the data it was written with from other data (:func:`data_changes`)."""
    record = {}
    for name, (src, tgt) in lengths.items():
        digest = hashlib.sha256()
        for side in (src, tgt):  # hashed in place (a copy only of other dtypes)
            digest.update(np.ascontiguousarray(side, dtype=np.int64))
        record[name] = [len(src), digest.hexdigest()[:16]]
    return record


def data_changes(
    state_dict: dict[str, Any], lengths: Mapping[str, tuple[np.ndarray, np.ndarray]], train: str
) -> list[str]:
    """One warning per split prepared (``lengths``, see :func:`data_record`) that holds other
    pairs than the same split when the data module's state ``state_dict`` was saved: the
    training split ``train`` (a saved position mid-epoch goes on in a plan of batches of
    other pairs), or a validation split (its scores are not comparable with those by which the
    checkpoint's best was chosen)."""
    saved = state_dict.get("data") or {}
    position = state_dict.get("train_sampler") or {}
    warnings = []
    for name, (pairs, digest) in data_record(lengths).items():
        if name not in saved or list(saved[name]) == [pairs, digest]:
            continue
        then = saved[name][0]
        sizes = f"{then:,} then, {pairs:,} now" if then != pairs else f"{pairs:,}, as many"
        kept = ", those the length filters keep" if name == train else ""
        other = f"other sentence pairs than when the checkpoint was written ({sizes}{kept})"
        new_run = "start a new run from its weights (--init_from)"
        if name == train:
            done = position.get("batches_yielded", 0)
            goes_on = (
                f"epoch {position.get('epoch')} goes on after {done} batches, in a plan of "
                "batches of these pairs, so some are left out of it and others trained twice"
                if done
                else "training goes on over these pairs"
            )
            warnings.append(
                f"The training split {name!r} holds {other}: {goes_on}. To train the "
                f"checkpoint's model on another corpus, {new_run}, with a schedule, step "
                "count and checkpoint ranking of its own."
            )
        elif name != "predict":
            warnings.append(
                f"The validation split {name!r} holds {other}: its scores are not comparable "
                "with the checkpoint's, by which the best checkpoints were ranked and early "
                f"stopping waits; to rank them afresh, {new_run}."
            )
    return warnings


#: The ``data.*`` settings that decide which training batches are built (and
#: ``stream_pool_size`` with ``streaming``, then those of :data:`PAIR_DEFAULTS`), in the
#: order they are saved.
BATCHING = ("streaming", "max_tokens", "bucket_size", "max_positions", "max_length_ratio", "seed")


def batching_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`BATCHING` settings (and ``stream_pool_size`` with ``streaming``), then
    ``pairs`` and ``pair_temperature`` of ``values``, the run's ``data.*`` values by name
    (without the latter: a bilingual data module, :data:`PAIR_DEFAULTS`)."""
    names = (*BATCHING, "stream_pool_size") if values["streaming"] else BATCHING
    settings = {name: values[name] for name in names}
    for name, default in PAIR_DEFAULTS.items():
        settings[name] = values.get(name, default)
    return settings


def sampler_position(
    sampler: TokenBudgetBatchSampler | None, pending: dict[str, int] | None, progress: Any
) -> dict[str, Any]:
    """``{"train_sampler": state}``, or ``{}`` before there is a position.

    Args:
        sampler: the training sampler, ``None`` before the first training loader.
        pending: the state loaded before there was a sampler, if any.
        progress: while fitting, the training loop's batch progress (else ``None``): the
            position is then after the batches the loop has processed, not those the loader
            has prefetched, nor one under way at Ctrl-C (trained again).
    """
    if sampler is None:
        return {"train_sampler": pending} if pending else {}
    state = sampler.state_dict()  # its own epoch: the batches' epoch
    if progress is not None:
        # Lightning's current_epoch is one ahead once an epoch has ended (e.g. a checkpoint
        # written at SIGTERM during the validation at the end of an epoch).
        state["batches_yielded"] = progress.current.processed
    return {"train_sampler": state}


def stream_position(
    pairs: StreamingPairs | None, pending: dict[str, Any] | None, progress: Any, epoch: int | None
) -> dict[str, Any]:
    """``{"train_stream": state}`` (see :meth:`StreamingPairs.state_dict`), or ``{}``.

    Args:
        pairs: the streamed training split, ``None`` before ``setup("fit")``.
        pending: the state loaded before there was a stream, if any.
        progress: as for :func:`sampler_position`.
        epoch: the trainer's current epoch while fitting.
    """
    if pairs is None:
        return {"train_stream": pending} if pending else {}
    if progress is None:
        state = pairs.state_dict()
    else:
        # The batches trained since the pass started, counted by the trainer (not the
        # loader's count less what the trainer holds: a batch in neither place when Ctrl-C
        # stopped a fetch would be lost). The trainer's epoch is one ahead of the pass after
        # a stop (max_steps, a stop request) that cut the epoch short; the pass's position
        # still applies then.
        plan = pairs.current_pass
        trained = None if plan is None else plan.trained(progress.total.processed)
        processed = progress.current.processed
        state = pairs.state_dict(processed if trained is None else trained, epoch)
    return {"train_stream": state} if state else {}
