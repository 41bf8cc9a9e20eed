"""The ``seq2seq translate``, ``seq2seq average`` and ``seq2seq export`` commands."""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from seq2seq.checkpoint import AVERAGED_FROM, average_checkpoints, load_checkpoint
from seq2seq.checkpoint.format import DECODING_SETTINGS, EMA_KEY, SAMPLING_SETTINGS
from seq2seq.data.corpus import decode_lines, read_lines
from seq2seq.files import atomic_write, check_output_file, stream_errors
from seq2seq.spelling import did_you_mean


def _plain(doc: str | None) -> str:
    """A docstring as ``--help`` text: without reStructuredText's double back-quotes."""
    return (doc or "").replace("``", "")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, as those of ``fit``: ``seq2seq translate: error:
    ...`` (exit status 2), an unrecognised option with the closest spellings of this command's
    options (``--beam-size``: did you mean ``--beam_size``?); ``--help`` lists the options."""

    def error(self, message: str):
        prefix = "unrecognized arguments: "
        unknown = [a for a in message.removeprefix(prefix).split() if a.startswith("-")]
        if message.startswith(prefix) and unknown:
            name = unknown[0].split("=", 1)[0]
            known = [o for action in self._actions for o in action.option_strings]
            underscored = "--" + name.lstrip("-").replace("-", "_")  # fairseq's --beam-size
            hint = f" (did you mean {underscored}?)" if underscored in known else ""
            message = f"unrecognized option {name}" + (hint or did_you_mean(name, known))
        self.exit(2, f"{self.prog}: error: {message}\n")


def translate(argv: Sequence[str]) -> None:
    """``seq2seq translate --ckpt_path model.ckpt [--input F] [--output F] [--beam_size K]``.

    Reads one sentence per line (stdin by default), writes one translation per line (stdout by
    default) in input order; with ``--scores``, ``score<TAB>text`` lines; with ``--n_best N > 1``
    ``index<TAB>score<TAB>text`` lines, N per input sentence (``index`` the 0-based input
    line). A score is the hypothesis's length-penalised log-probability (higher is better). A
    line with no token the model knows (empty, blank, or only characters outside its
    vocabulary) is translated as empty text scored 0.0000, in N rows with ``--n_best N`` like
    any other line. ``--sampling`` (or any sampling option) samples instead of searching:
    reproducible for a ``--seed``, and a line's samples do not depend on the other lines;
    ``--n_samples N > 1`` writes N ``index<TAB>score<TAB>text`` rows per line, as ``--n_best``.
    ``--prefix_file`` forces the start of each translation.
    Several checkpoints decode as an ensemble: each step takes the mean of the
    models' log-probabilities (renormalised); they must carry the same SentencePiece model and
    language pair, and the decoding settings are the first checkpoint's.
    """
    parser = _Parser(
        prog="seq2seq translate", description=_plain(translate.__doc__), allow_abbrev=False
    )
    parser.add_argument(
        "--ckpt_path",
        required=True,
        nargs="+",
        help="checkpoint written by seq2seq fit, or a folder of seq2seq export --format "
        "ctranslate2 (translated through CTranslate2); several checkpoints decode as an "
        "ensemble (the mean of their log-probabilities; same SentencePiece model and language "
        "pair; decoding settings from the first)",
    )
    parser.add_argument(
        "--input", default="-", help="source file, one sentence per line (- = stdin)"
    )
    parser.add_argument("--output", default="-", help="output file (- = stdout)")
    parser.add_argument(
        "--beam_size",
        type=int,
        default=None,
        help="beam size, 1 = greedy (default: the checkpoint's model.beam_size)",
    )
    parser.add_argument(
        "--n_best", type=int, default=1, help="hypotheses per sentence (default: 1)"
    )
    parser.add_argument(
        "--scores",
        action="store_true",
        help="write score<TAB>text lines (--n_best above 1 always writes scores)",
    )
    parser.add_argument(
        "--length_penalty",
        type=float,
        default=None,
        help="length penalty alpha (default: the checkpoint's model.length_penalty)",
    )
    parser.add_argument(
        "--length_penalty_form",
        choices=("fairseq", "gnmt"),
        default=None,
        help="score / len**alpha (fairseq) or score / ((5 + len) / 6)**alpha (gnmt) (default: "
        "the checkpoint's model.length_penalty_form)",
    )
    parser.add_argument(
        "--max_len_a",
        type=float,
        default=None,
        help="a in max_len = a * source tokens + b (default: the checkpoint's model.max_len_a)",
    )
    parser.add_argument(
        "--max_len_b",
        type=int,
        default=None,
        help="b in max_len = a * source tokens + b (default: the checkpoint's model.max_len_b)",
    )
    parser.add_argument(
        "--min_len",
        type=int,
        default=None,
        help="no end of sentence before this many tokens (default: the checkpoint's model.min_len)",
    )
    parser.add_argument(
        "--no_repeat_ngram_size",
        type=int,
        default=None,
        help="ban repeating an n-gram of this size within a translation, 0 = off (default: the "
        "checkpoint's model.no_repeat_ngram_size)",
    )
    parser.add_argument(
        "--prefix_file",
        default=None,
        help="target prefixes, one per input line (an empty line = none): each translation "
        "starts with its prefix and continues after it",
    )
    parser.add_argument(
        "--sampling",
        action="store_true",
        default=None,
        help="sample instead of beam search (any of the sampling options below implies it)",
    )
    parser.add_argument(
        "--sampling_topk",
        type=int,
        default=None,
        help="sample from the K most probable tokens, 0 = all (default: 0)",
    )
    parser.add_argument(
        "--sampling_topp",
        type=float,
        default=None,
        help="sample from the smallest set of most probable tokens whose probability reaches "
        "P (nucleus sampling), in (0, 1], 1 = off (default: 1)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="divides the log-probabilities before sampling, > 0 (default: 1)",
    )
    parser.add_argument(
        "--n_samples",
        type=int,
        default=None,
        help="samples per sentence; above 1, index<TAB>score<TAB>text rows (default: 1)",
    )
    parser.add_argument(
        "--seed",
        dest="sampling_seed",
        type=int,
        default=None,
        help="seed of the samples: the same seed gives the same output (default: 0)",
    )
    parser.add_argument(
        "--max_tokens", type=int, default=4096, help="source tokens per batch (default: 4096)"
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: auto)")
    args = parser.parse_args(list(argv))

    from seq2seq.translator import Translator

    decoding = {
        name: getattr(args, name)
        for name in ("beam_size", *DECODING_SETTINGS)
        if getattr(args, name) is not None
    }
    sampled = [
        "--seed" if name == "sampling_seed" else f"--{name}"
        for name in SAMPLING_SETTINGS
        if getattr(args, name) is not None
    ]
    sampling = bool(args.sampling or sampled)
    if sampling:
        decoding["sampling"] = True
        if args.beam_size is not None and args.beam_size > 1:
            given = (sampled or ["--sampling"])[0]
            parser.error(f"--beam_size {args.beam_size} with {given}: sampling does not search")
        if args.n_best > 1:
            parser.error(
                f"--n_best {args.n_best} applies to beam search; with sampling give "
                f"--n_samples {args.n_best}"
            )
    for name in ("beam_size", "n_best", "max_tokens", "n_samples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    if args.beam_size is not None and args.n_best > args.beam_size:
        parser.error(f"--n_best {args.n_best} exceeds --beam_size {args.beam_size}")
    if args.device is not None:
        _check_device(parser, args.device)
    for name in ("length_penalty", "max_len_a", "temperature", "sampling_topp"):
        value = getattr(args, name)
        if value is not None and not math.isfinite(value):
            parser.error(f"--{name} must be a finite number, got {value}")
    for name in ("max_len_a", "max_len_b", "min_len", "no_repeat_ngram_size", "sampling_topk"):
        value = getattr(args, name)
        if value is not None and value < 0:
            parser.error(f"--{name} must be >= 0, got {value}")
    if args.temperature is not None and args.temperature <= 0:
        parser.error(f"--temperature must be > 0, got {args.temperature}")
    if args.sampling_topp is not None and not 0 < args.sampling_topp <= 1:
        parser.error(f"--sampling_topp must lie in (0, 1] (1 = off), got {args.sampling_topp}")
    if args.output != "-":
        output = Path(args.output)
        _check_output(parser, output)
        if args.input != "-" and output.exists() and output.samefile(args.input):
            parser.error(f"--output {args.output} is the input file; give another file name")
        for ckpt in args.ckpt_path:
            if output.exists() and Path(ckpt).exists() and output.samefile(ckpt):
                parser.error(f"--output {args.output} is the checkpoint; give another file name")
    source = Path(args.input)
    if args.input != "-" and (source.is_dir() or not source.exists()):  # a pipe is fine
        what = "is a folder" if source.is_dir() else "not found"
        raise FileNotFoundError(f"--input {args.input}: {what} (a file, or - for stdin)")
    prefix_source = Path(args.prefix_file) if args.prefix_file is not None else None
    if prefix_source is not None and (prefix_source.is_dir() or not prefix_source.exists()):
        what = "is a folder" if prefix_source.is_dir() else "not found"
        parser.error(f"--prefix_file {args.prefix_file}: {what}")
    for ckpt in args.ckpt_path:
        if ckpt in ("best", "last") and not Path(ckpt).exists():
            raise FileNotFoundError(
                f"checkpoint not found: {ckpt}; the aliases best and last work with "
                "--config in seq2seq fit/validate/test/predict, translate needs the path of a "
                "checkpoint file (e.g. checkpoints/multi30k_de_en/last.ckpt)"
            )
    if len(args.ckpt_path) > 1:
        translator = _ensemble_translator(parser, args.ckpt_path, args, decoding)
    else:
        translator = Translator.from_checkpoint(
            args.ckpt_path[0], device=args.device, max_tokens=args.max_tokens, **decoding
        )
    beam = (
        translator.beam_size
        if Path(args.ckpt_path[0]).is_dir()  # a CTranslate2 folder (seq2seq.export)
        else translator.module.hparams.beam_size
    )
    if not Path(args.ckpt_path[0]).is_dir() and not sampling:  # the checkpoint's model.sampling
        sampling = bool(translator.module.hparams.sampling)
    settings = (
        translator.settings if Path(args.ckpt_path[0]).is_dir() else translator.module.hparams
    )
    n_samples = args.n_samples or settings.get("n_samples", 1)
    if args.n_best > beam and not sampling:
        parser.error(
            f"--n_best {args.n_best} exceeds the beam size {beam} (the checkpoint's); "
            f"pass --beam_size {args.n_best} or more"
        )
    # Invalid UTF-8 is reported with the file (or <stdin>) and line; CRs of CRLF are removed.
    if args.input == "-":
        lines = decode_lines(sys.stdin.buffer.read(), "<stdin>")
    else:
        lines = read_lines(args.input)
    prefixes = None
    if prefix_source is not None:
        prefixes = read_lines(prefix_source)
        if len(prefixes) != len(lines):
            where = "<stdin>" if args.input == "-" else args.input
            parser.error(
                f"--prefix_file {args.prefix_file} has {len(prefixes)} lines but the input "
                f"{where} has {len(lines)}; give one prefix per input line (an empty line "
                "for none)"
            )
    options = {"prefixes": prefixes} if prefixes is not None else {}
    results = translator.translate(lines, n_best=args.n_best, return_scores=args.scores, **options)
    rows = args.n_best > 1 or (sampling and n_samples > 1)
    if not rows and args.n_best == 1 and not args.scores:
        out_lines = list(results)
    elif not rows:
        out_lines = [f"{hyps[0][1]:.4f}\t{hyps[0][0]}" for hyps in results]
    else:
        out_lines = [
            f"{i}\t{score:.4f}\t{hyp}" for i, hyps in enumerate(results) for hyp, score in hyps
        ]
    body = "".join(line + "\n" for line in out_lines)
    if args.output == "-":
        with stream_errors("standard output"):
            sys.stdout.write(body)
            sys.stdout.flush()
    else:
        with atomic_write(args.output, "w", encoding="utf-8") as f:
            f.write(body)


def _ensemble_translator(
    parser: argparse.ArgumentParser, paths: list[str], args: argparse.Namespace, decoding: dict
):
    """The :class:`~seq2seq.translator.Translator` of several ``--ckpt_path`` checkpoints (an
    ensemble), each refusal a usage error naming the files: a missing file, a folder (an
    exported CTranslate2 model translates alone), a file named twice, checkpoints with other
    SentencePiece models or language pairs."""
    from seq2seq.checkpoint import IncompatibleCheckpointsError
    from seq2seq.checkpoint.models import check_ensemble_paths
    from seq2seq.translator import Translator

    try:
        check_ensemble_paths(paths)  # before any checkpoint is read
    except (OSError, ValueError) as err:
        parser.error(f"--ckpt_path: {err}")
    try:
        return Translator.from_checkpoint(
            paths, device=args.device, max_tokens=args.max_tokens, **decoding
        )
    except IncompatibleCheckpointsError as err:
        parser.error(f"--ckpt_path: {err}")


def _check_output(parser: argparse.ArgumentParser, output: Path) -> None:
    """Refuse an ``--output`` that is a folder or could not be written (missing folders are
    created; :func:`seq2seq.files.check_output_file`), before any checkpoint is read."""
    try:
        check_output_file(output, "--output")
    except OSError as err:
        parser.error(str(err))


def _check_device(parser: argparse.ArgumentParser, name: str) -> None:
    """Refuse a ``--device`` that PyTorch does not know or that this machine lacks."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        parser.error(f"--device {name}: not a device (cpu, cuda, cuda:1, mps, ...)")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {name}: no CUDA device is available on this machine")
    if device.type == "cuda" and device.index is not None:
        if device.index >= torch.cuda.device_count():
            parser.error(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        parser.error(f"--device {name}: MPS is not available on this machine")


def average(argv: Sequence[str]) -> None:
    """``seq2seq average --inputs a.ckpt b.ckpt ... --output avg.ckpt`` or ``--dir D --last N``.

    Writes the element-wise mean of the checkpoints' parameters. The checkpoints must hold the
    same model: the same SentencePiece model (tokenizer) and model settings (dropout aside),
    parameter names and shapes. ``--inputs`` must name each file once, and ``--output`` must
    not be one of them; an existing ``--output`` is replaced only if ``seq2seq average`` wrote
    it. With ``--dir``, the newest checkpoints are those of the latest training steps (the
    ``global_step`` each checkpoint records; file times only break ties and order files that
    record no step, as older than those that do), so copying or touching the files changes
    nothing; ``last.ckpt``, the ``--output`` file and checkpoints written by ``seq2seq
    average`` (weights only) are not counted among them, nor a second name (link) of a file.
    The files taken are named, with the validation score each recorded (that of the run's
    ``ModelCheckpoint``); when those scores differ widely (the worst below half the best, or
    for a score that falls as it improves, such as a loss, above twice the best) a warning
    says so, as a weak checkpoint drags the average down.
    """
    parser = _Parser(
        prog="seq2seq average", description=_plain(average.__doc__), allow_abbrev=False
    )
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
    _check_output(parser, output)
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
    try:
        checkpoint = load_checkpoint(output, mmap=True)
    except Exception:  # not a checkpoint at all, or an unreadable one
        what = "is not a checkpoint"
    else:
        if AVERAGED_FROM in checkpoint:
            return  # an earlier average's output
        what = "is a training checkpoint"
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
        )
    return chosen[::-1]


def _training_step(checkpoint: dict) -> int | None:
    """The training step a checkpoint was saved at (Lightning's ``global_step``), if any."""
    step = checkpoint.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    return step


def export(argv: Sequence[str]) -> None:
    """``seq2seq export --ckpt_path model.ckpt --format {ctranslate2,huggingface} --output DIR``.

    Writes a model folder for a deployment engine from a checkpoint alone: a CTranslate2
    folder (``seq2seq translate --ckpt_path DIR`` translates through it; ``--quantization``
    takes CTranslate2's weight types) or a Hugging Face Transformers folder
    (``AutoModelForSeq2SeqLM`` and ``AutoTokenizer`` load it). A setting the engine cannot
    represent is refused by name before anything is written; an existing ``--output`` folder
    is replaced only if ``seq2seq export`` wrote it. Needs the export extra (pip install -e
    ".[export]").
    """
    from seq2seq.export.ctranslate2 import QUANTIZATIONS

    parser = _Parser(prog="seq2seq export", description=_plain(export.__doc__), allow_abbrev=False)
    parser.add_argument("--ckpt_path", required=True, help="checkpoint written by seq2seq fit")
    parser.add_argument(
        "--format", required=True, choices=("ctranslate2", "huggingface"), help="target engine"
    )
    parser.add_argument("--output", required=True, help="model folder to write")
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="ctranslate2 only: weight type (default: none = float32)",
    )
    args = parser.parse_args(list(argv))
    if args.quantization not in (None, "none", "float32") and args.format != "ctranslate2":
        parser.error(f"--quantization {args.quantization} applies to --format ctranslate2 only")
    from seq2seq.export.common import check_output_folder

    try:
        check_output_folder(args.output)
    except OSError as err:
        parser.error(str(err))
    try:
        if args.format == "ctranslate2":
            from seq2seq.export.ctranslate2 import export_ctranslate2

            written = export_ctranslate2(args.ckpt_path, args.output, args.quantization)
        else:
            from seq2seq.export.huggingface import export_huggingface

            written = export_huggingface(args.ckpt_path, args.output)
    except ModuleNotFoundError as err:
        if err.name not in ("ctranslate2", "transformers"):
            raise
        parser.error(str(err))  # the extra to install, in one line
    print(f"exported {args.ckpt_path} to {written} ({args.format})")
