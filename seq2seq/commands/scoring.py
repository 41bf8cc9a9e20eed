"""``seq2seq score``: the model's log-probability of given translations, with a checkpoint
alone (:meth:`seq2seq.translator.Translator.score`)."""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from seq2seq.commands.output import write_parts
from seq2seq.commands.parsing import (
    Parser,
    add_checkpoint_dir,
    check_device,
    check_output,
    check_output_apart,
    checkpoint_alias,
    ensemble_translator,
    plain,
)
from seq2seq.data.formats import iter_lines, iter_stream_lines
from seq2seq.machine import warn_emulated_bfloat16

__all__ = ["score"]

#: Pairs read, scored and written at a time.
BUFFER_SIZE = 10_000


def score(argv: Sequence[str]) -> None:
    """``seq2seq score --ckpt_path model.ckpt --src F --tgt F [--output F] [--normalize]``.

    Writes, for each line pair of ``--src`` and ``--tgt`` (plain or gzipped, line-aligned), the
    log-probability the model gives the target as a translation of the source, one number per
    line in input order (stdout by default): the natural-log probabilities of the target's
    pieces and of its end summed (``--normalize``: their mean per piece, Marian's
    ``marian-scorer --normalize``), teacher-forced, without any decoding rule
    (:mod:`seq2seq.text_scoring`); higher is more probable. fairseq's ``--score-reference``
    and CTranslate2's ``score_batch`` compute the same. ``--token_scores`` writes each
    piece with its log-probability after the score. A target longer than the model's
    ``max_positions - 1`` pieces scores ``nan`` (warned about, naming the lines); a source
    above ``max_positions`` is cut, as ``translate`` cuts it. Several checkpoints score as an
    ensemble (the renormalised mean of their log-probabilities); a folder of ``seq2seq export
    --format ctranslate2`` scores through CTranslate2's ``score_batch``. Used to filter a corpus
    (cross-entropy filtering), rerank n-best lists or compare references; to filter, rank by
    ``--normalize``: the sum favours short targets (an empty one scores its end alone).
    """
    parser = Parser(prog="seq2seq score", description=plain(score.__doc__), allow_abbrev=False)
    parser.add_argument(
        "--ckpt_path",
        required=True,
        nargs="+",
        help="checkpoint written by seq2seq fit, average or import, or a folder of seq2seq "
        "export --format ctranslate2 (scored by CTranslate2's score_batch); several "
        "checkpoints score as an ensemble; best or last with --checkpoint_dir",
    )
    add_checkpoint_dir(parser)
    parser.add_argument(
        "--src", required=True, help="source file, one sentence per line (- = stdin)"
    )
    parser.add_argument(
        "--tgt", required=True, help="target file, one translation per line (- = stdin)"
    )
    parser.add_argument("--output", default="-", help="output file (- = stdout)")
    parser.add_argument(
        "--normalize",
        action="store_true",
        help="write the mean log-probability per target piece (end included), not the sum",
    )
    parser.add_argument(
        "--token_scores",
        action="store_true",
        help="after the score, a tab and each piece:log-probability, separated by spaces",
    )
    parser.add_argument(
        "--tgt_lang",
        default=None,
        help="target language of a model with language tokens, as for seq2seq translate",
    )
    parser.add_argument(
        "--src_lang", default=None, help="source language (NLLB deu_Latn), as for translate"
    )
    parser.add_argument(
        "--max_tokens", type=int, default=4096, help="padded tokens per batch (default: 4096)"
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "fp32", "bf16"],
        default="float32",
        help="compute type, as for seq2seq translate (default: float32)",
    )
    args = parser.parse_args(list(argv))
    if args.max_tokens < 1:
        parser.error(f"--max_tokens must be >= 1, got {args.max_tokens}")
    if args.src == "-" and args.tgt == "-":
        parser.error("--src - and --tgt - both read stdin: give one of them as a file")
    for flag in ("src", "tgt"):
        path = Path(getattr(args, flag))
        if getattr(args, flag) != "-" and (path.is_dir() or not path.exists()):
            what = "is a folder" if path.is_dir() else "not found"
            parser.error(f"--{flag} {path}: {what} (a text file, plain or gzipped, or - for stdin)")
    if args.device is not None:
        check_device(parser, args.device)
    paths = [checkpoint_alias(parser, ckpt, args.checkpoint_dir) for ckpt in args.ckpt_path]
    if args.output != "-":
        check_output(parser, Path(args.output))
        inputs = {"the --src file": [args.src], "the --tgt file": [args.tgt]}
        check_output_apart(parser, args.output, inputs | {"the checkpoint": paths})
    if Path(paths[0]).is_dir() and args.dtype not in ("float32", "fp32"):
        parser.error(
            f"--dtype {args.dtype}: a CTranslate2 folder computes in the type it was exported "
            "with (seq2seq export --quantization)"
        )
    try:  # read through before any work: a bad line or another length is found at once
        held = {flag: _held_lines(getattr(args, flag)) for flag in ("src", "tgt")}
        counts = [
            len(lines) if lines is not None else sum(1 for _ in iter_lines(getattr(args, flag)))
            for flag, lines in held.items()
        ]
    except ValueError as err:
        raise ValueError(f"{err} Nothing is scored.") from err
    if counts[0] != counts[1]:
        parser.error(
            f"--src {args.src} has {counts[0]} lines but --tgt {args.tgt} has {counts[1]}; "
            "give line-aligned files (one translation per source line)"
        )
    if len(paths) > 1:
        translator = ensemble_translator(
            parser, paths, args.device, args.max_tokens, args.dtype, {}
        )
    else:
        from seq2seq.translator import Translator

        translator = Translator.from_checkpoint(
            paths[0], device=args.device, max_tokens=args.max_tokens, dtype=args.dtype
        )
    if args.dtype in ("bfloat16", "bf16") and translator.device.type == "cpu":
        warn_emulated_bfloat16(f"--dtype {args.dtype}", "--dtype float32")

    def parts() -> Iterator[tuple[str, int]]:
        """The output, a part per :data:`BUFFER_SIZE` line pairs, each once scored, with the
        count of pairs scored so far."""
        sides = [
            iter(held[flag]) if held[flag] is not None else iter_lines(getattr(args, flag))
            for flag in ("src", "tgt")
        ]
        pairs = zip(*sides, strict=True)
        first = 0
        while window := list(itertools.islice(pairs, BUFFER_SIZE)):
            sources, targets = zip(*window, strict=True)
            scores = translator.score(
                list(sources), list(targets), args.tgt_lang, args.src_lang, first + 1
            )
            first += len(window)
            yield "".join(_line(result, args) + "\n" for result in scores), first

    write_parts(parts(), args.output, "score", ("score", "scores"))


def _held_lines(path: str) -> list[str] | None:
    """The lines of stdin (``-``) or of a file that cannot be read twice (a pipe, a FIFO,
    ``<(...)``), read once and held; ``None`` for a regular file, which is streamed."""
    if path == "-":
        return list(iter_stream_lines(sys.stdin.buffer, "<stdin>"))
    if Path(path).is_file():
        return None
    return list(iter_lines(path))


def _line(result, args: argparse.Namespace) -> str:
    """One output line: the score, and with ``--token_scores`` each piece's."""
    value = result.per_token if args.normalize else result.log_prob
    line = f"{value:.4f}"
    if args.token_scores:
        tokens = zip(result.pieces, result.token_log_probs, strict=True)
        line += "\t" + " ".join(f"{piece}:{lp:.4f}" for piece, lp in tokens)
    return line
