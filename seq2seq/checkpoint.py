"""Safe checkpoint loading and writing, ``best``/``last`` resolution, parameter averaging."""

from __future__ import annotations

import pickle
import random
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from seq2seq.files import atomic_write, check_output_file


class CheckpointError(ValueError):
    """A file given as a checkpoint cannot be used as one (not a checkpoint, or unsafe)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holds objects that only a full (code-executing) unpickler could load."""


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """Load a checkpoint with ``torch.load(weights_only=True)``.

    Only tensors, primitive containers and the types PyTorch allow-lists are accepted; a file
    that holds any other pickled object (which could run code when unpickled) is refused.

    Args:
        path: a ``.ckpt`` file written by Lightning (or :func:`average_checkpoints`).
        map_location: where tensors are loaded.
        mmap: map the tensors' storage from the file instead of reading it (cheap when only
            the checkpoint's keys or settings are needed).

    Returns:
        The checkpoint dictionary.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        IsADirectoryError: if ``path`` is a folder.
        UnsafeCheckpointError: if the file holds objects outside the allow-list.
        CheckpointError: if the file is not a PyTorch checkpoint at all, or a truncated one.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a checkpoint file (.ckpt)")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path} is not a PyTorch checkpoint, or a truncated one (a .ckpt file written by "
            "`seq2seq fit` or `seq2seq average`)"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it contains pickled objects that are not plain tensors "
            f"or containers, and loading them could execute code ({str(err).splitlines()[0]}). "
            "Only load checkpoints from sources you trust."
        ) from err
    except (RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(f"{path} is not a readable PyTorch checkpoint: {err}") from err
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} is not a checkpoint dictionary (found {type(checkpoint)})")
    return checkpoint


LIGHTNING_VERSION = "pytorch-lightning_version"
"""Key of the Lightning version in every checkpoint Lightning writes (its ``Trainer`` needs it
to restore one)."""


def check_model_checkpoint(
    checkpoint: dict[str, Any], path: str | Path, trainer: bool = False
) -> None:
    """Refuse a checkpoint dictionary (from :func:`load_checkpoint`) that holds no model.

    ``seq2seq translate``, ``average``, ``fit``, ``validate``, ``test``, ``predict`` and
    :class:`~seq2seq.translator.Translator` check the file they are given with it before
    they use it, so that a PyTorch file of another kind is one error naming it.

    Args:
        checkpoint: the loaded dictionary.
        path: the file it came from (named in the error).
        trainer: also require Lightning's version record, without which Lightning's
            ``Trainer`` cannot restore the checkpoint (``fit``/``validate``/``test``/``predict``).

    Raises:
        CheckpointError: if it has no model weights (``state_dict`` missing or empty) or, with
            ``trainer``, no Lightning version.
    """
    state = checkpoint.get("state_dict")
    if not isinstance(state, dict) or not state:
        raise CheckpointError(
            f"{path} holds no model weights (no state_dict): it is not a checkpoint written "
            "by `seq2seq fit` or `seq2seq average`"
        )
    if trainer and LIGHTNING_VERSION not in checkpoint:
        raise CheckpointError(
            f"{path} is not a Lightning checkpoint (it has no {LIGHTNING_VERSION} entry): "
            "give a checkpoint written by `seq2seq fit` or `seq2seq average`"
        )


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file beside its destination, then renames it.

    The file under the final name is therefore always a complete checkpoint: a process killed
    while saving, or a full disk, leaves the previous file (e.g. ``last.ckpt``) untouched, and
    the temporary file is removed when the write fails with an exception. The data are
    flushed to disk (``fsync``) before the rename. Lightning's default writer stages the file
    in the system temporary folder instead, which is only atomic when that folder is on the
    same file system as the checkpoints. Paths with a URL scheme (``s3://`` ...) are left to
    Lightning's writer.

    ``seq2seq fit`` installs it in place of Lightning's default ``TorchCheckpointIO``.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        """Saves ``checkpoint`` to ``path`` atomically.

        Raises:
            OSError: if the file cannot be written (e.g. ``ENOSPC``), naming the path and
                keeping the error number; the previous file at ``path`` is unchanged.
        """
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        try:
            with atomic_write(path, "wb", fsync=True) as f:
                torch.save(checkpoint, f)
        except OSError as err:
            raise OSError(
                err.errno,
                f"could not write checkpoint {path}: {err.strerror or err}; the previous "
                "checkpoint at that path (if any) is unchanged",
            ) from err


def capture_rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and PyTorch's (CPU and current CUDA device) generators.

    Returned as tensors and plain values only, so a checkpoint holding it still loads with
    ``torch.load(weights_only=True)``. :func:`restore_rng_state` sets them back.
    """
    version, keys, gauss = random.getstate()
    algorithm, np_keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "keys": list(keys), "gauss": gauss},
        "numpy": {
            "algorithm": algorithm,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Sets the random generators to a state captured by :func:`capture_rng_state`."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["keys"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (
            npy["algorithm"],
            npy["keys"].numpy().astype(np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def keep_cut_epoch_unfinished(checkpoint: dict[str, Any], epoch: int) -> None:
    """Record training epoch ``epoch``, which a stop ended before its last batch, as unfinished
    in ``checkpoint``, so resuming trains the rest of it.

    When ``max_time``, ``max_steps`` or early stopping ends training before an epoch's last
    batch, Lightning still runs the epoch-end steps and counts the epoch processed, then
    completed; a checkpoint written then (``ModelCheckpoint(save_last=True)`` saves at the end
    of a training epoch when it validates once per epoch, and at the end of training) would make
    a resumed run start the next epoch and skip the untrained batches. This writes the epoch
    progress of an uninterrupted run in the middle of ``epoch`` (the state Lightning restarts
    mid-epoch from), and the epoch of the data module's saved position (``"train_sampler"`` or
    ``"train_stream"``, see :class:`seq2seq.data.TranslationDataModule`), so the resumed epoch
    continues after the batches trained.

    Args:
        checkpoint: the dictionary Lightning is about to write (edited in place).
        epoch: 0-based index of the cut epoch.
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    if not fit_loop:
        return
    for progress in fit_loop["epoch_progress"].values():  # "total" and "current"
        progress.update(ready=epoch + 1, started=epoch + 1, processed=epoch, completed=epoch)
    checkpoint["epoch"] = epoch
    for state in checkpoint.values():
        if isinstance(state, dict):
            for key in ("train_sampler", "train_stream"):
                if isinstance(state.get(key), dict) and "epoch" in state[key]:
                    state[key]["epoch"] = epoch


def run_validation_again(checkpoint: dict[str, Any]) -> None:
    """Record the validation of ``fit`` under way in ``checkpoint`` so that a resumed run runs
    it again from its first batch.

    Lightning re-runs an interrupted validation only when the stop came inside a batch's
    ``validation_step``; stopped elsewhere (between batches, as SIGTERM does, or while the
    corpus scores are computed) the resumed run skips it, and that step's score, scored
    checkpoint and early-stopping count are lost. This writes the validation's progress as
    that case: one batch begun and none processed.

    Args:
        checkpoint: the dictionary Lightning is about to write (edited in place).
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    progress = fit_loop.get("epoch_loop.val_loop.batch_progress") if fit_loop else None
    if not progress:
        return
    before = progress["total"]["ready"] - progress["current"]["ready"]  # earlier validations
    for key, done in (("total", before), ("current", 0)):
        progress[key].update(ready=done + 1, started=done + 1, processed=done, completed=done)
    progress["is_last_batch"] = False


def settle_validation_progress(checkpoint: dict[str, Any]) -> None:
    """Align the all-time counters of ``fit``'s validation batches in ``checkpoint`` with the
    batches completed, unless a validation is under way there (a batch of it begun and not
    completed).

    A validation cut short (inside a batch, or recorded by :func:`run_validation_again`)
    leaves one batch begun and never completed in these counters: Lightning resets only the
    per-validation counters when it runs that validation again, and from any later
    checkpoint written at a validation step would run a validation again on resume, a second
    one at a step already scored.

    Args:
        checkpoint: a checkpoint being written or restored (edited in place).
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    progress = fit_loop.get("epoch_loop.val_loop.batch_progress") if fit_loop else None
    if not progress:
        return
    current, total = progress["current"], progress["total"]
    if current["started"] > current["completed"] or current["ready"] > current["completed"]:
        return  # a validation cut short: Lightning runs it again on resume
    for key in ("ready", "started", "processed"):
        total[key] = total["completed"]


def resolve_ckpt_path(alias: str, checkpoint_dirs: Sequence[str | Path]) -> Path:
    """Turn ``"best"`` or ``"last"`` into a file, looking in the configured checkpoint folders.

    ``last`` is ``<dir>/last.ckpt``; ``best`` is the file of ``<dir>`` named by the
    ``best_model_path`` that the ``ModelCheckpoint`` callback recorded in ``last.ckpt``. The
    recorded path is absolute: only its file name is used, so a copied or moved run folder
    gives its own best checkpoint, never the file of the folder it was copied from.

    Raises:
        FileNotFoundError: naming the folders searched, if no such checkpoint exists (or the
            recorded best file is missing from the folder of its ``last.ckpt``); for
            ``best`` with only ``last.ckpt`` files that record none (a run stopped before its
            first validation), naming them and pointing to ``--ckpt_path last``.
    """
    searched = [Path(d) for d in checkpoint_dirs]
    missing = []
    unscored = []  # last.ckpt files that name no best checkpoint
    for directory in searched:
        last = directory / "last.ckpt"
        if not last.is_file():
            continue
        if alias == "last":
            return last
        checkpoint = load_checkpoint(last, mmap=True)  # callback states only
        unscored.append(last)
        for key, state in checkpoint.get("callbacks", {}).items():
            if key.startswith("ModelCheckpoint") and state.get("best_model_path"):
                best = directory / Path(state["best_model_path"]).name
                if best.is_file():
                    return best
                missing.append(
                    f"{last} names {best.name} as the best checkpoint, not in {directory}"
                )
    if missing:
        raise FileNotFoundError(
            f"--ckpt_path {alias}: {'; '.join(missing)}; pass the path of a .ckpt file"
        )
    if unscored:
        found = ", ".join(str(path) for path in unscored)
        raise FileNotFoundError(
            f"--ckpt_path best: {found} records no best checkpoint (the run stopped before its "
            "first validation, or its ModelCheckpoint keeps none); use --ckpt_path last, or "
            "resume the run (seq2seq fit --ckpt_path last) until it validates"
        )
    where = ", ".join(str(d) for d in searched) or "(no ModelCheckpoint dirpath configured)"
    raise FileNotFoundError(
        f"--ckpt_path {alias}: no {alias} checkpoint found in {where}; run `seq2seq fit` with the "
        "same config first, or pass the path of a .ckpt file"
    )


AVERAGED_FROM = "averaged_from"
"""Key that :func:`average_checkpoints` writes into its result: the list of averaged files."""


def average_checkpoints(paths: Sequence[str | Path], output: str | Path) -> Path:
    """Average the model parameters of several checkpoints into a new checkpoint.

    Floating-point tensors of ``state_dict`` are averaged element-wise (in float64, then cast
    back); everything else (tokenizer, model configuration, hyperparameters) is taken from the
    last checkpoint. Optimizer and loop states are dropped: the result is for evaluation and
    translation, not for resuming training; its :data:`AVERAGED_FROM` key lists the inputs
    (``seq2seq average --dir`` leaves such files out). Averaging the last checkpoints of a run
    is the practice of Vaswani et al. (2017), Section 6.1.

    The checkpoints must hold the same model: besides equal parameter names and shapes, the
    same SentencePiece model (the joint source/target vocabulary: two vocabularies of one size
    give equal shapes, but each id stands for another piece) and the same model settings
    (``checkpoint["seq2seq"]["model_config"]``, e.g. ``activation``, ``n_heads`` or
    ``norm_first``; the dropout rates, which only act in training, may differ).

    Args:
        paths: two or more checkpoints of the same model.
        output: file to write (missing parent folders are created); written to a temporary
            file beside it, then renamed into place (:func:`seq2seq.files.atomic_write`).

    Returns:
        The output path.

    Raises:
        ValueError: if no path is given.
        OSError: if ``output`` is a folder or its folder is not writable (checked before any
            checkpoint is read; see :func:`seq2seq.files.check_output_file`).
        CheckpointError: (a ``ValueError``) naming both files, if a checkpoint holds no model
            weights (:func:`check_model_checkpoint`), or its model settings, SentencePiece
            model (or whether it carries one), language pair (``data.src_lang``,
            ``data.tgt_lang``), parameter names or shapes differ from the first checkpoint's
            (naming the first difference); nothing is written then. Also
            raised by :func:`load_checkpoint` for a file that is no checkpoint.
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    output = Path(output)
    check_output_file(output, "output")
    total: dict[str, torch.Tensor] = {}
    last: dict[str, Any] = {}
    first: dict[str, Any] = {}
    for i, path in enumerate(paths):
        last = load_checkpoint(path)
        check_model_checkpoint(last, path)
        state = last["state_dict"]
        if i == 0:
            total = {
                k: v.double() if v.is_floating_point() else v.clone() for k, v in state.items()
            }
            names = set(state)
            first = last
            continue
        _check_same_model(paths[0], first, path, last)
        if set(state) != names:
            diff = sorted(set(state) ^ names)[:3]
            raise CheckpointError(f"{path} has other parameters than {paths[0]}: {diff}")
        for key, value in state.items():
            if value.shape != total[key].shape:
                raise CheckpointError(
                    f"{path}: parameter {key} has shape {tuple(value.shape)}, "
                    f"but {paths[0]} has {tuple(total[key].shape)}"
                )
            if value.is_floating_point():
                total[key] += value.double()
    reference = last["state_dict"]
    averaged = {
        k: (v / len(paths)).to(reference[k].dtype) if v.is_floating_point() else v
        for k, v in total.items()
    }
    result = {
        key: value
        for key, value in last.items()
        if key not in ("optimizer_states", "lr_schedulers", "loops", "callbacks")
    }
    result["state_dict"] = averaged
    result[AVERAGED_FROM] = [str(p) for p in paths]
    with atomic_write(output, "wb") as f:
        torch.save(result, f)
    return output


def language_pair(checkpoint: dict[str, Any]) -> tuple[str, str] | None:
    """``(src_lang, tgt_lang)`` of the data module a checkpoint was trained with (Lightning
    saves its settings as ``datamodule_hyper_parameters``), or ``None`` if it does not say."""
    settings = checkpoint.get("datamodule_hyper_parameters") or {}
    src, tgt = settings.get("src_lang"), settings.get("tgt_lang")
    return (src, tgt) if isinstance(src, str) and isinstance(tgt, str) else None


def _check_same_model(
    first_path: str | Path, first: dict[str, Any], path: str | Path, checkpoint: dict[str, Any]
) -> None:
    """Refuse to average ``checkpoint`` (from ``path``) with ``first`` (from ``first_path``)
    when their model settings or SentencePiece models differ.

    Model settings are compared where both checkpoints record them, leaving out the dropout
    rates; a SentencePiece model must be carried by both checkpoints or by neither, and be
    byte-for-byte the same.

    Raises:
        CheckpointError: naming both files and what differs.
    """
    from seq2seq.module import _NON_STRUCTURAL, CHECKPOINT_KEY

    extra_a = first.get(CHECKPOINT_KEY) or {}
    extra_b = checkpoint.get(CHECKPOINT_KEY) or {}
    config_a = extra_a.get("model_config") or {}
    config_b = extra_b.get("model_config") or {}
    differing = [
        f"{key}: {config_a[key]!r} in {first_path}, {config_b[key]!r} in {path}"
        for key in config_a
        if key in config_b and config_a[key] != config_b[key] and key not in _NON_STRUCTURAL
    ]
    if differing:
        raise CheckpointError(
            f"cannot average {path} with {first_path}: they were built with other model "
            f"settings ({'; '.join(differing)}); average checkpoints of one model"
        )
    pair_a, pair_b = language_pair(first), language_pair(checkpoint)
    if pair_a and pair_b and pair_a != pair_b:
        # One joint SentencePiece model serves both directions, so nothing else tells them apart.
        raise CheckpointError(
            f"cannot average {path} with {first_path}: they translate other directions "
            f"({'->'.join(pair_b)} and {'->'.join(pair_a)}); average checkpoints of one model"
        )
    blob_a, blob_b = extra_a.get("tokenizer"), extra_b.get("tokenizer")
    if blob_a is None and blob_b is None:
        return
    if blob_a is None or blob_b is None:
        has, lacks = (path, first_path) if blob_a is None else (first_path, path)
        raise CheckpointError(
            f"cannot average {path} with {first_path}: {has} carries a SentencePiece model "
            f"(the joint source/target tokenizer) and {lacks} carries none, so they cannot be "
            "checked to share a vocabulary; average checkpoints of one run"
        )
    if torch.equal(blob_a.cpu(), blob_b.cpu()):
        return
    difference = _tokenizer_difference(first_path, blob_a, path, blob_b)
    raise CheckpointError(
        f"cannot average {path} with {first_path}: they carry different SentencePiece models "
        f"(the joint source/target tokenizer): {difference}; average checkpoints trained with "
        "the same tokenizer (data.* settings)"
    )


def _tokenizer_difference(
    path_a: str | Path, blob_a: torch.Tensor, path_b: str | Path, blob_b: torch.Tensor
) -> str:
    """How two different serialized SentencePiece models (uint8 tensors) differ, in words:
    their sizes, the first id whose piece differs, or else their segmentation settings."""
    from seq2seq.data.tokenizer import Tokenizer

    a = Tokenizer.from_bytes(blob_a.cpu().numpy().tobytes(), name=f"the tokenizer of {path_a}")
    b = Tokenizer.from_bytes(blob_b.cpu().numpy().tobytes(), name=f"the tokenizer of {path_b}")
    if a.vocab_size != b.vocab_size:
        return f"{a.vocab_size} pieces in {path_a}, {b.vocab_size} in {path_b}"
    ids = list(range(a.vocab_size))
    for i, piece_a, piece_b in zip(ids, a.id_to_piece(ids), b.id_to_piece(ids), strict=True):
        if piece_a != piece_b:
            return (
                f"both have {a.vocab_size} pieces, but id {i} is {piece_a!r} in {path_a} and "
                f"{piece_b!r} in {path_b}, so the same ids stand for other pieces and the mean "
                "of the weights is meaningless"
            )
    return (
        f"both have the same {a.vocab_size} pieces, but other piece scores or normalization "
        "settings, so they segment text differently"
    )
