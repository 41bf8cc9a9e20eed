"""Greedy decoding's cost per step at fixed row counts: ours (float32) against CTranslate2
(float32), each engine in processes of its own.

    python benchmarks/decode_steps.py --ckpt checkpoints/multi30k_de_en/last.ckpt \
        --data_dir ../shared/data/multi30k          # about a minute on 2 cores

A decoding pass over a corpus runs steps of many sizes: a batch starts with hundreds of rows and
ends with a few, as its sentences finish. Here each call decodes the first ``R`` sentences of the
split for exactly ``--steps`` steps (the end of sentence banned until the maximum length, in
both engines), so that both engines run the same products on the same rows. The time per step
(the encoder's one pass included) against ``R`` is close to a line: its intercept is the cost of
a step whatever its size (Python, dispatch, the operators' fixed costs), its slope the cost of
each row (products, attention over the caches, the arg-max). The printed fit of both engines
says which of the two makes a gap between them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import read_split  # noqa: E402

ENGINES = ("ours", "ctranslate2")


def _worker(args: argparse.Namespace) -> None:
    """``--worker ENGINE``: ms per step at each of ``--rows``, median of ``--repeats`` timed
    calls after one untimed call, printed as the last line (JSON)."""
    rows = [int(r) for r in args.rows.split(",")]
    sources = read_split(args.data_dir, args.split, args.src_lang, max(rows))
    if len(sources) < max(rows):
        raise SystemExit(f"--rows {max(rows)}: {args.split} holds {len(sources)} sentences")
    if args.worker == "ours":
        from seq2seq.nn.decoding import DecodingConfig
        from seq2seq.nn.search import greedy_search
        from seq2seq.translator import Translator

        engine = Translator.from_checkpoint(args.ckpt, device="cpu")
        model, tok = engine.model, engine.tokenizer
        ids = tok.encode(sources, side="source")
        # min_len at the maximum length: the end of sentence is banned until it is reached
        config = DecodingConfig(
            beam_size=1, max_len_a=0.0, max_len_b=args.steps, min_len=args.steps
        )

        def call(n: int) -> list[int]:
            length = max(len(s) for s in ids[:n])
            src = torch.full((n, length), model.pad_id, dtype=torch.long)
            for i, s in enumerate(ids[:n]):
                src[i, : len(s)] = torch.tensor(s)
            mask = (src != model.pad_id)[:, None, None, :]
            found = greedy_search(model, src, mask, tok.bos_id, tok.eos_id, config, scores=False)
            return [len(hyps[0].tokens) for hyps in found]

    else:
        from seq2seq.export.ctranslate2 import CTranslate2Translator

        engine = CTranslate2Translator(args.export_dir, device="cpu", intra_threads=args.threads)
        pieces = [[engine._pieces[t] for t in s] for s in engine.encode(sources)]

        def call(n: int) -> list[int]:
            out = engine.model.translate_batch(
                pieces[:n],
                beam_size=1,
                max_decoding_length=args.steps,
                min_decoding_length=args.steps,
                max_input_length=0,
            )
            return [len(result.hypotheses[0]) for result in out]

    result = {}
    for n in rows:
        lengths = call(n)
        if set(lengths) != {args.steps}:  # the same work in both engines, or no figure
            raise SystemExit(
                f"{args.worker} decoded {sorted(set(lengths))} steps of {n} rows, not --steps "
                f"{args.steps} (which the model's max_positions caps)"
            )
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            call(n)
            times.append(time.perf_counter() - start)
        result[n] = 1000 * statistics.median(times) / args.steps
    print(json.dumps(result))


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ``ys`` against ``xs``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _row_counts(text: str) -> str:
    """An argparse type: comma-separated integers >= 1 (kept as given, for the workers)."""
    for part in text.split(","):
        _positive(part)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--ckpt", required=True, help="a float32 checkpoint of ours")
    parser.add_argument("--data_dir", default="../shared/data/multi30k", help="the corpus")
    parser.add_argument("--split", default="test_2016_flickr", help="its sentences decoded")
    parser.add_argument("--src_lang", default="de", help="the source side of the split")
    parser.add_argument(
        "--rows", type=_row_counts, default="1,16,64,256",
        help="comma-separated row counts (sentences per call); two or more for the fit",
    )  # fmt: skip
    parser.add_argument("--steps", type=_positive, default=32, help="decoding steps per call")
    parser.add_argument("--repeats", type=_positive, default=5, help="timed calls per count")
    parser.add_argument("--processes", type=_positive, default=2, help="processes per engine")
    parser.add_argument("--threads", type=_positive, default=2, help="threads per process")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--export-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.worker:
        _worker(args)
        return
    if not Path(args.ckpt).is_file():
        parser.error(f"--ckpt {args.ckpt}: no such file")
    if importlib.util.find_spec("ctranslate2") is None:
        parser.error("CTranslate2 is not installed: pip install -e '.[export]'")

    from cpu_bf16 import cpu  # the lscpu line every speed figure carries

    from seq2seq.export.ctranslate2 import export_ctranslate2

    runs: dict[str, list[dict]] = {name: [] for name in ENGINES}
    with tempfile.TemporaryDirectory(prefix="decode_steps.") as work:
        folder = export_ctranslate2(args.ckpt, Path(work) / "float32", "float32")
        command = [sys.executable, str(Path(__file__).resolve()), "--export-dir", str(folder)]
        for name in (
            "ckpt",
            "data_dir",
            "split",
            "src_lang",
            "rows",
            "steps",
            "repeats",
            "threads",
        ):
            command += [f"--{name}", str(getattr(args, name))]
        for p in range(args.processes):
            for name in ENGINES if p % 2 == 0 else ENGINES[::-1]:
                out = subprocess.run(command + ["--worker", name], capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"the {name} worker failed:\n{out.stderr[-3000:]}")
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = [int(r) for r in args.rows.split(",")]
    ms = {
        name: [statistics.median(run[str(n)] for run in runs[name]) for n in rows]
        for name in ENGINES
    }
    print(f"{cpu()}; {args.threads} threads; {args.split}, greedy, {args.steps} steps per call")
    print("| rows | ours (ms/step) | CTranslate2 float32 (ms/step) | CTranslate2 / ours (speed) |")
    print("| --- | --- | --- | --- |")
    for i, n in enumerate(rows):
        ours, ct2 = ms["ours"][i], ms["ctranslate2"][i]
        print(f"| {n} | {ours:.2f} | {ct2:.2f} | {ours / ct2:.2f}x |")
    if len(set(rows)) < 2:
        print("(one row count: no fit of the fixed and per-row costs)")
        return
    for name in ENGINES:
        fixed, per_row = _line([float(n) for n in rows], ms[name])
        print(f"{name}: {fixed:.2f} ms per step + {1000 * per_row:.1f} us per row")


if __name__ == "__main__":
    main()
