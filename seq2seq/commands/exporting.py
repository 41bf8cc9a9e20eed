"""``seq2seq export``: a checkpoint as a CTranslate2 or Hugging Face Transformers folder."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from seq2seq.commands.parsing import Parser, add_checkpoint_dir, checkpoint_alias, plain

__all__ = ["export"]


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

    parser = Parser(prog="seq2seq export", description=plain(export.__doc__), allow_abbrev=False)
    parser.add_argument(
        "--ckpt_path",
        required=True,
        help="checkpoint written by seq2seq fit (best or last with --checkpoint_dir)",
    )
    add_checkpoint_dir(parser)
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
    args.ckpt_path = checkpoint_alias(parser, args.ckpt_path, args.checkpoint_dir)
    if args.quantization not in (None, "none", "float32") and args.format != "ctranslate2":
        parser.error(f"--quantization {args.quantization} applies to --format ctranslate2 only")
    from seq2seq.export.common import check_output_folder

    try:
        check_output_folder(args.output)
    except OSError as err:
        parser.error(str(err))
    replaced = None  # an earlier export in --output, which this one replaces: said once done
    if Path(args.output).is_dir() and any(Path(args.output).iterdir()):
        from seq2seq.export.common import read_marker

        earlier = read_marker(args.output)
        replaced = f"{earlier.get('format')} export of {earlier.get('checkpoint')}"
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
    kind = args.format
    if args.format == "ctranslate2" and args.quantization not in (None, "none", "float32"):
        kind += f", {args.quantization} weights"
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.checkpoint.format import weights_name

    which = weights_name(load_checkpoint(args.ckpt_path, mmap=True))  # EMA weights: which
    source = args.ckpt_path if which == "weights" else f"the {which} of {args.ckpt_path}"
    print(f"exported {source} to {written} ({kind})")
    if replaced:
        print(f"seq2seq: note: it replaces the {replaced} that {written} held", file=sys.stderr)
    from seq2seq.export.common import read_marker

    note = read_marker(written).get("note")
    if note:
        print(f"seq2seq: note: {note}", file=sys.stderr)
