"""Ablation of the speed tricks of ``seq2seq.nn``: each one switched off alone, end to end.

Every variant is one callable; all variants of a measurement are timed interleaved in one
process (``common.time_interleaved``), on the README config's sizes and workloads of
``cpu_vs_marian.py`` (``build_ours``, ``make_train_batches``, ``decode_ours``):

* ``train``: target tokens/s of ``--train-steps`` training steps (float32);
* ``greedy``, ``beam``: sentences/s of forced-length decoding of 64 sentences (float32);
* ``one``: sentences/s of forced-length greedy decoding of the first of them alone (float32),
  as a translation service or ``translate`` of one line at a time decodes.

``--package`` names the ``seq2seq.nn`` to measure (e.g. a copy of an older tree importable as
``oldnn`` from ``--path``). Two kinds of variants exist:

* for the tree that still holds every trick inline (the layout before ``nn/fast.py``), a trick
  is switched off by replacing the function that carries it with its plain counterpart
  (``--tricks inline``);
* for a tree with ``nn/fast.py``, ``fast.enabled(False)`` switches all kept tricks off at once
  (``--tricks seam``).

``--compare OLD`` times the whole change instead: ``OLD`` (a package name on ``--path``) against
``--package`` with its kept tricks on, and with them off, side by side.

Run ``python benchmarks/ablation.py --help``; results go to stdout and ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import cpu_vs_marian as cvm  # noqa: E402
from common import time_interleaved  # noqa: E402

MEASUREMENTS = ("train", "greedy", "beam", "one")
"""``one``: greedy search of one sentence alone (the batch's first), a request at a time."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", default="seq2seq.nn", help="the nn package to measure")
    p.add_argument("--path", action="append", default=[], help="prepend to sys.path")
    p.add_argument("--tricks", choices=("inline", "seam"), default="seam")
    p.add_argument("--compare", metavar="OLD", help="time package OLD against --package")
    p.add_argument(
        "--compare-tricks",
        choices=("inline", "seam"),
        default="inline",
        help="how OLD holds its tricks: inline (before nn/fast.py) or behind nn/fast.py",
    )
    p.add_argument("--measurements", default=",".join(MEASUREMENTS))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", metavar="PATH")
    args, rest = p.parse_known_args(argv)
    # Model and workload sizes: cpu_vs_marian's options and defaults (the README config).
    args.sizes = cvm.parse_args(rest)
    args.measurements = [m for m in args.measurements.split(",") if m]
    return args


# --------------------------------------------------------------------------- workloads


def train_fn(nn, model, batches, sizes, fused: bool = True, real_rows: bool = True) -> Callable:
    """``--train-steps`` steps as ``TranslationModule`` trains (see cpu_vs_marian)."""
    opt = cvm.adamw(model)
    counter = [0]
    eps = sizes.label_smoothing

    def run() -> None:
        model.train()
        for _ in range(sizes.train_steps):
            b = batches[counter[0] % len(batches)]
            counter[0] += 1
            opt.zero_grad(set_to_none=True)
            index = b["tgt_index"]
            rows = dict(src_index=b["src_index"], tgt_index=index) if real_rows else {}
            hidden = model.features(
                b["src"], b["tgt_in"], nn.padding_mask(b["src"], cvm.PAD), index, **rows
            )
            target = b["target"].flatten().index_select(0, index)
            if fused:
                loss, _ = nn.linear_label_smoothed_cross_entropy(
                    hidden, model.output_weight, target, eps, ignore_index=cvm.PAD
                )
            else:  # the plain counterpart: (N, V) logits, then PyTorch's cross entropy
                logits = F.linear(hidden, model.output_weight)
                loss = F.cross_entropy(logits.float(), target, label_smoothing=eps, reduction="sum")
            (loss / b["n_tokens"]).backward()
            opt.step()

    return run


def decode_workload(measurement: str, src, sizes) -> tuple[torch.Tensor, int]:
    """``(source rows, beam size)`` of a decoding measurement."""
    if measurement == "one":
        return src[:1], 1
    return src, 1 if measurement == "greedy" else sizes.beam


def decode_fn(nn, model, src, sizes, beam: int) -> Callable:
    """Forced-length decoding (as cpu_vs_marian) with package ``nn``'s own searches, which take
    a ``DecodingConfig`` or, in trees before it, the settings as keyword arguments."""
    n = sizes.new_tokens
    mask = nn.padding_mask(src, cvm.PAD)
    if hasattr(nn, "DecodingConfig"):
        config = nn.DecodingConfig(beam_size=beam, max_len_a=0.0, max_len_b=n, min_len=n)
        settings, args = {}, (config,)
    else:
        settings, args = dict(max_len_a=0.0, max_len_b=n, min_len=n, length_penalty=1.0), ()
        settings |= {} if beam == 1 else {"beam_size": beam}

    def run() -> None:
        model.eval()
        with torch.inference_mode():
            if beam == 1:
                nn.greedy_search(
                    model, src, mask, cvm.BOS, cvm.EOS, *args, scores=False, **settings
                )
            else:
                nn.beam_search(model, src, mask, cvm.BOS, cvm.EOS, *args, **settings)

    return run


# --------------------------------------------------------------------------- inline tricks


@contextlib.contextmanager
def patched(obj, name: str, value) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def inline_tricks(
    nn,
) -> dict[str, tuple[tuple[str, ...], Callable[[], contextlib.AbstractContextManager]]]:
    """name -> (measurements it touches, context manager that switches it off) for the tree
    in which every trick is inline (``attention.py``, ``layers.py``, ``search.py``,
    ``linear.py`` of the layout before ``nn/fast.py``)."""
    layers = importlib.import_module(f"{nn.__name__}.layers")
    linear = importlib.import_module(f"{nn.__name__}.linear")
    search = importlib.import_module(f"{nn.__name__}.search")
    transformer = importlib.import_module(f"{nn.__name__}.transformer")

    def plain_dropout(self, x):
        return F.dropout(x, self.p, training=self.training)

    def decode_without_step(self, tgt, memory, src_mask=None, cache=None, output_index=None):
        h = self._states(tgt, memory, src_mask, cache, output_index)
        logits = linear.linear(h, self.output.weight, packed=self._packed_output)
        return logits[..., : self.vocab_size]

    def identity_slots(parent):
        a, k = parent.shape
        return torch.arange(k, device=parent.device).expand(a, k)

    def encode_all_rows(model, src, src_mask):
        return model.encode(src, src_mask)

    return {
        "custom Dropout": (("train",), lambda: patched(layers.Dropout, "forward", plain_dropout)),
        "oneDNN Linear": (MEASUREMENTS, lambda: patched(linear, "_ONEDNN", False)),
        "step paths": (
            ("greedy", "beam"),
            lambda: patched(transformer.Transformer, "decode", decode_without_step),
        ),
        "block-wise arg-max": (
            ("greedy",),
            lambda: patched(search, "_argmax", lambda x: x.argmax(dim=-1)),
        ),
        "block-wise top-k": (
            ("beam",),
            lambda: patched(search, "_topk", lambda x, n: x.topk(n, dim=-1)),
        ),
        "slot-in-place beams": (
            ("beam",),
            lambda: patched(search, "_slots_in_place", identity_slots),
        ),
        "feed-forward on real rows": (
            ("greedy", "beam"),  # train: its own variant (train_fn real_rows=False)
            lambda: patched(search, "_encode", encode_all_rows),
        ),
    }


def variants_inline(nn, model, batches, src, sizes, measurement) -> dict[str, Callable]:
    """All tricks on, each trick off alone, all off."""
    tricks = {n: off for n, (where, off) in inline_tricks(nn).items() if measurement in where}
    if measurement == "train":
        base = train_fn(nn, model, batches, sizes)
        extra = {
            "- fused projection+loss": train_fn(nn, model, batches, sizes, fused=False),
            "- feed-forward on real rows": train_fn(nn, model, batches, sizes, real_rows=False),
        }
        plain = train_fn(nn, model, batches, sizes, fused=False, real_rows=False)
    else:
        rows, beam = decode_workload(measurement, src, sizes)
        base = decode_fn(nn, model, rows, sizes, beam)
        extra, plain = {}, base

    def with_off(fn, offs):
        def run():
            with contextlib.ExitStack() as stack:
                for off in offs:
                    stack.enter_context(off())
                fn()

        return run

    fns = {"all tricks on": base}
    fns.update({f"- {name}": with_off(base, [off]) for name, off in tricks.items()})
    fns.update(extra)
    fns["all tricks off"] = with_off(plain, list(tricks.values()))
    return fns


def variants_seam(nn, model, batches, src, sizes, measurement) -> dict[str, Callable]:
    """The tree with ``nn/fast.py``: all kept tricks on, each off alone, all off."""
    fast = importlib.import_module(f"{nn.__name__}.fast")
    if measurement == "train":

        def step(**off):
            # fused_loss and real_rows are the caller's choice (as TranslationModule makes it)
            fused = "fused_loss" not in off.get("names", ())
            rows = "real_rows" not in off.get("names", ())
            return train_fn(nn, model, batches, sizes, fused=fused, real_rows=rows)

        tricks = ("dropout", "linear", "fused_loss", "real_rows")
    else:
        rows, beam = decode_workload(measurement, src, sizes)
        tricks = ("linear", "small_rows", "one_query", "step")
        if beam > 1:
            tricks = ("linear", "small_rows", "one_query", "step", "topk", "cache", "slots")

        def step(**off):
            return decode_fn(nn, model, rows, sizes, beam)

    def without(names):
        fn = step(names=names)

        def run():
            with fast.enabled(False, *names):
                fn()

        return run

    fns = {"fast on": step()}
    fns.update({f"- {name}": without((name,)) for name in tricks})
    fns["fast off (plain path)"] = without(fast.TRICKS)
    return fns


# --------------------------------------------------------------------------- main


def build(nn, sizes):
    torch.manual_seed(sizes.seed)
    saved = cvm.Transformer
    cvm.Transformer = nn.Transformer  # build_ours with this package's class
    try:
        return cvm.build_ours(sizes)
    finally:
        cvm.Transformer = saved


def rate(measurement, times, batches, sizes) -> float:
    median = statistics.median(times)
    if measurement == "train":
        tokens = sum(b["n_tokens"] for b in batches) / len(batches) * sizes.train_steps
        return tokens / median
    return (1 if measurement == "one" else sizes.decode_batch) / median


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sys.path[:0] = args.path
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = args.sizes
    nn = importlib.import_module(args.package)
    gen = torch.Generator().manual_seed(sizes.seed)
    batches = cvm.make_train_batches(sizes, gen)
    src = cvm.pad_batch(
        cvm.random_ids(gen, sizes.decode_batch, sizes.src_min_len, sizes.src_max_len, sizes.vocab)
    )
    rows = []
    unit = {"train": "tgt tok/s", "greedy": "sent/s", "beam": "sent/s", "one": "sent/s"}
    print(f"threads {torch.get_num_threads()}, repeats {args.repeats}, package {args.package}")
    for measurement in args.measurements:
        if args.compare:
            # Same weights in both trees: the old model's state dict loads into the new one.
            old_nn = importlib.import_module(args.compare)
            old_model, new_model = build(old_nn, sizes), build(nn, sizes)
            new_model.load_state_dict(old_model.state_dict())
            if args.compare_tricks == "inline":
                old_fns = variants_inline(old_nn, old_model, batches, src, sizes, measurement)
                before = old_fns["all tricks on"]
            else:
                old_fns = variants_seam(old_nn, old_model, batches, src, sizes, measurement)
                before = old_fns["fast on"]
            new_fns = variants_seam(nn, new_model, batches, src, sizes, measurement)
            fns = {"before": before}
            fns["after, fast on"] = new_fns["fast on"]
            fns["after, fast off (plain path)"] = new_fns["fast off (plain path)"]
        else:
            model = build(nn, sizes)
            make = variants_inline if args.tricks == "inline" else variants_seam
            fns = make(nn, model, batches, src, sizes, measurement)
        times = time_interleaved(fns, args.repeats, args.warmup)
        base_name = next(iter(fns))
        base = rate(measurement, times[base_name], batches, sizes)
        print(f"\n{measurement} ({unit[measurement]}, median of {args.repeats}; spread = min-max)")
        for name, ts in times.items():
            value = rate(measurement, ts, batches, sizes)
            spread = (max(ts) - min(ts)) / statistics.median(ts)
            print(f"  {name:34s} {value:10.1f}  {value / base:6.3f}x  spread {spread:5.1%}")
            row = dict(measurement=measurement, variant=name, value=value, ratio=value / base)
            rows.append(row | {"unit": unit[measurement], "times_s": ts})
        sys.stdout.flush()
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k != "sizes"} | {"sizes": vars(sizes)}
        meta["threads"] = torch.get_num_threads()
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
