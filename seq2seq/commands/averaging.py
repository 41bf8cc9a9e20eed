"""``seq2seq average``: the element-wise mean of checkpoints' parameters."""

from __future__ import annotations

import argparse
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from seq2seq.checkpoint import AVERAGED_FROM, average_checkpoints, load_checkpoint
from seq2seq.checkpoint.format import EMA_KEY
from seq2seq.checkpoint.load import written_by
from seq2seq.commands.parsing import Parser, check_output, plain

__all__ = ["average"]


def average(argv: Sequence[str]) -> None:
    """``seq2seq average --inputs a.ckpt b.ckpt ... --output avg.ckpt`` or ``--dir D --last N``.

    Writes the element-wise mean of the checkpoints' parameters. The checkpoints must hold the same
    model: the same SentencePiece model (tokenizer) and model settings (dropout aside), parameter
    names and shapes, and descend from the same initial weights (one run, or runs of one seed or
    one ``--init_from`` checkpoint; checkpoints written before runs recorded it are not compared);
    two files of the same weights (``last.ckpt`` beside the checkpoint of the same step) are
    refused, as a file named twice is. ``--inputs`` must name each file once, and ``--output`` must
    not be one of them; an existing ``--output`` is replaced only if ``seq2seq average`` wrote it.
    With ``--dir``, the newest checkpoints are those of the latest training steps (the
    ``global_step`` each checkpoint records; file times only break ties and order files that record
    no step, as older than those that do), so copying or touching the files changes nothing;
    ``last.ckpt``, the ``--output`` file and checkpoints written by ``seq2seq average`` (weights
    only) are not counted among them, nor a second name (link) of a file. The files taken are
    named, with the validation score each recorded (that of the run's ``ModelCheckpoint``); when
    those scores differ widely (the worst below half the best, or for a score that falls as it
    improves, such as a loss, above twice the best) a warning says so, as a weak checkpoint drags
    the average down.
    """
    parser = Parser(prog="seq2seq average", description=plain(average.__doc__), allow_abbrev=False)
    parser.add_argument("--inputs", nargs="+", default=None, help="checkpoints to average")
    parser.add_argument(
        "--dir",
        default=None,
        help="folder whose newest checkpoints to average: those of the latest training steps, "
        "by the global_step each records, not by file time (last.ckpt, the --output file and "
        "averaged checkpoints excluded)",
    )
    parser.add_argument(
        "--last",
        type=int,
        default=None,
        help="with --dir: how many (those of the latest training steps)",
    )
    parser.add_argument("--output", required=True, help="averaged checkpoint to write")
    args = parser.parse_args(list(argv))
    if args.inputs and (args.dir or args.last is not None):
        parser.error("give either --inputs or --dir with --last, not both")
    if args.last is not None and args.last < 1:
        parser.error(f"--last must be >= 1, got {args.last}")
    output = Path(args.output)
    check_output(parser, output)
    if args.inputs:
        paths = [Path(p) for p in args.inputs]
        for path in paths:
            if _same_file(path, output):
                parser.error(
                    f"--output {args.output} is one of the --inputs ({path}); averaging would "
                    "overwrite it: give another file name"
                )
        for i, path in enumerate(paths):
            for earlier in paths[:i]:
                if _same_file(earlier, path):
                    what = (
                        f"names {path} twice"
                        if str(earlier) == str(path)
                        else f"{earlier} and {path} are the same file"
                    )
                    parser.error(
                        f"--inputs {what}; give each checkpoint once (averaging a file twice "
                        "would weigh it double)"
                    )
    elif args.dir and args.last:
        if not Path(args.dir).is_dir():
            parser.error(f"--dir {args.dir} is not a folder")
        paths = _newest_checkpoints(parser, Path(args.dir), args.last, output)
    else:
        parser.error("give --inputs, or --dir with --last")
    _check_replaceable(parser, output)
    scores = {path: _recorded_score(path) for path in paths}
    _warn_uneven_scores(scores)
    written = average_checkpoints(paths, output)
    noun = "checkpoint" if len(paths) == 1 else "checkpoints"
    taken = [
        str(path) if score is None else f"{path} ({score[0]} {score[2]:.2f})"
        for path, score in scores.items()
    ]
    ema = [path for path in paths if EMA_KEY in load_checkpoint(path, mmap=True)]
    if len(ema) == len(paths):
        which = " (their EMA weights)"
    elif ema:
        which = " (the EMA weights of " + ", ".join(map(str, ema)) + "; the others' weights)"
    else:
        which = ""
    print(f"averaged {len(paths)} {noun}{which} into {written}: " + ", ".join(taken))


def _recorded_score(path: Path) -> tuple[str, str, float] | None:
    """The score of this file that the run's ``ModelCheckpoint`` recorded in it (its entry of
    ``best_k_models``), as ``(monitor, mode, value)`` (mode ``"max"`` or ``"min"``), or None if
    none did: ``last.ckpt`` and other files that ModelCheckpoint did not keep by their score
    have none (its ``current_score`` is that of the last checkpoint it kept, not theirs)."""
    checkpoint = load_checkpoint(path, mmap=True)
    callbacks = checkpoint.get("callbacks")
    for key, state in (callbacks if isinstance(callbacks, dict) else {}).items():
        if not (isinstance(key, str) and key.startswith("ModelCheckpoint")):
            continue
        if not isinstance(state, dict) or not state.get("monitor"):
            continue
        kept = state.get("best_k_models")
        own = [v for k, v in (kept if isinstance(kept, dict) else {}).items() if _names(k, path)]
        if not own:
            continue
        score = own[0]
        try:
            value = float(score)
        except (TypeError, ValueError, RuntimeError):
            continue
        if math.isfinite(value):
            return str(state["monitor"]), "min" if "'mode': 'min'" in key else "max", value
    return None


def _names(recorded: str, path: Path) -> bool:
    """Whether a path recorded by ModelCheckpoint names ``path`` (the file may have moved with
    its folder: the same name then counts)."""
    recorded_path = Path(recorded)
    if recorded_path.name != path.name:
        return False
    return not recorded_path.exists() or _same_file(recorded_path, path)


def _warn_uneven_scores(scores: dict[Path, tuple[str, str, float] | None]) -> None:
    """Warns when the recorded scores of the checkpoints to average differ widely: the worst
    below half the best (``mode`` max, e.g. val/bleu) or above twice the best (``mode`` min,
    e.g. val/loss). Checkpoints without a score, or with scores of different monitors, are
    not compared."""
    recorded = [score for score in scores.values() if score is not None]
    if len(recorded) < 2 or len(recorded) < len(scores):
        return
    monitors = {(monitor, mode) for monitor, mode, _ in recorded}
    if len(monitors) != 1:
        return
    ((monitor, mode),) = monitors
    values = [value for *_, value in recorded]
    best, worst = (max(values), min(values)) if mode == "max" else (min(values), max(values))
    if best <= 0 or (worst >= best / 2 if mode == "max" else worst <= best * 2):
        return
    rule = "below half" if mode == "max" else "above twice"
    listed = ", ".join(f"{path.name} {score[2]:.2f}" for path, score in scores.items())
    warnings.warn(
        f"the checkpoints to average differ widely in {monitor} (the worst, {worst:.2f}, is "
        f"{rule} the best, {best:.2f}): {listed}; a weak checkpoint drags the average down, "
        "so average fewer (--last N) or name the good ones with --inputs",
        UserWarning,
        stacklevel=2,
    )


def _check_replaceable(parser: argparse.ArgumentParser, output: Path) -> None:
    """Refuse an existing ``--output`` unless ``seq2seq average`` wrote it: a training checkpoint
    (say ``last.ckpt`` or the best one) or any other file there would be lost."""
    if not output.exists():
        return
    own = written_by(output, lambda checkpoint: AVERAGED_FROM in checkpoint)
    if own:
        return  # an earlier average's output
    what = "is not a checkpoint" if own is None else "is a training checkpoint"
    parser.error(
        f"--output {output} exists and {what}; averaging would replace it: give another file "
        "name (only a file written by seq2seq average is replaced)"
    )


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name the same file (through links too, when both exist)."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _newest_checkpoints(
    parser: argparse.ArgumentParser, directory: Path, count: int, output: Path
) -> list[Path]:
    """The ``count`` newest ``*.ckpt`` files of ``directory``, oldest first, leaving out
    ``last.ckpt``, ``output`` and checkpoints that ``seq2seq average`` wrote (found by the
    :data:`~seq2seq.checkpoint.AVERAGED_FROM` key).

    Newest means of the latest training step: the ``global_step`` that Lightning records in
    each checkpoint (read with the file memory-mapped, so the weights are not read), not the
    file's modification time, which a copy (``cp -r``) or ``touch`` changes. The modification
    time only breaks ties (then the name), and orders the files that record no step, which
    count as older than any that does. A file reached by two names (a link beside its
    target) is taken once, by the name that is not a link.
    """
    candidates = [
        p for p in directory.glob("*.ckpt") if p.name != "last.ckpt" and not _same_file(p, output)
    ]
    seen: set[tuple[int, int]] = set()
    ranked: list[tuple[tuple[bool, int, float, str], Path]] = []
    averaged: list[Path] = []
    for path in sorted(candidates, key=lambda p: (p.is_symlink(), p.name)):
        info = path.stat()
        if (info.st_dev, info.st_ino) in seen:
            continue
        seen.add((info.st_dev, info.st_ino))
        checkpoint = load_checkpoint(path, mmap=True)
        if AVERAGED_FROM in checkpoint:
            averaged.append(path)
            continue
        step = _training_step(checkpoint)
        ranked.append(((step is not None, step or 0, info.st_mtime, path.name), path))
    ranked.sort(key=lambda item: item[0], reverse=True)
    chosen = [path for _, path in ranked[:count]]
    if len(chosen) < count:
        skipped = f" ({', '.join(p.name for p in averaged)})" if averaged else ""
        parser.error(
            f"--last {count}: {directory} holds {len(chosen)} checkpoint file(s) to average; "
            "last.ckpt (the latest training state), the --output file and checkpoints written "
            f"by seq2seq average{skipped} are never averaged"
            + (f"; --last {len(chosen)} averages those it holds" if len(chosen) > 1 else "")
        )
    return chosen[::-1]


def _training_step(checkpoint: dict) -> int | None:
    """The training step a checkpoint was saved at (Lightning's ``global_step``), if any."""
    step = checkpoint.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    return step
