"""Deployment engines side by side on one checkpoint: seq2seq (PyTorch), CTranslate2 float32
and int8 (``seq2seq export --format ctranslate2``) and Hugging Face ``generate`` on the
``seq2seq export --format huggingface`` folder.

Every engine translates the same test set in one process, greedy and beam 5, with the same
length limits (``max_len = int(max_len_a * src_len + max_len_b)`` per sentence, EOS
included, the checkpoint's ``min_len`` and ``length_penalty``). Reported: sentences/s, BLEU
with sacreBLEU's signature, and how many hypotheses are identical to seq2seq's. Needs the
``export`` extra.

    python benchmarks/engines.py --ckpt checkpoints/multi30k_de_en/last.ckpt \\
        --data_dir ../shared/data/multi30k --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import read_split  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="checkpoint of seq2seq fit")
    parser.add_argument("--data_dir", required=True, help="folder of the test set files")
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--src_lang", default="de")
    parser.add_argument("--tgt_lang", default="en")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beams", default="1,5", help="beam sizes, comma-separated")
    parser.add_argument(
        "--patience",
        type=float,
        default=2.0,
        help="CTranslate2's beam patience factor (default 2, the translator's)",
    )
    parser.add_argument("--engines", default="seq2seq,ct2-float32,ct2-int8,transformers")
    parser.add_argument("--work_dir", default=None, help="where the exports go (default: temp)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)

    import sacrebleu
    import torch

    from seq2seq.export.ctranslate2 import CTranslate2Translator, export_ctranslate2
    from seq2seq.export.huggingface import export_huggingface, generate_translations
    from seq2seq.translator import Translator

    torch.set_num_threads(args.threads)
    data_dir = Path(args.data_dir)
    sources = read_split(data_dir, args.split, args.src_lang)
    refs = read_split(data_dir, args.split, args.tgt_lang)
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="engines."))
    ours = Translator.from_checkpoint(args.ckpt, device="cpu")
    hp = ours.decoding
    limits = dict(max_len_a=hp.max_len_a, max_len_b=hp.max_len_b, min_len=hp.min_len)
    lp = float(hp.length_penalty)
    engines = args.engines.split(",")

    run = {}
    if "seq2seq" in engines:
        run["seq2seq"] = lambda beam: ours.translate(sources, beam_size=beam)
    for quantization in ("float32", "int8"):
        name = f"ct2-{quantization}"
        if name in engines:
            folder = export_ctranslate2(args.ckpt, work / name, quantization)
            ct2 = CTranslate2Translator(
                folder, device="cpu", intra_threads=args.threads, patience=args.patience
            )
            run[name] = lambda beam, ct2=ct2: ct2.translate(sources, beam_size=beam)
    if "transformers" in engines:
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        folder = export_huggingface(args.ckpt, work / "hf")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
            tokenizer = AutoTokenizer.from_pretrained(folder)
        run["transformers"] = lambda beam: generate_translations(
            model, tokenizer, sources, beam, length_penalty=lp, **limits
        )

    rows, outputs, timings = [], {}, {}
    for beam in [int(b) for b in args.beams.split(",")]:
        names = list(run)
        for name in names if beam % 2 else names[::-1]:  # alternate the order per beam
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # sentences cut at max_positions
                start = time.perf_counter()
                hyps = run[name](beam)
                seconds = time.perf_counter() - start
            outputs[name, beam] = hyps
            timings[name, beam] = seconds
        for name in names:
            hyps = outputs[name, beam]
            metric = sacrebleu.BLEU()
            bleu = metric.corpus_score(hyps, [refs])
            signature = str(metric.get_signature())
            reference = outputs.get(("seq2seq", beam))
            same = (
                None
                if reference is None
                else sum(a == b for a, b in zip(hyps, reference, strict=True))
            )
            rows.append(
                {
                    "engine": name,
                    "beam": beam,
                    "sent_per_s": len(sources) / timings[name, beam],
                    "bleu": round(bleu.score, 2),
                    "identical": same,
                    "n": len(sources),
                }
            )
    print(
        f"{args.split}, {len(sources)} sentences, {args.threads} threads, length penalty "
        f"{lp}, max_len {hp.max_len_a} * src_len + {hp.max_len_b}, CTranslate2 patience "
        f"{args.patience}; BLEU {signature}"
    )
    print("| engine | beam | sent/s | BLEU | identical to seq2seq |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        same = "" if r["identical"] is None else f"{r['identical']} / {r['n']}"
        print(f"| {r['engine']} | {r['beam']} | {r['sent_per_s']:.0f} | {r['bleu']:.2f} | {same} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "signature": signature}, indent=2))
        for (name, beam), hyps in outputs.items():
            Path(args.json).with_suffix(f".{name}.beam{beam}.txt").write_text(
                "".join(h + "\n" for h in hyps)
            )
    return rows


if __name__ == "__main__":
    main()
