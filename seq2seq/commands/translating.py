"""``seq2seq translate``: text in, translations out, with a checkpoint alone.

Its decoding flags are :class:`~seq2seq.nn.DecodingConfig`'s fields, their help its
``Attributes:`` documentation; the other flags are the command's own.
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import itertools
import sys
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import docstring_parser
import torch

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
from seq2seq.data.language_tags import typed_tag
from seq2seq.machine import warn_emulated_bfloat16
from seq2seq.nn import DecodingConfig
from seq2seq.text_decoding import (
    apply_overrides,
    language_prefixes,
    sampling_rules,
    untagged_target,
)
from seq2seq.translator import DTYPE_NAMES

__all__ = ["add_decoding_flags", "translate"]


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--NAME`` flag per :class:`~seq2seq.nn.DecodingConfig` field, of its type and with
    its documentation as help; default ``None``: the checkpoint's value."""
    docs = {
        p.arg_name: p.description for p in docstring_parser.parse(DecodingConfig.__doc__).params
    }
    types = typing.get_type_hints(DecodingConfig)
    for field in dataclasses.fields(DecodingConfig):
        text = " ".join(plain(docs[field.name]).split()).replace("%", "%%")
        help = f"{text} (default: the checkpoint's model.decoding.{field.name})"
        if types[field.name] is bool:  # --NAME alone is true; --NAME false turns it off
            parser.add_argument(
                f"--{field.name}", nargs="?", const=True, type=_truth, default=None,
                metavar="{true,false}", help=help,
            )  # fmt: skip
        else:
            parser.add_argument(f"--{field.name}", type=types[field.name], default=None, help=help)


def _truth(text: str) -> bool:
    """``true``/``false`` (also ``yes``/``no``, ``1``/``0``, any case) as a bool."""
    value = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    if text.lower() not in value:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value[text.lower()]


def translate(argv: Sequence[str]) -> None:
    """``seq2seq translate --ckpt_path model.ckpt [--input F] [--output F] [--beam_size K]``.

    Reads one sentence per line (stdin by default), writes one translation per line (stdout by
    default) in input order; with ``--scores``, ``score<TAB>text`` lines; with ``--n_best N > 1``
    ``index<TAB>score<TAB>text`` lines, N per input sentence (``index`` the 0-based input
    line). A score is the hypothesis's length-penalised log-probability (higher is better). A
    line with no token the model knows (empty, blank, or only characters outside its
    vocabulary) is translated as empty text scored 0.0000, in N rows with ``--n_best N`` like
    any other line. The decoding options override the checkpoint's ``model.decoding``; a
    sampling option asks for sampling (:func:`seq2seq.text_decoding.sampling_rules`), whose
    ``--n_samples N > 1`` writes N ``index<TAB>score<TAB>text`` rows per line, as ``--n_best``.
    ``--prefix_file`` forces the start of each translation. The input is translated
    ``--buffer_size`` lines at a time (sorted by length within them into batches of
    ``--max_tokens``), each part written to standard output once translated (an ``--output``
    file is written whole at the end). A model trained into several
    target languages (``data.pairs``) needs ``--tgt_lang``; ``--src_lang`` outside its trained
    pairs translates zero-shot, with a warning.
    Several checkpoints decode as an ensemble: each step takes the mean of the
    models' log-probabilities (renormalised); they must carry the same SentencePiece model and
    language pair, and the decoding settings are the first checkpoint's.
    """
    parser = Parser(
        prog="seq2seq translate", description=plain(translate.__doc__), allow_abbrev=False
    )
    parser.add_argument(
        "--ckpt_path",
        required=True,
        nargs="+",
        help="checkpoint written by seq2seq fit, or a folder of seq2seq export --format "
        "ctranslate2 (translated through CTranslate2); several checkpoints decode as an "
        "ensemble (the mean of their log-probabilities; same SentencePiece model and language "
        "pair; decoding settings from the first); best or last with --checkpoint_dir",
    )
    add_checkpoint_dir(parser)
    parser.add_argument(
        "--input", default="-", help="source file, one sentence per line (- = stdin)"
    )
    parser.add_argument("--output", default="-", help="output file (- = stdout)")
    parser.add_argument(
        "--n_best", type=int, default=1, help="hypotheses per sentence (default: 1)"
    )
    parser.add_argument(
        "--scores", nargs="?", const=True, type=_truth, default=False, metavar="{true,false}",
        help="write score<TAB>text lines (--n_best above 1 always writes scores); --scores "
        "alone is true",
    )  # fmt: skip
    parser.add_argument(
        "--prefix_file",
        default=None,
        help="target prefixes, one per input line (an empty line = none): each translation "
        "starts with its prefix and continues after it",
    )
    parser.add_argument(
        "--tgt_lang",
        default=None,
        help="target language of a model with language tokens, as it names them (fr for "
        "the >>fr<< tag of a model trained on several target languages, which needs it; "
        "NLLB fra_Latn, M2M-100 fr, Marian fra for >>fra<<; default: the checkpoint's)",
    )
    parser.add_argument(
        "--src_lang",
        default=None,
        help="source language (optional; NLLB deu_Latn, M2M-100 de): a direction the "
        "checkpoint was not trained on (data.pairs) is warned about as zero-shot",
    )
    add_decoding_flags(parser)
    parser.add_argument("--seed", type=int, default=None, help="the same as --sampling_seed")
    parser.add_argument(
        "--max_tokens", type=int, default=4096, help="source tokens per batch (default: 4096)"
    )
    parser.add_argument(
        "--buffer_size",
        type=int,
        default=None,
        help=f"input lines read, translated and written at a time (default: {BUFFER_SIZE:,}; 1 "
        "where stdin is a terminal, so that each line typed is translated at once)",
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument(
        "--dtype",
        choices=list(DTYPE_NAMES),
        default="float32",
        help="compute type of decoding: bfloat16 (bf16) autocast over the float32 weights is "
        "faster on GPUs and on CPUs with avx512_bf16 or amx_bf16 (default: float32; a "
        "CTranslate2 folder takes its type from seq2seq export --quantization)",
    )
    args = parser.parse_args(list(argv))
    _check_text_after_checkpoint(parser, args.ckpt_path, args.input)
    decoding = _decoding_flags(parser, args)
    sampling = bool(decoding.get("sampling"))
    for name in ("n_best", "max_tokens", "buffer_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    if args.beam_size is not None and args.n_best > args.beam_size:
        parser.error(f"--n_best {args.n_best} exceeds --beam_size {args.beam_size}")
    if args.device is not None:
        check_device(parser, args.device)
    if DTYPE_NAMES[args.dtype] != torch.float32 and Path(args.ckpt_path[0]).is_dir():
        parser.error(
            f"--dtype {args.dtype}: a CTranslate2 folder computes in the type it was exported "
            "with (seq2seq export --quantization)"
        )
    if args.output != "-":
        check_output(parser, Path(args.output))
        inputs = {"the input file": [args.input], "the checkpoint": args.ckpt_path}
        check_output_apart(parser, args.output, inputs)
    source = Path(args.input)
    if args.input != "-" and (source.is_dir() or not source.exists()):  # a pipe is fine
        what = "is a folder" if source.is_dir() else "not found"
        raise FileNotFoundError(f"--input {args.input}: {what} (a file, or - for stdin)")
    prefix_source = Path(args.prefix_file) if args.prefix_file is not None else None
    if prefix_source is not None and (prefix_source.is_dir() or not prefix_source.exists()):
        what = "is a folder" if prefix_source.is_dir() else "not found"
        parser.error(f"--prefix_file {args.prefix_file}: {what}")
    args.ckpt_path = [
        checkpoint_alias(parser, ckpt, args.checkpoint_dir) for ckpt in args.ckpt_path
    ]
    from seq2seq.translator import Translator

    if len(args.ckpt_path) > 1:
        translator = ensemble_translator(
            parser, args.ckpt_path, args.device, args.max_tokens, args.dtype, decoding
        )
    else:
        translator = Translator.from_checkpoint(
            args.ckpt_path[0],
            device=args.device,
            max_tokens=args.max_tokens,
            dtype=args.dtype,
            **decoding,
        )
    # Not a CTranslate2 folder, which refused bfloat16 above (it computes in its exported type).
    if DTYPE_NAMES[args.dtype] == torch.bfloat16 and translator.device.type == "cpu":
        warn_emulated_bfloat16("--dtype bfloat16", "--dtype float32")
    # A missing or unknown language is one error line before any input is read.
    args.tgt_lang = untagged_target(translator.tokenizer, translator.pairs, args.tgt_lang)
    language_prefixes(translator.tokenizer, args.tgt_lang, args.src_lang)
    if Path(args.ckpt_path[0]).is_dir():  # a CTranslate2 folder (seq2seq.export), which searches
        beam, n_samples = translator.beam_size, translator.settings.get("n_samples", 1)
    else:
        config = translator.decoding
        beam, sampling, n_samples = config.beam_size, config.sampling, config.n_samples
    if args.n_best > beam and not sampling:
        parser.error(
            f"--n_best {args.n_best} exceeds the beam size {beam} (the checkpoint's); "
            f"pass --beam_size {args.n_best} or more"
        )
    where = "<stdin>" if args.input == "-" else args.input
    if args.input != "-":  # read through before any work: a bad line is found at once
        try:
            counts = [
                sum(1 for _ in iter_lines(path)) for path in (prefix_source, args.input) if path
            ]
        except ValueError as err:
            raise ValueError(f"{err} Nothing is translated.") from err
        if len(counts) == 2 and counts[0] != counts[1]:
            _prefix_count_error(parser, args.prefix_file, where, *counts)
    buffer = args.buffer_size
    if buffer is None:
        buffer = 1 if args.input == "-" and sys.stdin.isatty() else BUFFER_SIZE
    rows = args.n_best > 1 or (sampling and n_samples > 1)
    options = {name: getattr(args, name) for name in ("tgt_lang", "src_lang")}
    options = {name: value for name, value in options.items() if value is not None}

    def parts() -> Iterator[tuple[str, int]]:
        """The output, a part per ``buffer`` input lines, each once translated, with the count
        of input lines translated so far."""
        # Invalid UTF-8 is reported with the file (or <stdin>) and line; CRs of CRLF removed.
        if args.input == "-":
            lines = iter_stream_lines(sys.stdin.buffer, "<stdin>")
        else:
            lines = iter_lines(args.input)
        prefixes = iter_lines(prefix_source) if prefix_source is not None else None
        untagged = _untagged_warning(translator.tokenizer, args.tgt_lang, translator.pairs)
        first = 0
        while True:
            window, stop = _read_window(lines, buffer)
            if not window:
                if stop is not None:
                    raise stop
                break
            if untagged is not None:  # once, at the first line without a tag
                i = next((i for i, line in enumerate(window) if not typed_tag(line)), None)
                if i is not None:
                    print(untagged.format(line=first + i + 1), file=sys.stderr)
                    untagged = None
            extra = {}
            if prefixes is not None:
                extra["prefixes"] = list(itertools.islice(prefixes, len(window)))
                if len(extra["prefixes"]) < len(window):  # stdin: found as it is read
                    total = first + len(extra["prefixes"])
                    _prefix_count_error(parser, args.prefix_file, where, total, None)
            results = translator.translate(
                window, n_best=args.n_best, return_scores=args.scores, first_line=first + 1,
                **options, **extra,
            )  # fmt: skip
            output = "".join(line + "\n" for line in _output_lines(results, first, rows, args))
            first += len(window)
            yield output, first
            if stop is not None:  # a line that is no UTF-8 (stdin): the lines before it first
                raise stop
        if prefixes is not None and next(prefixes, None) is not None:
            _prefix_count_error(parser, args.prefix_file, where, None, first)

    write_parts(parts(), args.output, "translate", ("translation", "translations"))


def _read_window(lines: Iterator[str], size: int) -> tuple[list[str], ValueError | None]:
    """Up to ``size`` lines, and the error that stopped the reading before them, if one did
    (a line of stdin that is no UTF-8: the lines read before it are translated first)."""
    window: list[str] = []
    try:
        window.extend(itertools.islice(lines, size))
    except ValueError as stop:
        return window, stop
    return window, None


BUFFER_SIZE = 10_000
"""Input lines that ``translate`` reads, translates and writes at a time by default."""


def _output_lines(results: list, first: int, rows: bool, args: argparse.Namespace) -> list[str]:
    """The output lines of the translations of input lines ``first`` (0-based) onwards."""
    if not rows and not args.scores:
        return list(results)
    if not rows:
        return [f"{hyps[0][1]:.4f}\t{hyps[0][0]}" for hyps in results]
    return [
        f"{first + i}\t{score:.4f}\t{hyp}" for i, hyps in enumerate(results) for hyp, score in hyps
    ]


def _prefix_count_error(
    parser: argparse.ArgumentParser,
    prefix_file: str,
    where: str,
    prefixes: int | None,
    lines: int | None,
) -> None:
    """The error of a ``--prefix_file`` of another length than the input (``None``: a count
    that reading stopped before knowing: more than the other)."""
    has = _lines(prefixes) if prefixes is not None else f"more than {_lines(lines)}"
    other = str(lines) if lines is not None else f"more than {prefixes}"
    parser.error(
        f"--prefix_file {prefix_file} has {has} but the input {where} has {other}; give one "
        "prefix per input line (an empty line for none)"
    )


def _untagged_warning(tokenizer: Any, tgt_lang: str | None, pairs: Any) -> str | None:
    """The warning (``{line}`` to fill) for an input line without a typed ``>>xx<<`` tag to
    a Marian model of several target languages, given no ``--tgt_lang``, where the model has
    no default target (the line is translated without a tag) or was trained into several
    (``pairs``: its default, from its import, is no choice among them); else ``None``."""
    languages = getattr(tokenizer, "languages", ())
    if getattr(tokenizer, "family", None) != "marian" or not languages or tgt_lang:
        return None
    default = getattr(tokenizer, "tgt_lang", None)
    trained = sorted({tgt for _, tgt in pairs or ()})
    if default is not None and len(trained) < 2:
        return None
    into = f"into its default {default}" if default else "without a target language"
    return (
        "seq2seq: warning: line {line} has no >>xx<< tag at its start, and the model translates "
        f"into {', '.join(trained if len(trained) > 1 else languages)}: lines without one are "
        f"translated {into} (give --tgt_lang, or a tag at the start of each line)"
    )


def _check_text_after_checkpoint(
    parser: argparse.ArgumentParser, paths: list[str], source: str
) -> None:
    """Refuse a text file among the ``--ckpt_path`` entries after the first, which is the input
    of a user who forgot ``--input`` (``--ckpt_path main.ckpt in.de``: nargs="+" takes both),
    before any checkpoint is read; a first entry keeps the loader's "not a checkpoint"."""
    for path in paths[1:]:
        if _is_text_file(Path(path)):
            advice = (
                f"to translate it, give --input {path}"
                if source == "-"
                else f"--input {source} is the text to translate"
            )
            parser.error(f"--ckpt_path {path} is a text file, not a checkpoint; {advice}")


def _is_text_file(path: Path, size: int = 1 << 16) -> bool:
    """Whether ``path`` is a non-empty regular file whose first ``size`` bytes are UTF-8 text:
    neither a zip (torch.save's format, b"PK") nor a legacy pickle (its byte 0x80 is not UTF-8)
    nor a binary file (NUL bytes)."""
    if not path.is_file():  # a folder (a CTranslate2 export) or a missing file: checked later
        return False
    try:
        with path.open("rb") as f:
            head = f.read(size)
    except OSError:  # unreadable: the loader names it
        return False
    if not head or head.startswith(b"PK") or b"\x00" in head:
        return False
    try:  # not final: the chunk may end inside a character
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def _decoding_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The decoding fields given on the command line, after the sampling rules and
    DecodingConfig's range checks (a usage error naming the flag as typed), before any
    checkpoint is read."""
    if args.seed is not None and args.sampling_seed is not None:
        parser.error("give --seed or --sampling_seed, not both")
    names = DecodingConfig.field_names()
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.seed is not None:
        given["sampling_seed"] = args.seed

    def flag(name: str, value: Any = None) -> str:
        typed = "--seed" if name == "sampling_seed" and args.seed is not None else f"--{name}"
        if isinstance(value, bool):
            value = None if value else "false"
        return typed if value is None else f"{typed} {value}"

    try:
        given = sampling_rules(given, args.n_best, spell=flag)
        apply_overrides(DecodingConfig(), given, spell=flag)
    except ValueError as err:
        parser.error(str(err))
    return given


def _lines(count: int) -> str:
    return f"{count} line" if count == 1 else f"{count} lines"
