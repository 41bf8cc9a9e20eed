"""``seq2seq import``: a Hugging Face Transformers folder as a seq2seq checkpoint."""

from __future__ import annotations

from collections.abc import Sequence

from seq2seq.commands.parsing import Parser, plain

__all__ = ["import_model"]


def import_model(argv: Sequence[str]) -> None:
    """``seq2seq import --input DIR --output model.ckpt [--src_lang L --tgt_lang L]``.

    Writes the ``save_pretrained`` folder of a Hugging Face ``MarianMTModel`` (OPUS-MT), an
    ``M2M100ForConditionalGeneration`` (M2M-100, NLLB) or a ``PegasusForConditionalGeneration``
    (what seq2seq export --format huggingface writes) as an ordinary checkpoint, with its
    tokenizer: test, validate, translate, average, export and fit --init_from take it (fit
    --ckpt_path does not: it holds no training state). A setting the seq2seq Transformer
    cannot represent is refused by its config.json key before anything is written; the
    decoding settings that have no seq2seq equivalent are listed. An existing --output is
    replaced only if seq2seq import wrote it.
    """
    parser = Parser(
        prog="seq2seq import", description=plain(import_model.__doc__), allow_abbrev=False
    )
    parser.add_argument("--input", required=True, help="Hugging Face save_pretrained folder")
    parser.add_argument("--output", required=True, help="checkpoint to write (.ckpt)")
    parser.add_argument(
        "--src_lang",
        default=None,
        help="source language as the model names it: the tokenizer's default (required for "
        "M2M-100 and NLLB: codes such as de or deu_Latn)",
    )
    parser.add_argument(
        "--tgt_lang",
        default=None,
        help="target language (required for M2M-100 and NLLB; a Marian model's >>xx<< tag)",
    )
    args = parser.parse_args(list(argv))
    from seq2seq.importing import check_replaceable, import_huggingface

    try:
        check_replaceable(args.output)
    except OSError as err:
        parser.error(str(err))
    result = import_huggingface(args.input, args.output, args.src_lang, args.tgt_lang)
    config = result.config
    pair = f", {result.languages[0]}->{result.languages[1]}" if result.languages else ""
    print(
        f"imported {args.input} ({result.family}: {config.n_encoder_layers}+"
        f"{config.n_decoder_layers} layers, d_model {config.d_model}, vocabulary "
        f"{config.vocab_size}{pair}) into {result.output}"
    )
    if result.notes:
        print("not carried: " + "; ".join(result.notes))
