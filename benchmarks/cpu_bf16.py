"""bfloat16 against float32 on this CPU: training, and decoding against CTranslate2.

Prints the CPU (``lscpu`` model name, whether ``amx_bf16`` / ``avx512_bf16`` are present), the
``torch.mm`` 2048^3 rate of each dtype (the physical ceiling of the ratio), and the training
throughput of a README-size step (``configs/multi30k_de_en.yaml``'s model: d_model 256, 4 heads,
3 + 3 layers, d_ff 1024, vocabulary 8000; ``--batch`` sentences of ``--length`` source and
target tokens) as ``TranslationModule`` runs it: the decoder states at the target positions
and the fused output projection + label-smoothed loss, backward, AdamW (``fused=True``, as the
config's). bfloat16 means ``torch.autocast("cpu", dtype=torch.bfloat16)`` around the forward
pass, float32 weights and optimizer state, as ``--trainer.precision bf16-mixed``. The step is
timed with each dtype in processes of its own (``--processes`` of each, in alternating order,
``--steps`` timed steps each; the median of the paired ratios), as a fit runs one dtype, and
both in one process, each repetition timing both in alternating order
(``common.time_interleaved``). The two differ: next to a float32 model bfloat16 runs faster
than alone (benchmarks/README.md).
``FlopCounterMode`` counts the model FLOPs of one step (forward and backward) on the plain
output projection and loss, CPU flash attention included; FLOPs per target token times
tokens/s, over the ``torch.mm`` rate of the same dtype, is the share of the matmul ceiling a
step reaches. Beside the 2048^3 product it times the step's own products (every ``mm`` and
``bmm`` of a plain step, forward and backward, each alone on operands of its own): the ceiling
at the model's shapes, which the smaller products keep below the square one. The step and both
ceilings are timed interleaved in one process, so that each share pairs like with like.

With ``--ckpt`` (a trained checkpoint, e.g. the README job's) and ``--data_dir``, it also
decodes the first ``--limit`` sentences of ``--split`` with ours in float32 and in bfloat16
(``Translator(dtype=...)``) and with CTranslate2 float32 and int8 (folders written by
``seq2seq export``; needs the ``export`` extra), greedy and beam 5, each engine in
``--decode-processes`` processes of its own in rotating order (:func:`decoding` says why), and
prints sentences/s, BLEU, the ratios ours / CTranslate2 float32 and ours bfloat16 / CTranslate2 int8
(CTranslate2 has no bfloat16 on CPU), and the ablation rows of three tricks of
``seq2seq.nn.fast`` (ours float32 without ``step`` or ``small_rows``, ours bfloat16 without
``row_buckets``, against ours with them).

    python benchmarks/cpu_bf16.py                   # training only, ~2 minutes on 2 cores
    python benchmarks/cpu_bf16.py --ckpt checkpoints/multi30k_de_en/last.ckpt \\
        --data_dir ../shared/data/multi30k          # and decoding, about 10 more minutes
    python benchmarks/cpu_bf16.py --profile bf16    # torch.profiler's top operators instead

On a CPU without bfloat16 instructions it measures float32 alone (the bf16 columns read ``-``)
unless ``--dtypes both``: emulated bfloat16 steps take seconds each.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import read_split, time_interleaved  # noqa: E402

from seq2seq.nn import Transformer, TransformerConfig  # noqa: E402
from seq2seq.nn.loss import (  # noqa: E402
    label_smoothed_cross_entropy,
    linear_label_smoothed_cross_entropy,
)


def cpu() -> str:
    """``lscpu``'s model name and the bfloat16 flags present."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU (no lscpu)"
    lines = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = lines.get("Flags", "").split()
    present = [f for f in ("amx_bf16", "avx512_bf16") if f in flags] or ["no bf16 flags"]
    return f"{lines.get('Model name', '?').strip()} ({', '.join(present)})"


def measures_bf16(args: argparse.Namespace) -> bool:
    """Whether ``--dtypes`` (``auto``: the CPU's bfloat16 flags) asks for the bf16 rows."""
    if args.dtypes != "auto":
        return args.dtypes == "both"
    return "no bf16 flags" not in cpu()


def square_product(dtype: torch.dtype, n: int = 2048):
    """A call of ``torch.mm`` on two ``n x n`` matrices of ``dtype`` (2 n^3 FLOPs), the matmul
    ceiling of the dtype on this CPU."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return partial(torch.mm, a, b)


def _cpu_attention_flops() -> dict:
    """FlopCounterMode formulas for CPU flash attention, forward and backward: the two
    ``(T, Dh) x (Dh, L)`` and ``(T, L) x (L, Dh)`` products per head, twice that backward (as
    the math path's batched products count)."""
    aten = torch.ops.aten

    def forward(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
        *batch, t, dh = query_shape
        length, dv = key_shape[-2], value_shape[-1]
        return 2 * math.prod(batch) * t * length * (dh + dv)

    def backward(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
        return 2 * forward(query_shape, key_shape, value_shape)

    return {
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
    }


README_MODEL = TransformerConfig(
    vocab_size=8000, d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024,
    dropout=0.1,
)  # fmt: skip
"""configs/multi30k_de_en.yaml's model."""


def training_step(batch: int, length: int, seed: int = 0, dtypes: tuple[bool, ...] = (False, True)):
    """``step(bf16: bool)``: one training step of a fresh README-size model (its own
    optimizer), and the target tokens a step trains on. ``dtypes``: the ``bf16`` values a model
    is built for (``False``: float32, which :meth:`step.flops` needs)."""
    torch.manual_seed(seed)
    config = README_MODEL
    src = torch.randint(4, 8000, (batch, length))
    tgt = torch.randint(4, 8000, (batch, length + 1))
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    index = torch.arange(batch * length)
    models = {dtype: Transformer(config).train() for dtype in dtypes}
    optimizers = {
        k: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for k, m in models.items()
    }

    def step(bf16: bool) -> None:
        model, optimizer = models[bf16], optimizers[bf16]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = model.features(src, tgt[:, :-1], mask, index, tgt_index=index)
            loss, _ = linear_label_smoothed_cross_entropy(
                hidden, model.output_weight, tgt[:, 1:].reshape(-1), 0.1, bias=model.output_bias
            )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def flops() -> int:
        """Model FLOPs of one float32 step (forward + backward), counted by FlopCounterMode on
        the plain output projection and loss: the fused loss's oneDNN logits and in-place
        ``addmm_`` have no FLOP formula there (a fifth of the step's products would go
        uncounted), nor has CPU flash attention, which :func:`_cpu_attention_flops` supplies."""
        from torch.utils.flop_counter import FlopCounterMode

        from seq2seq.nn import fast

        model = models[False]
        counter = FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops())
        with counter, fast.enabled(False):
            hidden = model.features(src, tgt[:, :-1], mask, index, tgt_index=index)
            logits = F.linear(hidden, model.output_weight, model.output_bias)
            loss, _ = label_smoothed_cross_entropy(logits, tgt[:, 1:].reshape(-1), 0.1)
            loss.backward()
        model.zero_grad(set_to_none=True)
        return counter.get_total_flops()

    def products() -> collections.Counter:
        """The matrix products of one plain float32 step, forward and backward (attention's
        fused kernels aside): ``(batch, m, k, n) -> count``, ``batch`` 1 for a plain product."""
        from torch.utils._python_dispatch import TorchDispatchMode

        from seq2seq.nn import fast

        aten, found = torch.ops.aten, collections.Counter()

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in (aten.mm.default, aten.addmm.default):
                    a, b = args[-2:]
                    found[(1, a.size(0), a.size(1), b.size(1))] += 1
                elif func in (aten.bmm.default, aten.baddbmm.default):
                    a, b = args[-2:]
                    found[(a.size(0), a.size(1), a.size(2), b.size(2))] += 1
                return func(*args, **(kwargs or {}))

        model = models[False]
        with Record(), fast.enabled(False):
            hidden = model.features(src, tgt[:, :-1], mask, index, tgt_index=index)
            logits = F.linear(hidden, model.output_weight, model.output_bias)
            loss, _ = label_smoothed_cross_entropy(logits, tgt[:, 1:].reshape(-1), 0.1)
            loss.backward()
        model.zero_grad(set_to_none=True)
        return found

    step.flops = flops
    step.products = products
    return step, batch * length


def products_alone(shapes: collections.Counter, dtype: torch.dtype):
    """``(run, flops)``: ``run()`` computes every product of ``shapes`` (:func:`training_step`'s
    ``step.products()``) once, each on contiguous operands of its own made once, and ``flops``
    is their FLOPs. Timed beside the step, they are the matmul ceiling at the model's own
    shapes: the step's products with nothing around them."""
    calls, flops = [], 0
    for (batch, m, k, n), count in shapes.items():
        a, b = torch.randn(batch, m, k).to(dtype), torch.randn(batch, k, n).to(dtype)
        call = (lambda a=a[0], b=b[0]: torch.mm(a, b)) if batch == 1 else partial(torch.bmm, a, b)
        calls += [call] * count
        flops += 2 * batch * m * k * n * count

    def run() -> None:
        for call in calls:
            call()

    return run, flops


def train_worker(args: argparse.Namespace) -> None:
    """``--train-worker DTYPE``: this process times ``--steps`` training steps of that dtype
    alone, after 2 untimed ones, and prints its target tokens/s as the last line (JSON)."""
    bf16 = args.train_worker == "bf16"
    step, tokens = training_step(args.batch, args.length, dtypes=(bf16,))
    for _ in range(2):
        step(bf16)
    start = time.perf_counter()
    for _ in range(args.steps):
        step(bf16)
    print(json.dumps({"tokens_per_s": tokens * args.steps / (time.perf_counter() - start)}))


def varying_batches(n: int, max_tokens: int = 4096, seed: int = 0) -> list[tuple]:
    """``n`` batches shaped as a fit's: ``collate``'s right padding, masks and real-position
    indices, sentences of 8-30 tokens grouped by length (target = source length +- 3), as many
    as ``n_sentences * longest <= max_tokens`` allows. Every batch has its own row counts, as
    in ``seq2seq fit``, where few batches repeat a shape within the cache of compiled oneDNN
    kernels. Items: ``(src, tgt, src_mask, src_index, tgt_index, target tokens)``."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        longest = int(torch.randint(10, 31, (), generator=gen))
        size = max_tokens // (longest + 3)
        src_len = torch.randint(max(longest - 6, 8), longest + 1, (size,), generator=gen)
        tgt_len = (src_len + torch.randint(-3, 4, (size,), generator=gen)).clamp(min=4)
        src = torch.randint(4, 8000, (size, int(src_len.max())), generator=gen)
        tgt = torch.randint(4, 8000, (size, int(tgt_len.max()) + 1), generator=gen)
        src_mask = torch.arange(src.size(1)) < src_len[:, None]
        tgt_mask = torch.arange(tgt.size(1) - 1) < tgt_len[:, None]
        src[~src_mask] = 0
        tgt[:, 1:][~tgt_mask] = 0
        src_index = src_mask.flatten().nonzero().squeeze(1)
        tgt_index = tgt_mask.flatten().nonzero().squeeze(1)
        batches.append((src, tgt, src_mask[:, None, None, :], src_index, tgt_index,
                        int(tgt_len.sum())))  # fmt: skip
    return batches


def varying_worker(args: argparse.Namespace) -> None:
    """``--varying-worker DTYPE``: ``--steps`` timed training steps (after 3 untimed ones) on
    :func:`varying_batches`, each step a new batch, with the row counts ``TranslationModule``
    passes (``fast.bucket_index``); ``--no-buckets`` switches ``row_buckets`` off,
    ``--loop-adamw`` takes AdamW's loop over the parameters instead of its fused step. Prints
    the target tokens/s as the last line (JSON)."""
    from seq2seq.nn import fast

    bf16 = args.varying_worker == "bf16"
    torch.manual_seed(0)
    model = Transformer(README_MODEL).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not args.loop_adamw)
    batches = varying_batches(args.steps + 3, args.max_tokens)

    def step(batch) -> int:
        src, tgt, src_mask, src_index, tgt_index, tokens = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            weight = model.output_weight
            index = fast.bucket_index(tgt_index, tgt[:, 1:].numel(), weight)
            src_index = fast.bucket_index(src_index, src.numel(), weight)
            hidden = model.features(src, tgt[:, :-1], src_mask, index, src_index=src_index,
                                    tgt_index=index)  # fmt: skip
            target = tgt[:, 1:].reshape(-1).index_select(0, index)
            loss, _ = linear_label_smoothed_cross_entropy(
                hidden, weight, target, 0.1, bias=model.output_bias
            )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return tokens

    with fast.enabled(not args.no_buckets, "row_buckets"):
        for batch in batches[:3]:
            step(batch)
        start = time.perf_counter()
        tokens = sum(step(batch) for batch in batches[3:])
    print(json.dumps({"tokens_per_s": tokens / (time.perf_counter() - start)}))


def separate_process_rates(
    args: argparse.Namespace, worker: str = "--train-worker", variants: dict | None = None
) -> tuple[dict[str, float], float]:
    """Target tokens/s of each variant timed in processes of its own, ``--processes`` of each,
    started in rotating order (float32 bf16, bf16 float32, ...): the medians, and the median
    of the paired bf16 / float32 ratios. ``worker``: ``--train-worker`` (the fixed-shape step)
    or ``--varying-worker``; ``variants``: name -> (dtype, extra arguments), default float32
    and bf16.

    A process that runs both dtypes (:func:`common.time_interleaved`) put bfloat16 ahead by
    more than a single-dtype process sees: on an AMD EPYC (``avx512_bf16``) 1.71-1.74x in one
    process against 1.54x in separate ones, on the same README batches; ``seq2seq fit`` runs
    one dtype."""
    variants = variants or {"float32": ("float32", []), "bf16": ("bf16", [])}
    steps = args.steps if worker == "--train-worker" else args.varying_steps
    command = [sys.executable, str(Path(__file__).resolve()), "--threads", str(args.threads),
               "--batch", str(args.batch), "--length", str(args.length),
               "--steps", str(steps), "--max-tokens", str(args.max_tokens)]  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.processes):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            dtype, extra = variants[name]
            run = command + [worker, dtype] + extra
            out = subprocess.run(run, capture_output=True, text=True, check=True)
            rates[name].append(json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"])
    ratios = [b / f for f, b in zip(rates["float32"], rates.get("bf16", []), strict=False)]
    medians = {k: statistics.median(v) for k, v in rates.items()}
    return medians, statistics.median(ratios) if ratios else math.nan


DECODING_ENGINES = (
    "ours float32",
    "ours float32 -step",
    "ours float32 -small_rows",
    "ours bf16",
    "ours bf16 -row_buckets",
    "CTranslate2 float32",
    "CTranslate2 int8",
)
DECODING_PEERS = {
    "ours float32": "CTranslate2 float32",
    "ours bf16": "CTranslate2 int8",
    # the ablation rows of three tricks of seq2seq.nn.fast
    "ours float32 -step": "ours float32",
    "ours float32 -small_rows": "ours float32",
    "ours bf16 -row_buckets": "ours bf16",
}


def _read_split(args: argparse.Namespace, lang: str) -> list[str]:
    return read_split(args.data_dir, args.split, lang, args.limit)


def decode_worker(args: argparse.Namespace) -> None:
    """``--decode-worker ENGINE``: this process loads that one engine (ours from ``--ckpt``,
    CTranslate2 from the folder ``--export-dir/QUANTIZATION``), translates the sentences once
    untimed, then ``--decode-repeats`` times with ``--beam``, and prints the median
    sentences/s and the BLEU of the last call as its last line (JSON). ``ours DTYPE -TRICK``
    decodes with that trick of ``seq2seq.nn.fast`` off (its ablation row)."""
    import sacrebleu

    from seq2seq.export.ctranslate2 import CTranslate2Translator
    from seq2seq.nn import fast
    from seq2seq.translator import Translator

    name = args.decode_worker
    if name.startswith("ours"):
        dtype = "bfloat16" if "bf16" in name else "float32"
        engine = Translator.from_checkpoint(args.ckpt, device="cpu", dtype=dtype)
    else:
        folder = Path(args.export_dir) / name.split()[-1]
        engine = CTranslate2Translator(folder, device="cpu", intra_threads=args.threads)
    sources, refs = _read_split(args, args.src_lang), _read_split(args, args.tgt_lang)
    tricks_off = name.split(" -")[1:]
    with fast.enabled(False, *tricks_off) if tricks_off else contextlib.nullcontext():
        engine.translate(sources, beam_size=args.beam)
        times = []
        for _ in range(args.decode_repeats):
            start = time.perf_counter()
            outputs = engine.translate(sources, beam_size=args.beam)
            times.append(time.perf_counter() - start)
    bleu = sacrebleu.corpus_bleu(outputs, [refs]).score
    print(json.dumps({"sent_per_s": len(sources) / statistics.median(times), "bleu": bleu}))


def decoding(args: argparse.Namespace, names: tuple[str, ...] = ("float32", "bf16")) -> None:
    """Ours float32 / bfloat16 and CTranslate2 float32 / int8, greedy and beam 5, each engine
    in processes of its own (:func:`decode_worker`), ``--decode-processes`` of each in rotating
    order.

    Not in one process: once CTranslate2 has translated, the OpenMP threads of our operators
    stop spinning between parallel regions (CTranslate2's OpenMP runtime and PyTorch's then
    manage more threads than there are cores) and our greedy decoding took 1.45x as long on a
    2-core Intel Xeon; with ``OMP_WAIT_POLICY=PASSIVE`` it took as long before CTranslate2 ran
    as after (benchmarks/README.md)."""
    import tempfile

    from seq2seq.export.ctranslate2 import export_ctranslate2

    work = Path(tempfile.mkdtemp(prefix="cpu_bf16."))
    for quantization in ("float32", "int8"):
        export_ctranslate2(args.ckpt, work / quantization, quantization)
    command = [sys.executable, str(Path(__file__).resolve()), "--threads", str(args.threads),
               "--ckpt", args.ckpt, "--export-dir", str(work), "--data_dir", args.data_dir,
               "--split", args.split, "--src_lang", args.src_lang, "--tgt_lang", args.tgt_lang,
               "--limit", str(args.limit),
               "--decode-repeats", str(args.decode_repeats)]  # fmt: skip
    n = len(_read_split(args, args.src_lang))
    print(
        f"{args.split}, {n} sentences; each engine in processes of its own "
        f"(--decode-processes {args.decode_processes}, --decode-repeats {args.decode_repeats} "
        "timed calls each; ratio: median of the rounds' ratios)"
    )
    print("| search | engine | sent/s | BLEU | ratio | against |")
    print("| --- | --- | --- | --- | --- | --- |")
    for beam in (1, 5):
        engines = [e for e in DECODING_ENGINES if "bf16" not in e or "bf16" in names]
        runs: dict[str, list[dict]] = {name: [] for name in engines}
        for r in range(args.decode_processes):
            for name in engines[r % len(engines) :] + engines[: r % len(engines)]:
                run = command + ["--beam", str(beam), "--decode-worker", name]
                out = subprocess.run(run, capture_output=True, text=True, check=True)
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        speed = {k: statistics.median(x["sent_per_s"] for x in v) for k, v in runs.items()}
        for name in engines:
            ratio = against = ""
            if name in DECODING_PEERS:
                against = DECODING_PEERS[name]
                pairs = zip(runs[name], runs[against], strict=True)
                ratios = [a["sent_per_s"] / b["sent_per_s"] for a, b in pairs]
                ratio = f"{statistics.median(ratios):.2f}x"
            print(
                f"| {'greedy' if beam == 1 else f'beam {beam}'} | {name} | {speed[name]:.0f} | "
                f"{runs[name][-1]['bleu']:.2f} | {ratio} | {against} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=160, help="sentences per step")
    parser.add_argument("--length", type=int, default=16, help="source and target tokens")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved calls per measure")
    parser.add_argument(
        "--processes",
        type=int,
        default=3,
        help="single-dtype training processes per dtype (0: none, and no fit-like rows)",
    )
    parser.add_argument("--steps", type=int, default=8, help="timed steps per such process")
    parser.add_argument("--train-worker", choices=["float32", "bf16"], help=argparse.SUPPRESS)
    parser.add_argument("--varying-worker", choices=["float32", "bf16"], help=argparse.SUPPRESS)
    parser.add_argument("--no-buckets", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loop-adamw", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--varying-steps", type=int, default=20, help="timed steps per varying-shape process"
    )
    parser.add_argument("--max-tokens", type=int, default=4096, help="varying batches' budget")
    parser.add_argument("--profile", choices=["float32", "bf16"], default=None)
    parser.add_argument(
        "--dtypes",
        choices=["auto", "both", "float32"],
        default="auto",
        help="auto (default): bf16 too where the CPU has bf16 instructions; elsewhere they are "
        "emulated, and the bf16 rows alone would run for far more than an hour",
    )
    parser.add_argument("--ckpt", default=None, help="a trained checkpoint: also time decoding")
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--src_lang", default="de")
    parser.add_argument("--tgt_lang", default="en")
    parser.add_argument("--limit", type=int, default=500, help="sentences decoded (0: all)")
    parser.add_argument(
        "--decode-repeats", type=int, default=3, help="timed calls per decoding process"
    )
    parser.add_argument(
        "--decode-processes", type=int, default=3, help="processes per decoding engine and search"
    )
    parser.add_argument("--decode-worker", choices=DECODING_ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--export-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--beam", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.train_worker:
        train_worker(args)
        return
    if args.varying_worker:
        varying_worker(args)
        return
    if args.decode_worker:
        decode_worker(args)
        return
    step, tokens = training_step(args.batch, args.length)
    print(f"CPU: {cpu()}; {args.threads} threads; torch {torch.__version__}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        bf16 = args.profile == "bf16"
        for _ in range(2):
            step(bf16)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                step(bf16)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        return
    names = ("float32", "bf16") if measures_bf16(args) else ("float32",)
    if names == ("float32",):
        print(
            "float32 only: this CPU has no bfloat16 instructions (--dtypes both to time "
            "emulated bfloat16 too; its steps take seconds each)"
        )
    # The step, the square product and the step's own products alone, side by side: the
    # machine's speed drifts by a quarter within an hour, and each share pairs like with like.
    dtypes, shapes = {"float32": torch.float32, "bf16": torch.bfloat16}, step.products()
    calls, product_flops = {}, {}
    for k in names:
        calls[k] = partial(step, k == "bf16")
        calls[f"mm {k}"] = square_product(dtypes[k])
        calls[f"products {k}"], product_flops[k] = products_alone(shapes, dtypes[k])
    median = {k: statistics.median(t) for k, t in time_interleaved(calls, args.repeats, 2).items()}
    speed = {k: tokens / median[k] for k in names}
    rates = {k: 2 * 2048**3 / median[f"mm {k}"] / 1e9 for k in names}
    shape_rates = {k: product_flops[k] / median[f"products {k}"] / 1e9 for k in names}
    pair = {"float32": ("float32", []), "bf16": ("bf16", [])}
    own = {k: pair[k] for k in names}
    alone, alone_ratio = separate_process_rates(args, variants=own) if args.processes else ({}, 0)
    flops_per_token = step.flops() / tokens
    share = {k: flops_per_token * speed[k] / 1e9 / rates[k] for k in speed}
    shape_share = {k: flops_per_token * speed[k] / 1e9 / shape_rates[k] for k in speed}
    print(
        "model FLOPs per target token (FlopCounterMode, forward + backward): "
        f"{flops_per_token / 1e6:.1f} M"
    )

    def row(measure: str, values: dict, ratio: str | None = None, fmt: str = "{:.0f}") -> None:
        cells = [fmt.format(values[k]) if k in values else "-" for k in ("float32", "bf16")]
        if ratio is None and len(values) == 2 and fmt == "{:.0f}":
            ratio = f"{values['bf16'] / values['float32']:.2f}x"
        print(f"| {measure} | {cells[0]} | {cells[1]} | {ratio or ''} |")

    print("| measure | float32 | bf16 | bf16 / float32 |")
    print("| --- | --- | --- | --- |")
    row("torch.mm 2048^3 (GFLOP/s)", rates)
    step_name = f"README-size training step, B={args.batch}, S=T={args.length}"
    if alone:
        row(f"{step_name}, each dtype in its own process (target tokens/s; median of "
            f"{args.processes} each, ratio: median of pairs)", alone,
            f"{alone_ratio:.2f}x" if len(alone) == 2 else "")  # fmt: skip
        share_alone = {k: flops_per_token * alone[k] / 1e9 / rates[k] for k in alone}
        row("share of the dtype's torch.mm rate, own process", share_alone, fmt="{:.0%}")
    if args.processes > 0:
        variants = {
            "float32": ("float32", []),
            "bf16": ("bf16", []),
            "bf16 -row_buckets": ("bf16", ["--no-buckets"]),
            "float32, AdamW loop": ("float32", ["--loop-adamw"]),
            "bf16, AdamW loop": ("bf16", ["--loop-adamw"]),
        }
        variants = {k: v for k, v in variants.items() if v[0] in names}
        vary, vary_ratio = separate_process_rates(args, "--varying-worker", variants)
        both = {k: vary[k] for k in names}
        row(f"training step on fit-like batches of {args.max_tokens} tokens, a new shape every "
            f"step, each in its own process (target tokens/s; {args.processes} each)", both,
            f"{vary_ratio:.2f}x" if len(names) == 2 else "")  # fmt: skip
        if "bf16" in names:
            print(
                f"| the same, bf16 with `row_buckets` off | | {vary['bf16 -row_buckets']:.0f} | "
                f"{vary['bf16 -row_buckets'] / vary['float32']:.2f}x |"
            )
        loop = {k: vary[f"{k}, AdamW loop"] for k in names}
        cells = {k: f"{loop[k]:.0f} ({vary[k] / loop[k]:.3f}x)" for k in names}
        row("the same with AdamW's loop over the parameters, not `fused=True` (ratio: fused / "
            "loop)", cells, "", fmt="{}")  # fmt: skip
    row(f"{step_name}, both in one process, interleaved (target tokens/s)", speed)
    row("share of the dtype's torch.mm rate, one process", share, fmt="{:.0%}")
    row("torch.mm at the step's own product shapes, each product alone, one process (GFLOP/s)",
        shape_rates)  # fmt: skip
    row("share of that rate, one process", shape_share, fmt="{:.0%}")
    if args.ckpt:
        decoding(args, names)


if __name__ == "__main__":
    main()
