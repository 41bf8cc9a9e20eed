"""One-GPU benchmark of seq2seq against Hugging Face ``MarianMTModel``, under a wall-clock budget.

Sections (``--sections``, run in this order; E always runs last):

* A  environment and the measured bf16 matmul rate (8192^3 ``torch.matmul``, CUDA events,
  median of 10 after 3 warm-ups), the denominator of every MFU figure.
* B  training throughput of a Transformer-base (d_model 512, 6+6 layers, 8 heads, d_ff 2048,
  joint vocabulary 32000, tied embeddings, dropout 0.1) on random batches of 800 sentences
  padded to 32 tokens: bf16 autocast, float32 weights, fused AdamW, label-smoothed (0.1) loss
  summed and divided by the target tokens. Ours and Marian, eager and ``torch.compile``, on the
  same batches, timed side by side; FLOPs of one eager forward+backward counted with
  ``FlopCounterMode`` give the MFU. "ours eager" computes all ``(B, T, V)`` logits; "ours
  fused" trains as ``TranslationModule`` does in eager mode (feed-forward sub-layers on real
  tokens, output projection fused with the loss over 4096-row chunks; eager only).
* C  decoding throughput: 256 random source sentences of 24-32 tokens, exactly 32 generated
  tokens each, greedy and beam 5, bf16 weights, eval mode, KV cache, sentences/s.
* D  time to quality: ``seq2seq fit`` then ``seq2seq test`` (beam 5) with
  ``configs/multi30k_de_en_gpu.yaml`` on Multi30k, sacreBLEU and chrF on test_2016_flickr.
* E  the summary table.

Every section runs under its own time cap (SIGALRM) inside a try/except: a failure or a time-out
prints its traceback and the next section runs. The whole run keeps to ``--budget_s`` seconds
(counted from the start of the process): section D trains for whatever the earlier sections
left (at most 270 s) unless ``--train_seconds`` is given. Results are printed as they come and
written to ``--out``: ``gpu_h200.log`` (everything printed here), ``gpu_h200.json`` (rows and
metadata, rewritten after every result) and ``gpu_h200.md`` (the summary).

``--smoke`` runs every code path on the CPU with tiny sizes in a few minutes (compile included).

    python benchmarks/gpu_h200.py --out results/ --smoke --data_dir ../shared/data/multi30k
    python benchmarks/gpu_h200.py --out "$OUT"          # on the GPU, data in .gpudata/multi30k
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch._dynamo
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]  # common.py, cpu_vs_marian.py; seq2seq from this checkout
from common import Row, format_table, time_interleaved, write_json  # noqa: E402
from cpu_vs_marian import (  # noqa: E402
    BOS,
    EOS,
    PAD,
    build_marian,
    build_ours,
    decode_marian,
    decode_ours,
    generated_lengths,
    n_params,
    pad_batch,
    random_ids,
    train_rate,
)

from seq2seq.nn import (  # noqa: E402
    label_smoothed_cross_entropy,
    linear_label_smoothed_cross_entropy,
    padding_mask,
)

SECTIONS = ("A", "B", "C", "D")
GPU_CONFIG = REPO / "configs" / "multi30k_de_en_gpu.yaml"
MULTI30K_FILES = [
    f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr") for lang in "de en".split()
]
D_RESERVE_S = 55.0  # section D outside training: tokenizer, data, start-up, checkpoints, test
MAX_TRAIN_S = 270.0


@dataclass(frozen=True)
class Sizes:
    """Model, batch and timing sizes of sections A-D (full run or ``--smoke``)."""

    matmul_n: int = 8192
    vocab: int = 32000
    d_model: int = 512
    n_heads: int = 8
    layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    label_smoothing: float = 0.1
    train_batch: int = 800
    train_len: int = 32  # every batch is padded to this many tokens (one compiled shape)
    src_min_len: int = 28
    train_batches: int = 4  # distinct batches, cycled
    train_steps: int = 4  # training steps per timed call
    decode_batch: int = 256
    decode_min_len: int = 24
    decode_max_len: int = 32
    new_tokens: int = 32
    beam: int = 5
    timing_s: float = 15.0  # target length of one interleaved timing phase
    compile_cap_s: float = 75.0  # hard cap on one model's compile warm-up
    caps: tuple = (("A", 20.0), ("B", 150.0), ("C", 60.0))


FULL = Sizes()
SMOKE = replace(
    FULL,
    matmul_n=512,
    vocab=1000,
    d_model=64,
    n_heads=4,
    layers=1,
    d_ff=128,
    train_batch=16,
    train_len=12,
    src_min_len=8,
    train_batches=2,
    train_steps=2,
    decode_batch=8,
    decode_min_len=6,
    decode_max_len=10,
    new_tokens=6,
    timing_s=2.0,
    compile_cap_s=90.0,
    caps=(("A", 15.0), ("B", 150.0), ("C", 30.0)),
)
# Section D in --smoke: a tiny model on CPU, a handful of batches, two held-out batches.
SMOKE_FIT_OVERRIDES = [
    "--trainer.accelerator=cpu",
    "--trainer.max_epochs=2",
    "--trainer.limit_train_batches=6",
    "--trainer.limit_val_batches=2",
    "--trainer.limit_test_batches=2",
    "--trainer.check_val_every_n_epoch=1",
    "--model.d_model=64",
    "--model.n_heads=2",
    "--model.n_encoder_layers=1",
    "--model.n_decoder_layers=1",
    "--model.d_ff=128",
    "--data.max_tokens=1024",
    "--data.eval_max_tokens=2048",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, help="folder for the log, JSON and markdown results")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {SECTIONS}")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, every code path")
    p.add_argument(
        "--train_seconds",
        type=float,
        default=None,
        help="training time of section D (default: what the budget leaves, at most "
        f"{MAX_TRAIN_S:.0f} s; 20 s with --smoke)",
    )
    p.add_argument("--data_dir", default=".gpudata/multi30k", help="the six Multi30k .gz files")
    p.add_argument(
        "--budget_s",
        type=float,
        default=None,
        help="wall-clock budget of the whole run, from process start (default 440; 240 --smoke)",
    )
    p.add_argument("--no_compile", action="store_true", help="skip torch.compile in section B")
    p.add_argument(
        "--compile_backend",
        default=None,
        help="torch.compile backend of section B (default inductor; aot_eager with --smoke: "
        "dynamo and AOTAutograd without the slow C++ code generation of CPU inductor)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="run torch._dynamo.explain on both models in section B (always with --smoke)",
    )
    args = p.parse_args(argv)
    args.sections = [s.strip().upper() for s in args.sections.split(",") if s.strip()]
    for s in args.sections:
        if s not in SECTIONS:
            p.error(f"unknown section {s!r}; choose from {SECTIONS}")
    if args.budget_s is None:
        args.budget_s = 240.0 if args.smoke else 440.0
    args.explain = args.explain or args.smoke
    if args.compile_backend is None:
        args.compile_backend = "aot_eager" if args.smoke else "inductor"
    return args


# --------------------------------------------------------------------------- run bookkeeping


def _process_age() -> float:
    """Seconds since this process started (Linux), so the budget covers the imports too."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = float(stat.rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class TimeLimit(BaseException):
    """Raised (from SIGALRM) in a capped block that ran past its deadline.

    A ``BaseException``, so that ``except Exception`` inside libraries does not swallow it.
    """

    def __init__(self, label: str) -> None:
        super().__init__(f"time cap of {label!r} reached")
        self.label = label


class Terminated(BaseException):
    """SIGTERM received: stop, but still print and save the summary."""


class Caps:
    """Nested wall-clock caps on blocks of code, enforced with ``SIGALRM`` (main thread).

    When several caps are due, the outermost one is raised, so it passes through the handlers
    of inner blocks (which catch only their own label).
    """

    def __init__(self) -> None:
        self._stack: list[list] = []
        signal.signal(signal.SIGALRM, self._fire)

    def _fire(self, signum, frame) -> None:
        now = time.monotonic()
        for deadline, label in self._stack:
            if deadline <= now + 1e-3:
                raise TimeLimit(label)
        self._arm()

    def _arm(self) -> None:
        if not self._stack:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return
        delay = min(d for d, _ in self._stack) - time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-3))

    @contextlib.contextmanager
    def cap(self, seconds: float, label: str):
        entry = [time.monotonic() + max(seconds, 0.01), label]
        self._stack.append(entry)
        self._arm()
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._stack = [e for e in self._stack if e is not entry]
            self._arm()


class Report:
    """Prints results as they come and keeps ``gpu_h200.{log,json,md}`` in ``out`` up to date."""

    def __init__(self, out: str, budget_s: float) -> None:
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "gpu_h200.log"
        self.json_path = self.dir / "gpu_h200.json"
        self.md_path = self.dir / "gpu_h200.md"
        self.t0 = time.perf_counter() - _process_age()
        self.budget_s = budget_s
        self.rows: list[Row] = []
        self.meta: dict = {"sections": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def say(self, *lines: object) -> None:
        text = "\n".join(str(line) for line in lines)
        print(text, flush=True)
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(text + "\n")

    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)
        self.save()

    def put(self, section: str, **values: object) -> None:
        self.meta.setdefault(section, {}).update(values)
        self.save()

    def save(self) -> None:
        tmp = self.json_path.with_suffix(".json.tmp")
        self.meta["elapsed_s"] = round(self.elapsed(), 1)
        try:
            write_json(str(tmp), self.rows, **self.meta)
            os.replace(tmp, self.json_path)
        except (OSError, TypeError, ValueError) as e:  # never let bookkeeping stop a section
            print(f"(could not write {self.json_path}: {e})", flush=True)


@dataclass
class Context:
    args: argparse.Namespace
    sizes: Sizes
    device: torch.device
    report: Report
    caps: Caps
    matmul_flops: float | None = None  # measured bf16 FLOP/s (section A)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def amp(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def cap_left(self, label: str) -> float:
        """Seconds left before the cap named ``label`` (inf if it is not active)."""
        for deadline, name in self.caps._stack:
            if name == label:
                return deadline - time.monotonic()
        return float("inf")


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fit_repeats(per_call_s: float, seconds: float, lo: int = 3, hi: int = 10) -> int:
    """Timed repetitions that fit ``seconds`` when one repetition takes ``per_call_s``."""
    return int(max(lo, min(hi, seconds // max(per_call_s, 1e-6))))


def timed(ctx: Context, fn) -> float:
    ctx.sync()
    start = time.perf_counter()
    fn()
    ctx.sync()
    return time.perf_counter() - start


# --------------------------------------------------------------------------- A: environment


def section_a(ctx: Context) -> None:
    import lightning
    import transformers

    r = ctx.report
    env = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        transformers=transformers.__version__,
        lightning=lightning.__version__,
        device=str(ctx.device),
        cpu_count=os.cpu_count(),
        threads=torch.get_num_threads(),
    )
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        env.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
        )
    else:
        env["gpu"] = f"none (CPU: {platform.processor() or platform.machine()})"
    r.put("env", **env)
    r.say(*(f"  {k}: {v}" for k, v in env.items()))

    n = ctx.sizes.matmul_n
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    a = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16, generator=gen)
    for _ in range(3):
        torch.matmul(a, b)
    ctx.sync()
    times = []
    for _ in range(10):
        if ctx.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            times.append(timed(ctx, lambda: torch.matmul(a, b)))
    rate = 2.0 * n**3 / statistics.median(times)
    ctx.matmul_flops = rate
    r.put("matmul", n=n, tflops=round(rate / 1e12, 2), times_s=times)
    r.add(Row("torch.matmul", "bf16", f"{n}^3 matmul", rate / 1e12, "TFLOP/s", times_s=times))
    r.say(f"  bf16 matmul {n}x{n}x{n}: {rate / 1e12:,.1f} TFLOP/s (median of 10, MFU denominator)")


# --------------------------------------------------------------------------- B: training


def model_args(s: Sizes) -> argparse.Namespace:
    """The options ``cpu_vs_marian.build_ours`` / ``build_marian`` read."""
    return argparse.Namespace(
        vocab=s.vocab,
        d_model=s.d_model,
        n_heads=s.n_heads,
        encoder_layers=s.layers,
        decoder_layers=s.layers,
        d_ff=s.d_ff,
        activation="relu",
        dropout=s.dropout,
        post_ln=False,
        marian_attn="sdpa",
    )


def pad_to(x: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(x, (0, length - x.size(1)), value=PAD)


def make_train_batches(s: Sizes, device: torch.device) -> list[dict]:
    """Random batches, every tensor ``(train_batch, train_len)``: sources of ``src_min_len`` to
    ``train_len`` tokens, targets of ``src_min_len - 1`` to ``train_len - 1`` tokens plus BOS
    (decoder input) or EOS (labels), right-padded."""
    gen = torch.Generator().manual_seed(0)
    n, length = s.train_batch, s.train_len
    batches = []
    for _ in range(s.train_batches):
        src = pad_to(pad_batch(random_ids(gen, n, s.src_min_len, length, s.vocab)), length)
        tgt = random_ids(gen, n, s.src_min_len - 1, length - 1, s.vocab)
        tgt_in = pad_to(pad_batch([torch.cat([torch.tensor([BOS]), t]) for t in tgt]), length)
        target = pad_to(pad_batch([torch.cat([t, torch.tensor([EOS])]) for t in tgt]), length)
        batches.append(
            dict(
                src=src.to(device),
                # Real-token positions, computed on the host as seq2seq's collate does.
                src_index=(src.flatten() != PAD).nonzero().squeeze(1).to(device),
                tgt_index=(target.flatten() != PAD).nonzero().squeeze(1).to(device),
                src_mask=padding_mask(src, PAD).to(device),
                attention_mask=(src != PAD).long().to(device),
                tgt_in=tgt_in.to(device),
                target=target.to(device),
                n_tokens=int((target != PAD).sum()),
            )
        )
    return batches


def fused_adamw(model: torch.nn.Module, report: Report) -> torch.optim.Optimizer:
    kwargs = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)
    try:
        return torch.optim.AdamW(model.parameters(), fused=True, **kwargs)
    except (RuntimeError, ValueError) as e:
        report.say(f"  fused AdamW unavailable ({e}); using the default implementation")
        return torch.optim.AdamW(model.parameters(), **kwargs)


def loss_ours(fwd, b: dict, eps: float) -> torch.Tensor:
    logits = fwd(b["src"], b["tgt_in"], b["src_mask"])
    loss, _ = label_smoothed_cross_entropy(logits, b["target"], eps, ignore_index=PAD)
    return loss


def loss_ours_fused(model, b: dict, eps: float) -> torch.Tensor:
    """As ``TranslationModule`` trains in eager mode: feed-forward sub-layers on real tokens,
    decoder states at the real target positions, output projection fused with the loss."""
    index = b["tgt_index"]
    hidden = model.features(
        b["src"], b["tgt_in"], b["src_mask"], index, src_index=b["src_index"], tgt_index=index
    )
    target = b["target"].flatten().index_select(0, index)
    loss, _ = linear_label_smoothed_cross_entropy(
        hidden, model.output_weight, target, eps, ignore_index=PAD
    )
    return loss


def loss_marian(fwd, b: dict, eps: float) -> torch.Tensor:
    logits = fwd(
        input_ids=b["src"],
        attention_mask=b["attention_mask"],
        decoder_input_ids=b["tgt_in"],
        use_cache=False,
    ).logits
    return F.cross_entropy(
        logits.float().flatten(0, 1),
        b["target"].flatten(),
        ignore_index=PAD,
        label_smoothing=eps,
        reduction="sum",
    )


class Trainer:
    """``steps`` training steps per call over the shared batches (one system, one variant)."""

    def __init__(self, ctx: Context, loss_fn, fwd, opt, batches: list[dict]) -> None:
        self.ctx, self.loss_fn, self.fwd, self.opt, self.batches = ctx, loss_fn, fwd, opt, batches
        self.counter = 0

    def step(self, optimizer_step: bool = True) -> None:
        b = self.batches[self.counter % len(self.batches)]
        self.counter += 1
        self.opt.zero_grad(set_to_none=True)
        with self.ctx.amp():
            loss = self.loss_fn(self.fwd, b, self.ctx.sizes.label_smoothing)
        (loss / b["n_tokens"]).backward()
        if optimizer_step:
            self.opt.step()

    def __call__(self) -> None:
        for _ in range(self.ctx.sizes.train_steps):
            self.step()


def count_flops(ctx: Context, trainer: Trainer) -> float:
    """FLOPs of one eager forward + backward (no optimizer step)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        trainer.step(optimizer_step=False)
    ctx.sync()
    return float(counter.get_total_flops())


def explain(ctx: Context, name: str, fn, *args, **kwargs) -> None:
    """Print the graph count and graph-break reasons torch._dynamo finds in ``fn``."""
    start = time.perf_counter()
    with ctx.amp():
        ex = torch._dynamo.explain(fn)(*args, **kwargs)
    reasons = sorted({str(b.reason).strip().splitlines()[0][:300] for b in ex.break_reasons})
    ctx.report.put("B", **{f"explain_{name}": dict(graphs=ex.graph_count, breaks=reasons)})
    ctx.report.say(
        f"  dynamo explain {name}: {ex.graph_count} graph(s), {ex.graph_break_count} graph "
        f"break(s) ({time.perf_counter() - start:.1f} s)"
        + "".join(f"\n    break: {reason}" for reason in reasons)
    )
    torch._dynamo.reset()


def compile_warmup(ctx: Context, name: str, trainer: Trainer) -> float | None:
    """First steps of a compiled model (forward and backward compilation), under a hard cap.

    Returns the duration of the first step, or ``None`` if compilation failed or ran too long.
    """
    from torch._dynamo.utils import counters

    r = ctx.report
    cap = min(ctx.sizes.compile_cap_s, ctx.cap_left("B") - 20.0)
    if cap < 5:
        r.say(f"  {name}: no time left to compile, skipped")
        return None
    counters.clear()
    label = f"compile {name}"
    start = time.perf_counter()
    try:
        with ctx.caps.cap(cap, label):
            first = timed(ctx, trainer.step)
            second = timed(ctx, trainer.step)
    except TimeLimit as e:
        if e.label != label:
            raise
        r.say(f"  {name}: compile warm-up passed its {cap:.0f} s cap; dropped")
        r.put("B", **{f"compile_{name}": f"over {cap:.0f} s cap"})
        return None
    except Exception:
        r.say(f"  {name}: compile failed; dropped", traceback.format_exc())
        r.put("B", **{f"compile_{name}": "failed"})
        return None
    breaks = {str(k)[:300]: v for k, v in counters["graph_break"].items()}
    graphs = counters["stats"].get("unique_graphs", 0)
    r.put("B", **{f"compile_{name}": dict(first_step_s=first, graphs=graphs, breaks=breaks)})
    r.say(
        f"  {name}: compile warm-up {time.perf_counter() - start:.1f} s (first step "
        f"{first:.1f} s, second {second:.3f} s), {graphs} graph(s), "
        f"{sum(breaks.values())} graph break(s)"
        + "".join(f"\n    break x{v}: {k}" for k, v in breaks.items())
    )
    return first


def time_trainers(ctx: Context, trainers: dict[str, Trainer], seconds: float, per_call: dict):
    """Interleaved timing; returns name -> (median tokens/s, times)."""
    repeats = fit_repeats(sum(per_call[n] for n in trainers), seconds)
    for t in trainers.values():
        t.counter = 0
    times = time_interleaved(trainers, repeats, warmup=0, device=ctx.device)
    steps = ctx.sizes.train_steps
    return {
        name: (train_rate(t.batches, steps, 0, times[name]), times[name])
        for name, t in trainers.items()
    }


def section_b(ctx: Context) -> None:
    try:
        train_throughput(ctx)
    finally:
        torch._dynamo.reset()  # drop the compiled graphs (and their references to the models)


def train_throughput(ctx: Context) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    r, s = ctx.report, ctx.sizes
    margs = model_args(s)
    torch.manual_seed(0)
    ours = build_ours(margs).to(ctx.device).train()
    marian = build_marian(margs).to(ctx.device).train()
    batches = make_train_batches(s, ctx.device)
    tokens = [b["n_tokens"] for b in batches]
    r.put(
        "B",
        params_ours=n_params(ours),
        params_marian=n_params(marian),
        batch=f"{s.train_batch} x {s.train_len}",
        target_tokens_per_batch=tokens,
        steps_per_call=s.train_steps,
    )
    r.say(
        f"  models: d_model {s.d_model}, {s.n_heads} heads, {s.layers}+{s.layers} layers, d_ff "
        f"{s.d_ff}, vocab {s.vocab}, tied; ours Pre-LN {n_params(ours):,} params, Marian "
        f"Post-LN {n_params(marian):,} params",
        f"  batches: {s.train_batches} x {s.train_batch} sentences padded to {s.train_len}, "
        f"target tokens {tokens}; {s.train_steps} steps per timed call; bf16 autocast, fused AdamW",
    )
    opt_o, opt_m = fused_adamw(ours, r), fused_adamw(marian, r)
    eager = {
        "ours eager": Trainer(ctx, loss_ours, ours, opt_o, batches),
        "ours fused": Trainer(ctx, loss_ours_fused, ours, opt_o, batches),
        "marian eager": Trainer(ctx, loss_marian, marian, opt_m, batches),
    }
    base = {"ours eager": "ours", "ours fused": "ours fused", "marian eager": "marian"}

    # FLOPs of one eager forward + backward each (also the first warm-up step). "ours fused"
    # skips padding rows, so it counts fewer FLOPs for the same batch: its MFU is computed on
    # its own count.
    flops = {}
    for name, t in eager.items():
        flops[base[name]] = count_flops(ctx, t)
        r.say(f"  {base[name]}: {flops[base[name]] / 1e9:,.1f} GFLOP per forward+backward")
    r.put("B", tflop_per_step={k: v / 1e12 for k, v in flops.items()})

    if ctx.args.explain:
        b = batches[0]
        explain(ctx, "ours", ours, b["src"], b["tgt_in"], b["src_mask"])
        explain(
            ctx,
            "marian",
            marian,
            input_ids=b["src"],
            attention_mask=b["attention_mask"],
            decoder_input_ids=b["tgt_in"],
            use_cache=False,
        )

    # Eager: warm-up, then timed side by side (the fallback result if compilation fails).
    per_call = {}
    for name, t in eager.items():
        timed(ctx, t)
        per_call[name] = timed(ctx, t)
    results = time_trainers(ctx, eager, s.timing_s * 0.6, per_call)
    record_train(ctx, results, flops, base, phase="eager")

    if ctx.args.no_compile:
        r.say("  --no_compile: compiled variants skipped")
        return
    compiled = {
        "ours compiled": Trainer(
            ctx, loss_ours, torch.compile(ours, dynamic=False), opt_o, batches
        ),
        "marian compiled": Trainer(
            ctx, loss_marian, torch.compile(marian, dynamic=False), opt_m, batches
        ),
    }
    base.update({"ours compiled": "ours", "marian compiled": "marian"})
    for name, t in list(compiled.items()):
        if compile_warmup(ctx, name, t) is None:
            del compiled[name]
            continue
        per_call[name] = timed(ctx, t)
    if not compiled:
        return
    everything = {**eager, **compiled}
    seconds = min(s.timing_s, ctx.cap_left("B") - 5.0)
    results = time_trainers(ctx, everything, seconds, per_call)
    record_train(ctx, results, flops, base, phase="all")


def record_train(ctx: Context, results: dict, flops: dict, base: dict, phase: str) -> None:
    """Rows (tokens/s with ratio to Marian eager, MFU) of one timing phase."""
    r, s = ctx.report, ctx.sizes
    ref = results["marian eager"][0]
    rows = []
    lines = [f"  timing ({phase}, {len(next(iter(results.values()))[1])} interleaved calls):"]
    for name, (rate, times) in results.items():
        mfu = None
        if ctx.matmul_flops:
            mfu = flops[base[name]] * s.train_steps / statistics.median(times) / ctx.matmul_flops
        goal = 1.5 if name.startswith("ours") else None
        rows.append(Row(name, "bf16-amp", "train", rate, "tgt tok/s", rate / ref, goal, times))
        if mfu is not None:
            rows.append(Row(name, "bf16-amp", "train MFU", 100 * mfu, "%"))
        lines.append(
            f"    {name:16s} {rate:12,.0f} tgt tok/s  {rate / ref:5.2f}x marian eager"
            + ("" if mfu is None else f"  MFU {100 * mfu:5.1f}%")
        )
    if "ours compiled" in results and "marian compiled" in results:
        ratio = results["ours compiled"][0] / results["marian compiled"][0]
        lines.append(f"    ours compiled / marian compiled: {ratio:.2f}x")
        r.put("B", ours_compiled_over_marian_compiled=ratio)
    if phase == "all":  # the side-by-side run of all four replaces the eager-only rows
        r.rows = [row for row in r.rows if not row.measurement.startswith("train")]
    r.add(*rows)
    r.put("B", **{f"phase_{phase}": {k: v[0] for k, v in results.items()}})
    r.say(*lines)


# --------------------------------------------------------------------------- C: decoding


def section_c(ctx: Context) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    r, s = ctx.report, ctx.sizes
    margs = model_args(s)
    torch.manual_seed(0)
    # bf16 weights for both (no autocast): decode_ours/decode_marian get dtype "float32", which
    # in cpu_vs_marian means "no CPU autocast context".
    ours = build_ours(margs).to(ctx.device, torch.bfloat16).eval()
    marian = build_marian(margs).to(ctx.device, torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(1)
    ids = random_ids(gen, s.decode_batch, s.decode_min_len, s.decode_max_len, s.vocab)
    src = pad_batch(ids).to(ctx.device)
    n = s.new_tokens
    r.say(
        f"  {s.decode_batch} sentences of {s.decode_min_len}-{s.decode_max_len} source tokens, "
        f"exactly {n} new tokens, bf16 weights, eval, inference_mode, KV cache"
    )
    for label, beam in (("greedy", 1), (f"beam{s.beam}", s.beam)):
        fns = {
            "ours": lambda beam=beam: decode_ours(ours, src, "float32", n, beam),
            "marian": lambda beam=beam: decode_marian(marian, src, "float32", n, beam),
        }
        lo, lm = generated_lengths(fns["ours"](), fns["marian"]())  # first warm-up call
        if lo != {n} or lm != {n}:
            r.say(f"  WARNING {label}: lengths ours {sorted(lo)}, marian {sorted(lm)}, want {n}")
        per_call = sum(timed(ctx, fn) for fn in fns.values())
        left = ctx.cap_left("C") - 3.0
        seconds = min(left * (0.45 if label == "greedy" else 0.9), 10.0)
        repeats = fit_repeats(per_call, seconds, lo=2, hi=5)
        times = time_interleaved(fns, repeats, warmup=0, device=ctx.device)
        rate = {k: s.decode_batch / statistics.median(v) for k, v in times.items()}
        ratio = rate["ours"] / rate["marian"]
        r.add(
            Row("ours", "bf16", label, rate["ours"], "sent/s", ratio, 2.0, times["ours"]),
            Row("marian", "bf16", label, rate["marian"], "sent/s", 1.0, None, times["marian"]),
        )
        r.put("C", **{label: dict(rate, ratio=ratio, lengths_ok=lo == {n} and lm == {n})})
        r.say(
            f"  {label:7s} ours {rate['ours']:9.1f}  marian {rate['marian']:9.1f} sent/s  "
            f"ratio {ratio:.2f}x  ({repeats} interleaved calls)"
        )


# --------------------------------------------------------------------------- D: quality


def _max_time(seconds: float) -> str:
    s = max(1, int(seconds))
    return f"00:{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def run_cli(cli_main, argv: list[str]):
    """``cli_main(argv)`` with this script's own options hidden from LightningCLI."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        return cli_main(argv)
    finally:
        sys.argv = saved


def section_d(ctx: Context, train_s: float) -> None:
    from lightning.pytorch.callbacks import Timer

    from seq2seq.cli import cli_main

    r, args = ctx.report, ctx.args
    data_dir = Path(args.data_dir)
    missing = [f for f in MULTI30K_FILES if not (data_dir / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{data_dir} lacks {missing}")
    common = [
        f"--config={GPU_CONFIG}",
        f"--data.data_dir={data_dir}",
        "--data.download=false",
    ]
    if not any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")):
        logger = dict(
            class_path="lightning.pytorch.loggers.CSVLogger",
            init_args=dict(save_dir="lightning_logs", name="multi30k_de_en_gpu"),
        )
        common.append(f"--trainer.logger={json.dumps(logger)}")
        r.say("  no tensorboard installed: logging with CSVLogger instead")
    if args.smoke:
        common += SMOKE_FIT_OVERRIDES
    r.say(f"  seq2seq fit for at most {train_s:.0f} s of training ({_max_time(train_s)})")
    r.put("D", train_seconds_budget=train_s, config=str(GPU_CONFIG.relative_to(REPO)))
    start = time.perf_counter()
    cli = run_cli(cli_main, ["fit", *common, f"--trainer.max_time={_max_time(train_s)}"])
    fit_wall = time.perf_counter() - start
    trainer = cli.trainer
    timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)
    ckpt = trainer.checkpoint_callback
    best = ckpt.best_model_path or ckpt.last_model_path
    best_val = ckpt.best_model_score
    fit = dict(
        fit_wall_s=round(fit_wall, 1),
        train_s=round(timer.time_elapsed("train"), 1) if timer else None,
        validate_s=round(timer.time_elapsed("validate"), 1) if timer else None,
        epochs=trainer.current_epoch,
        steps=trainer.global_step,
        best_val_bleu=None if best_val is None else round(float(best_val), 2),
        best_checkpoint=best,
    )
    r.put("D", **fit)
    r.say(
        f"  fit: {fit['epochs']} epochs, {fit['steps']} steps, training {fit['train_s']} s "
        f"(validation {fit['validate_s']} s), {fit_wall:.1f} s in all; best val BLEU "
        f"{fit['best_val_bleu']} ({best})"
    )
    del cli, trainer, timer, ckpt
    free_memory()
    if not best:
        raise RuntimeError("fit saved no checkpoint")
    start = time.perf_counter()
    cli = run_cli(cli_main, ["test", *common, f"--ckpt_path={best}"])
    scores = next((v for k, v in cli.model.last_scores.items() if "test_2016_flickr" in k), None)
    if scores is None and cli.model.last_scores:
        scores = next(iter(cli.model.last_scores.values()))
    test = dict(test_wall_s=round(time.perf_counter() - start, 1))
    for name, score in (scores or {}).items():
        test[name] = dict(value=score.value, text=score.text, signature=score.signature)
    r.put("D", **test)
    if "bleu" in test:
        bleu = test["bleu"]
        r.add(Row("ours", "bf16-amp", "test_2016_flickr BLEU", bleu["value"], "BLEU", None))
        r.say(f"  test_2016_flickr (beam 5): {bleu['text']}", f"    signature: {bleu['signature']}")
    if "chrf" in test:
        r.add(Row("ours", "bf16-amp", "test_2016_flickr chrF", test["chrf"]["value"], "chrF"))
        r.say(f"  {test['chrf']['text']}  ({test['chrf']['signature']})")
    del cli
    free_memory()


# --------------------------------------------------------------------------- E: summary


def summary(ctx: Context) -> str:
    r, m = ctx.report, ctx.report.meta
    env = m.get("env", {})
    lines = [
        "# seq2seq vs MarianMT on one GPU",
        "",
        f"GPU: {env.get('gpu', '?')}; torch {env.get('torch', torch.__version__)} "
        f"(CUDA {env.get('cuda')}), transformers {env.get('transformers', '?')}, "
        f"lightning {env.get('lightning', '?')}; bf16 matmul "
        f"{m.get('matmul', {}).get('tflops', '?')} TFLOP/s (MFU denominator)"
        + ("; SMOKE RUN (CPU, tiny sizes)" if ctx.args.smoke else ""),
        "",
        "```",
        format_table(r.rows, ratio_header="ratio ours/marian") if r.rows else "(no timing results)",
        "```",
        "",
        "train ratios are against Marian eager (goal: ours >= 1.5x, and ahead of compiled Marian; "
        "MFU goal >= 30%); decoding goal: ours >= 2x Marian.",
    ]
    b = m.get("B", {})
    if "ours_compiled_over_marian_compiled" in b:
        lines.append(
            f"ours compiled / marian compiled: {b['ours_compiled_over_marian_compiled']:.2f}x"
        )
    d = m.get("D", {})
    if d:
        bleu = d.get("bleu", {})
        chrf = d.get("chrf", {})
        lines += [
            "",
            f"Multi30k de-en ({d.get('config')}): {d.get('epochs')} epochs / {d.get('steps')} "
            f"steps in {d.get('train_s')} s of training ({d.get('fit_wall_s')} s fit in all), "
            f"best val BLEU (greedy) {d.get('best_val_bleu')}",
            f"test_2016_flickr beam 5: {bleu.get('text', 'n/a')}",
            f"  signature: {bleu.get('signature', 'n/a')}",
            f"  {chrf.get('text', 'chrF n/a')}  {chrf.get('signature', '')}",
        ]
    lines += ["", "sections:"]
    for name, info in m["sections"].items():
        lines.append(f"  {name}: {info['status']} in {info['seconds']} s")
    lines.append(f"total wall time: {r.elapsed():.0f} s of a {r.budget_s:.0f} s budget")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def run_section(ctx: Context, name: str, fn, cap_s: float) -> None:
    r = ctx.report
    r.say(
        f"\n=== {name}: cap {cap_s:.0f} s; {r.elapsed():.0f} s elapsed, {r.left():.0f} s left ==="
    )
    start = time.perf_counter()
    status = "ok"
    try:
        with ctx.caps.cap(cap_s, name):
            fn(ctx)
    except TimeLimit as e:
        status = f"stopped: {e}"
        r.say(f"  {name} {status}", traceback.format_exc(limit=-3))
    except (Exception, SystemExit) as e:
        status = f"failed: {type(e).__name__}: {str(e)[:300]}"
        r.say(f"  {name} {status}", traceback.format_exc())
    finally:
        seconds = round(time.perf_counter() - start, 1)
        r.meta["sections"][name] = dict(status=status, seconds=seconds)
        if ctx.cuda:
            r.meta["sections"][name]["max_gpu_memory_gib"] = round(
                torch.cuda.max_memory_allocated(ctx.device) / 2**30, 1
            )
        r.save()
        r.say(f"--- {name}: {status} ({seconds} s)")
        free_memory()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = Report(args.out, args.budget_s)
    if not args.smoke and not torch.cuda.is_available():
        report.say("no CUDA device: run with --smoke on a CPU")
        sys.exit(2)
    sizes = SMOKE if args.smoke else FULL
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.set_float32_matmul_precision("high")

    def on_term(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    ctx = Context(args, sizes, device, report, Caps())
    report.meta.update(
        argv=sys.argv[1:] if argv is None else list(argv), smoke=args.smoke, budget_s=args.budget_s
    )
    report.say(
        f"gpu_h200 benchmark: sections {','.join(args.sections)}, budget {args.budget_s:.0f} s, "
        f"{'SMOKE (CPU, tiny sizes)' if args.smoke else 'full'}, out {report.dir}"
    )
    caps = dict(sizes.caps)
    sections = {"A": section_a, "B": section_b, "C": section_c}
    try:
        for name in args.sections:
            if name in sections:
                cap = min(caps[name], report.left() - 10.0)
                if cap < 3:
                    report.say(f"\n=== {name}: skipped, budget spent ===")
                    continue
                run_section(ctx, name, sections[name], cap)
            elif name == "D":
                if args.train_seconds is not None:
                    train_s = args.train_seconds
                elif args.smoke:
                    train_s = 20.0
                else:
                    train_s = min(MAX_TRAIN_S, report.left() - D_RESERVE_S - 5.0)
                if train_s < 20:
                    report.say(f"\n=== D: skipped, {report.left():.0f} s left is too little ===")
                    continue
                run_section(
                    ctx, "D", lambda c, t=train_s: section_d(c, t), train_s + D_RESERVE_S + 90
                )
    except (KeyboardInterrupt, Terminated):
        report.say("\ninterrupted: summary of what finished")
    finally:
        text = summary(ctx)
        report.say("\n=== E: summary ===", text)
        report.md_path.write_text(text + "\n", encoding="utf-8")
        report.save()
        report.say(f"\nwrote {report.log_path}, {report.json_path}, {report.md_path}")


if __name__ == "__main__":
    main()
