"""Safe checkpoint loading, ``best``/``last`` resolution and parameter averaging.

No Lightning: :class:`~seq2seq.translator.Translator` and ``seq2seq average`` use it without
the training stack. The format itself is :mod:`seq2seq.checkpoint.format`.
"""

from __future__ import annotations

import difflib
import pickle
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from seq2seq.checkpoint.format import (
    AVERAGED_FROM,
    CHECKPOINT_KEY,
    EMA_KEY,
    LIGHTNING_VERSION,
    ORIGIN,
    TRAINING_WEIGHTS,
    differing_settings,
    language_pairs,
    model_config,
    tensors_digest,
)
from seq2seq.files import atomic_write, check_output_file, folders_alike


class CheckpointError(ValueError):
    """A file given as a checkpoint cannot be used as one (not a checkpoint, or unsafe)."""


class IncompatibleCheckpointsError(CheckpointError):
    """Checkpoints that cannot be combined (averaged, or decoded as an ensemble): they hold
    other model settings, SentencePiece models or language pairs."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holds objects that only a full (code-executing) unpickler could load."""


def missing_checkpoint(path: str | Path, aliases: Sequence[str] = ()) -> str:
    """``checkpoint not found: PATH``, with the closest checkpoint file of its folder (or of
    ``aliases``, for a bare name) as a did-you-mean: ``lats.ckpt`` -> ``last.ckpt``."""
    path = Path(path)
    folder = path.parent
    # the names without .ckpt, which every candidate file shares
    candidates = {p.stem: str(p) for p in folder.glob("*.ckpt")} if folder.is_dir() else {}
    if folder == Path("."):
        candidates.update({alias: alias for alias in aliases})
    name = path.stem if path.suffix else path.name  # avg.ckp: avg
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.7)
    hint = f" (did you mean {candidates[close[0]]}?)" if close else ""
    return f"checkpoint not found: {path}{hint}"


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
        hint = ""
        if (path / "model.bin").is_file():  # CTranslate2's weights
            hint = (
                "; it holds a CTranslate2 model, which seq2seq translate and score read: give "
                "the checkpoint it was exported from"
            )
        elif (path / "config.json").is_file():
            hint = "; a Hugging Face folder becomes one with seq2seq import --input FOLDER"
        raise IsADirectoryError(f"{path} is a folder, not a checkpoint file (.ckpt){hint}")
    if not path.is_file():
        raise FileNotFoundError(missing_checkpoint(path))
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


def written_by(path: str | Path, marker: Callable[[Mapping[str, Any]], bool]) -> bool | None:
    """Whether the existing file ``path`` is a checkpoint that ``marker`` recognises (a
    command's own earlier output, which that command may replace); ``None`` when it is no
    readable checkpoint at all."""
    try:
        checkpoint = load_checkpoint(path, mmap=True)
    except Exception:  # not a checkpoint at all, or an unreadable one
        return None
    return bool(marker(checkpoint))


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


def resume_flags(checkpoint_dir: str | Path | None = None, logger_name: str | None = None) -> str:
    """The flags of ``seq2seq fit`` that resume a run: ``--ckpt_path last``, with the run's
    ``--checkpoint_dir DIR`` when it was given one (without it, the config's folder is read),
    and its ``--trainer.logger.init_args.name NAME`` when the command line gave one (the
    resumed run continues that TensorBoard folder)."""
    flags = "--ckpt_path last" + (f" --checkpoint_dir {checkpoint_dir}" if checkpoint_dir else "")
    return flags + (f" --trainer.logger.init_args.name {logger_name}" if logger_name else "")


def resolve_ckpt_path(
    alias: str, checkpoint_dirs: Sequence[str | Path], checkpoint_dir: str | Path | None = None
) -> Path:
    """Turn ``"best"`` or ``"last"`` into a file, looking in the configured checkpoint folders.

    ``last`` is ``<dir>/last.ckpt``; ``best`` is the file of ``<dir>`` named by the
    ``best_model_path`` that the ``ModelCheckpoint`` callback recorded in ``last.ckpt``. The
    recorded path is absolute: only its file name is used, so a copied or moved run folder
    gives its own best checkpoint, never the file of the folder it was copied from.
    ``checkpoint_dir`` (the command's ``--checkpoint_dir``, if given) is named in the advice.

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
        flags = resume_flags(checkpoint_dir)
        raise FileNotFoundError(
            f"--ckpt_path best: {found} records no best checkpoint (the run stopped before its "
            f"first validation, or its ModelCheckpoint keeps none); use {flags}, or resume the "
            f"run (seq2seq fit {flags}) until it validates"
        )
    where = ", ".join(map(_folder_text, searched)) or "(no ModelCheckpoint dirpath configured)"
    raise FileNotFoundError(
        f"--ckpt_path {alias}: no {alias} checkpoint found in {where}; run `seq2seq fit` with the "
        "same config first, or pass the path of a .ckpt file"
    )


def _folder_text(folder: Path) -> str:
    """``folder``, with ``(no such folder; did you mean X?)`` where it does not exist, and
    the folder a relative path is read from (a config's ``dirpath`` is relative to the folder
    the command runs in, not to the config)."""
    if folder.is_dir():
        return str(folder)
    alike = " or ".join(folders_alike(folder))
    here = "" if folder.is_absolute() else f" under {Path.cwd()}, where the command runs"
    return f"{folder} (no such folder{here}{f'; did you mean {alike}?' if alike else ''})"


#: Checkpoint entries for resuming a run, which an average leaves out.
_TRAINING_ONLY = (
    *("optimizer_states", "lr_schedulers", "loops", "callbacks"),
    *(TRAINING_WEIGHTS, EMA_KEY),
)


def average_checkpoints(paths: Sequence[str | Path], output: str | Path) -> Path:
    """Average the parameters of checkpoints, e.g. a run's last (Vaswani et al., 2017, Sec. 6.1).

    Floating-point tensors of ``state_dict`` are averaged element-wise (in float64, then cast
    back): for checkpoints written with :class:`seq2seq.callbacks.EMA`, their moving averages
    (their training weights are neither averaged nor kept). Everything else (tokenizer, model
    configuration, hyperparameters) is taken from the last checkpoint, the inputs' common
    :data:`~seq2seq.checkpoint.format.ORIGIN` where one records it; optimizer and loop
    states are dropped, so the result is for evaluation and translation, not for resuming. Its
    :data:`AVERAGED_FROM` key lists the inputs (``seq2seq average --dir`` leaves such files out).

    Args:
        paths: checkpoints of one model (parameter names and shapes, model settings,
            SentencePiece model, language pair: :func:`check_same_vocabulary`) and one
            :data:`~seq2seq.checkpoint.format.ORIGIN` where they record it; no two files of
            the same weights.
        output: file to write, atomically (:func:`seq2seq.files.atomic_write`); returned.

    Raises:
        ValueError: if no path is given. OSError: as :func:`seq2seq.files.check_output_file`.
        CheckpointError: naming both files and the difference, for inputs against ``paths``'
            rules, or a file that holds no model weights (nothing is written then).
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    output = Path(output)
    check_output_file(output, "output")
    total: dict[str, torch.Tensor] = {}
    last: dict[str, Any] = {}
    first: dict[str, Any] = {}
    origin: tuple[str | Path, str] | None = None  # the first recorded one, and its file
    digests: dict[str, tuple[str | Path, Any]] = {}  # of the weights read so far: file, step
    for i, path in enumerate(paths):
        last = load_checkpoint(path)
        check_model_checkpoint(last, path)
        state = last["state_dict"]
        if i > 0:
            _check_same_model(paths[0], first, path, last)
        origin = _check_same_origin(origin, path, last)
        digest = weights_digest(state)
        # A path named twice is the caller's choice (it weighs double); another file of the
        # same weights, such as last.ckpt beside the checkpoint of its step, is not.
        step = last.get("global_step", "?")
        if digest in digests and Path(digests[digest][0]) != Path(path):
            other, other_step = digests[digest]
            why = (
                " (their EMA weights, which the steps between them did not update)"
                if EMA_KEY in last and step != other_step
                else ""
            )
            raise CheckpointError(
                f"{path} (step {step}) holds the same weights as {other} (step {other_step})"
                f"{why}: averaging both would weigh them double; leave one out"
            )
        digests[digest] = (path, step)
        if i == 0:
            # Floating tensors are summed in float64, so that many inputs lose no precision;
            # the others (integer buffers) stay the first checkpoint's.
            total = {
                k: v.double() if v.is_floating_point() else v.clone() for k, v in state.items()
            }
            names = set(state)
            first = last
            continue
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
    # Tied weights (one tensor under several names: shared embeddings and output projection)
    # stay one tensor, which the file holds once, as the training checkpoints do.
    tied: dict[tuple, str] = {}
    for key, value in reference.items():
        if torch.is_tensor(value) and value.numel():
            where = (value.untyped_storage().data_ptr(), value.storage_offset(), value.stride())
            averaged[key] = averaged[tied.setdefault((*where, value.shape), key)]
    result = {key: value for key, value in last.items() if key not in _TRAINING_ONLY}
    result["state_dict"] = averaged
    result[AVERAGED_FROM] = [str(p) for p in paths]
    if origin is not None:  # also where the last input records none
        result[CHECKPOINT_KEY] = {**(result.get(CHECKPOINT_KEY) or {}), ORIGIN: origin[1]}
    with atomic_write(output, "wb") as f:
        torch.save(result, f)
    return output


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """:func:`~seq2seq.checkpoint.format.tensors_digest` of a ``state_dict``'s floating-point
    tensors, by name."""
    floating = {k: v for k, v in state.items() if torch.is_tensor(v) and v.is_floating_point()}
    return tensors_digest(sorted(floating.items()))


def _check_same_origin(
    seen: tuple[str | Path, str] | None, path: str | Path, checkpoint: dict[str, Any]
) -> tuple[str | Path, str] | None:
    """The first recorded :data:`ORIGIN` of the checkpoints read so far (file, origin), after
    refusing ``checkpoint`` if it records another one."""
    origin = (checkpoint.get(CHECKPOINT_KEY) or {}).get(ORIGIN)
    if origin is None:
        return seen
    if seen is None:
        return path, origin
    if seen[1] != origin:
        raise CheckpointError(
            f"{path} and {seen[0]} come from runs of different initial weights (origins "
            f"{origin} and {seen[1]}): the mean of unrelated networks' parameters is no "
            "model; average checkpoints of one run, or of runs started from one seed or one "
            "--init_from checkpoint"
        )
    return seen


def _check_same_model(
    first_path: str | Path, first: dict[str, Any], path: str | Path, checkpoint: dict[str, Any]
) -> None:
    """Refuse to average ``checkpoint`` (from ``path``) with ``first`` (from ``first_path``)
    when their model settings, language pairs or SentencePiece models differ.

    Model settings are compared by :func:`~seq2seq.checkpoint.format.differing_settings`; the
    rest is :func:`check_same_vocabulary`.

    Raises:
        IncompatibleCheckpointsError: naming both files and what differs.
    """
    differing = [
        f"{key}: {a!r} in {first_path}, {b!r} in {path}"
        for key, a, b in differing_settings(model_config(first), model_config(checkpoint))
    ]
    if differing:
        raise IncompatibleCheckpointsError(
            f"cannot average {path} with {first_path}: they were built with other model "
            f"settings ({'; '.join(differing)}); average checkpoints of one model"
        )
    check_same_vocabulary(first_path, first, path, checkpoint, "average")


def check_same_vocabulary(
    first_path: str | Path,
    first: dict[str, Any],
    path: str | Path,
    checkpoint: dict[str, Any],
    use: str,
) -> None:
    """Refuse to combine ``checkpoint`` (from ``path``) with ``first`` (from ``first_path``)
    when they translate other directions or carry other SentencePiece models.

    ``seq2seq average`` (weights) and ensembles (``seq2seq translate`` with several
    checkpoints: per-step log-probabilities) both need each id to stand for the same piece in
    every checkpoint, which equal shapes do not show: two vocabularies of one size give equal
    shapes, but each id stands for another piece. The language pairs (``data.src_lang``,
    ``data.tgt_lang``, or the set of ``data.pairs`` of a multilingual run) are compared where
    both record them; a SentencePiece model (the joint
    source/target vocabulary) must be carried by both checkpoints or by neither, and be
    byte-for-byte the same.

    Args:
        first_path, first: the reference checkpoint and its file (named in the error).
        path, checkpoint: the checkpoint to compare with it, and its file.
        use: what combining them is called in the error: ``"average"`` or ``"ensemble"``
            (``cannot average b.ckpt with a.ckpt: ...; average checkpoints trained with ...``).

    Raises:
        IncompatibleCheckpointsError: naming both files and what differs.
    """
    pairs_a, pairs_b = language_pairs(first), language_pairs(checkpoint)
    if pairs_a and pairs_b and set(pairs_a) != set(pairs_b):
        # One joint SentencePiece model serves both directions, so nothing else tells them apart.
        what = "one language pair" if len(pairs_a) == 1 else "the same language pairs"
        raise IncompatibleCheckpointsError(
            f"cannot {use} {path} with {first_path}: they translate other directions "
            f"({_directions(pairs_b)} and {_directions(pairs_a)}); {use} checkpoints of {what}"
        )
    blob_a = (first.get(CHECKPOINT_KEY) or {}).get("tokenizer")
    blob_b = (checkpoint.get(CHECKPOINT_KEY) or {}).get("tokenizer")
    if blob_a is None and blob_b is None:
        return
    if blob_a is None or blob_b is None:
        has, lacks = (path, first_path) if blob_a is None else (first_path, path)
        raise IncompatibleCheckpointsError(
            f"cannot {use} {path} with {first_path}: {has} carries a SentencePiece model "
            f"(the joint source/target tokenizer) and {lacks} carries none, so they cannot be "
            f"checked to share a vocabulary; {use} checkpoints trained with one tokenizer"
        )
    if torch.equal(blob_a.cpu(), blob_b.cpu()):
        return
    difference = _tokenizer_difference(first_path, blob_a, path, blob_b)
    raise IncompatibleCheckpointsError(
        f"cannot {use} {path} with {first_path}: they carry different SentencePiece models "
        f"(the joint source/target tokenizer): {difference}; {use} checkpoints trained with "
        "the same tokenizer (data.* settings)"
    )


def _directions(pairs: Sequence[tuple[str, str]]) -> str:
    """``de->en`` or ``de->en, fr->en`` (sorted), for messages."""
    return ", ".join(f"{src}->{tgt}" for src, tgt in sorted(pairs))


def _tokenizer_difference(
    path_a: str | Path, blob_a: torch.Tensor, path_b: str | Path, blob_b: torch.Tensor
) -> str:
    """How two different serialized SentencePiece models (uint8 tensors) differ, in words:
    their sizes, the first id whose piece differs, or else their segmentation settings."""
    from seq2seq.data.vocabulary import tokenizer_from_bytes

    a = tokenizer_from_bytes(blob_a.cpu().numpy().tobytes(), name=f"the tokenizer of {path_a}")
    b = tokenizer_from_bytes(blob_b.cpu().numpy().tobytes(), name=f"the tokenizer of {path_b}")
    if a.vocab_size != b.vocab_size:
        return f"{a.vocab_size} pieces in {path_a}, {b.vocab_size} in {path_b}"
    ids = list(range(a.vocab_size))
    for i, piece_a, piece_b in zip(ids, a.id_to_piece(ids), b.id_to_piece(ids), strict=True):
        if piece_a != piece_b:
            return (
                f"both have {a.vocab_size} pieces, but id {i} is {piece_a!r} in {path_a} and "
                f"{piece_b!r} in {path_b}, so the same ids stand for other pieces"
            )
    return (
        f"both have the same {a.vocab_size} pieces, but other piece scores or normalization "
        "settings, so they segment text differently"
    )
