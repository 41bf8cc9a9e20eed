"""CPU speed of ``seq2seq.nn.Transformer`` against Hugging Face ``MarianMTModel``.

Both models are built from scratch (random weights) with the same sizes, timed side by side in
one process on the same batches, in float32 and in bfloat16 (``torch.autocast("cpu")`` for both):

* ``train``: target tokens/s of a training step (forward, label-smoothed cross entropy summed over
  target tokens and divided by their number, backward, AdamW step; dropout 0.1 on both).
* ``greedy`` / ``beam5``: sentences/s of batched decoding with a KV cache, every sentence forced
  to exactly ``--new-tokens`` generated tokens on both sides (EOS forbidden before that length,
  generation stopped at that length), so both run the same number of decoder steps.

Each repetition times ours and Marian once, in alternating order; the tables report medians and
the ratio ours / Marian. See ``benchmarks/README.md`` for what is matched and what is not.

Run ``python benchmarks/cpu_vs_marian.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # common.py; seq2seq from this checkout
from common import Row, format_table, time_interleaved, write_json  # noqa: E402

from seq2seq.nn import (  # noqa: E402
    DecodingConfig,
    Transformer,
    beam_search,
    greedy_search,
    linear_label_smoothed_cross_entropy,
    padding_mask,
)

PAD, UNK, BOS, EOS = 0, 1, 2, 3
FIRST_REAL = 4  # random ids are drawn from [FIRST_REAL, vocab)
MEASUREMENTS = ("train", "greedy", "beam")
GOALS = {"train": 1.3, "greedy": 2.0, "beam": 2.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("model (both systems)")
    g.add_argument("--d-model", type=int, default=256)
    g.add_argument("--n-heads", type=int, default=4)
    g.add_argument("--encoder-layers", type=int, default=3)
    g.add_argument("--decoder-layers", type=int, default=3)
    g.add_argument("--d-ff", type=int, default=1024)
    g.add_argument("--vocab", type=int, default=8000)
    g.add_argument("--activation", choices=("relu", "gelu"), default="relu")
    g.add_argument("--dropout", type=float, default=0.1)
    g.add_argument(
        "--post-ln",
        action="store_true",
        help="build ours Post-LN (norm_first=False), like Marian; default: ours Pre-LN",
    )
    g.add_argument(
        "--marian-attn",
        default="sdpa",
        help="Marian attn_implementation ('sdpa' or 'eager')",
    )
    g = p.add_argument_group("training")
    g.add_argument("--train-batch", type=int, default=64, help="sentences per batch")
    g.add_argument("--train-min-len", type=int, default=20, help="shortest sentence (tokens)")
    g.add_argument("--train-max-len", type=int, default=30, help="longest sentence (tokens)")
    g.add_argument("--train-batches", type=int, default=4, help="distinct batches, cycled")
    g.add_argument("--train-steps", type=int, default=2, help="steps per timed repetition")
    g.add_argument("--label-smoothing", type=float, default=0.1)
    g = p.add_argument_group("decoding")
    g.add_argument("--decode-batch", type=int, default=64, help="sentences per batch")
    g.add_argument("--src-min-len", type=int, default=20)
    g.add_argument("--src-max-len", type=int, default=30)
    g.add_argument("--new-tokens", type=int, default=32, help="forced output length")
    g.add_argument("--beam", type=int, default=5)
    g.add_argument(
        "--greedy-scores",
        action="store_true",
        help="ours: also compute greedy hypothesis scores (a log-softmax per step); default: "
        "tokens only, like Marian's generate without output_scores",
    )
    g = p.add_argument_group("run")
    g.add_argument(
        "--measurements", default=",".join(MEASUREMENTS), help=f"subset of {MEASUREMENTS}"
    )
    g.add_argument("--dtypes", default="float32,bfloat16", help="float32 and/or bfloat16")
    g.add_argument("--repeats", type=int, default=5, help="timed repetitions per system")
    g.add_argument("--warmup", type=int, default=1, help="untimed repetitions per system")
    g.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    g.add_argument(
        "--profile",
        choices=MEASUREMENTS,
        help="instead of timing, profile one repetition of this measurement (both systems, "
        "first dtype) with torch.profiler and print the hottest operators",
    )
    args = p.parse_args(argv)
    args.measurements = [m for m in args.measurements.split(",") if m]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    for m in args.measurements:
        if m not in MEASUREMENTS:
            p.error(f"unknown measurement {m!r}; choose from {MEASUREMENTS}")
    for d in args.dtypes:
        if d not in ("float32", "bfloat16"):
            p.error(f"unknown dtype {d!r}; choose float32 or bfloat16")
    return args


# --------------------------------------------------------------------------- models


def build_ours(args: argparse.Namespace) -> Transformer:
    return Transformer(
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_heads=args.n_heads,
        n_encoder_layers=args.encoder_layers,
        n_decoder_layers=args.decoder_layers,
        d_ff=args.d_ff,
        dropout=args.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation=args.activation,
        norm_first=not args.post_ln,
        positional="sinusoidal",
        max_positions=1024,
        tie_embeddings="all",
        pad_id=PAD,
    )


def build_marian(args: argparse.Namespace):
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=args.vocab,
        decoder_vocab_size=args.vocab,
        d_model=args.d_model,
        encoder_layers=args.encoder_layers,
        decoder_layers=args.decoder_layers,
        encoder_attention_heads=args.n_heads,
        decoder_attention_heads=args.n_heads,
        encoder_ffn_dim=args.d_ff,
        decoder_ffn_dim=args.d_ff,
        activation_function=args.activation,
        dropout=args.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=1024,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=None,
    )
    return MarianMTModel._from_config(config, attn_implementation=args.marian_attn)


def n_params(model: torch.nn.Module) -> int:
    """Trainable parameters (tied weights counted once; Marian's fixed positions excluded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- data


def random_ids(gen: torch.Generator, n: int, lo: int, hi: int, vocab: int) -> list[torch.Tensor]:
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    return [torch.randint(FIRST_REAL, vocab, (k,), generator=gen) for k in lengths]


def pad_batch(seqs: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=PAD)


def make_train_batches(args: argparse.Namespace, gen: torch.Generator) -> list[dict]:
    batches = []
    for _ in range(args.train_batches):
        lo, hi = args.train_min_len, args.train_max_len
        src = pad_batch(random_ids(gen, args.train_batch, lo, hi, args.vocab))
        tgt = random_ids(gen, args.train_batch, lo, hi, args.vocab)
        tgt_in = pad_batch([torch.cat([torch.tensor([BOS]), t]) for t in tgt])
        target = pad_batch([torch.cat([t, torch.tensor([EOS])]) for t in tgt])
        # Non-padding source and target positions, computed with the batch as seq2seq's
        # collate does: ours runs its feed-forward sub-layers and the output projection on
        # these rows only.
        index = (target.flatten() != PAD).nonzero().squeeze(1)
        batches.append(
            dict(
                src=src,
                src_index=(src.flatten() != PAD).nonzero().squeeze(1),
                tgt_in=tgt_in,
                target=target,
                tgt_index=index,
                n_tokens=int((target != PAD).sum()),
            )
        )
    return batches


# --------------------------------------------------------------------------- workloads


def autocast(dtype: str):
    if dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01
    )


def train_steps_ours(model, opt, batches, steps, dtype, eps, counter):
    model.train()
    for _ in range(steps):
        b = batches[counter[0] % len(batches)]
        counter[0] += 1
        opt.zero_grad(set_to_none=True)
        with autocast(dtype):
            # As TranslationModule trains: feed-forward sub-layers on real tokens only, decoder
            # states at the real target positions, output projection fused with the loss.
            hidden = model.features(
                b["src"],
                b["tgt_in"],
                padding_mask(b["src"], PAD),
                b["tgt_index"],
                src_index=b["src_index"],
                tgt_index=b["tgt_index"],
            )
            target = b["target"].flatten().index_select(0, b["tgt_index"])
            loss, _ = linear_label_smoothed_cross_entropy(
                hidden, model.output_weight, target, eps, ignore_index=PAD
            )
        (loss / b["n_tokens"]).backward()
        opt.step()


def train_steps_marian(model, opt, batches, steps, dtype, eps, counter):
    model.train()
    for _ in range(steps):
        b = batches[counter[0] % len(batches)]
        counter[0] += 1
        opt.zero_grad(set_to_none=True)
        with autocast(dtype):
            logits = model(
                input_ids=b["src"],
                attention_mask=(b["src"] != PAD).long(),
                decoder_input_ids=b["tgt_in"],
                use_cache=False,
            ).logits
            loss = F.cross_entropy(
                logits.float().flatten(0, 1),
                b["target"].flatten(),
                ignore_index=PAD,
                label_smoothing=eps,
                reduction="sum",
            )
        (loss / b["n_tokens"]).backward()
        opt.step()


def decode_ours(model, src, dtype, new_tokens, beam, greedy_scores=False):
    model.eval()
    mask = padding_mask(src, PAD)
    # max_len = a * src_len + b tokens (EOS included); min_len forbids EOS before N tokens.
    forced = DecodingConfig(
        beam_size=beam, length_penalty=1.0, max_len_a=0.0, max_len_b=new_tokens, min_len=new_tokens
    )
    with torch.inference_mode(), autocast(dtype):
        if beam == 1:
            return greedy_search(model, src, mask, BOS, EOS, forced, scores=greedy_scores)
        return beam_search(model, src, mask, BOS, EOS, forced)


def decode_marian(model, src, dtype, new_tokens, beam):
    model.eval()
    with torch.inference_mode(), autocast(dtype):
        return model.generate(
            input_ids=src,
            attention_mask=(src != PAD).long(),
            do_sample=False,
            num_beams=beam,
            num_return_sequences=1,
            length_penalty=1.0,
            early_stopping=False,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
            use_cache=True,
            decoder_start_token_id=BOS,
            bos_token_id=BOS,
            eos_token_id=EOS,
            pad_token_id=PAD,
            suppress_tokens=[PAD],  # ours never generates padding either
            forced_eos_token_id=None,
        )


def generated_lengths(ours_out, marian_out) -> tuple[set[int], set[int]]:
    ours = {len(hyps[0].tokens) for hyps in ours_out}
    marian = {int(n) for n in (marian_out[:, 1:] != PAD).sum(-1).tolist()}
    return ours, marian


# --------------------------------------------------------------------------- main


def workloads(args, dtype, ours, marian, batches, src):
    """measurement -> (ours callable, marian callable, work per call, unit)."""
    out = {}
    if "train" in args.measurements:
        opt_o, opt_m = adamw(ours), adamw(marian)
        eps, steps = args.label_smoothing, args.train_steps
        c_o, c_m = [0], [0]  # step counters: both systems see the same batch sequence
        out["train"] = (
            lambda: train_steps_ours(ours, opt_o, batches, steps, dtype, eps, c_o),
            lambda: train_steps_marian(marian, opt_m, batches, steps, dtype, eps, c_m),
            None,  # tokens per call vary: see train_rate
            "tgt tok/s",
        )
    n = args.new_tokens
    if "greedy" in args.measurements:
        out["greedy"] = (
            lambda: decode_ours(ours, src, dtype, n, 1, args.greedy_scores),
            lambda: decode_marian(marian, src, dtype, n, 1),
            src.size(0),
            "sent/s",
        )
    if "beam" in args.measurements:
        out["beam"] = (
            lambda: decode_ours(ours, src, dtype, n, args.beam),
            lambda: decode_marian(marian, src, dtype, n, args.beam),
            src.size(0),
            "sent/s",
        )
    return out


def train_rate(batches, steps, warmup, times) -> float:
    """Median target tokens/s of the timed calls (the calls cycle through the batches)."""
    rates = []
    for call, seconds in enumerate(times, start=warmup):
        ids = range(call * steps, (call + 1) * steps)
        rates.append(sum(batches[i % len(batches)]["n_tokens"] for i in ids) / seconds)
    return statistics.median(rates)


def profile(args, ours, marian, batches, src) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    dtype = args.dtypes[0]
    fn_o, fn_m, _, _ = workloads(args, dtype, ours, marian, batches, src)[args.profile]
    for name, fn in (("ours", fn_o), ("marian", fn_m)):
        fn()  # warm-up
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        print(f"\n=== {name} / {dtype} / {args.profile}: top operators by self CPU time ===")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    ours, marian = build_ours(args), build_marian(args)
    gen = torch.Generator().manual_seed(args.seed)
    batches = make_train_batches(args, gen)
    src = pad_batch(
        random_ids(gen, args.decode_batch, args.src_min_len, args.src_max_len, args.vocab)
    )

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    meta = dict(
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=platform.python_version(),
        cpu=cpu,
        cpu_count=os.cpu_count(),
        threads=torch.get_num_threads(),
        marian_attn_implementation=marian.config._attn_implementation,
        ours_norm="post-ln" if args.post_ln else "pre-ln",
        params_ours=n_params(ours),
        params_marian=n_params(marian),
        args={k: v for k, v in vars(args).items() if k != "json"},
    )
    print(
        f"torch {meta['torch']}, transformers {meta['transformers']}, {cpu}, "
        f"{meta['threads']} threads"
    )
    print(
        f"model: d_model {args.d_model}, heads {args.n_heads}, layers "
        f"{args.encoder_layers}+{args.decoder_layers}, d_ff {args.d_ff}, vocab {args.vocab}, "
        f"{args.activation}, tied embeddings; ours {meta['ours_norm']} "
        f"({meta['params_ours']:,} params); Marian post-ln, "
        f"attn={meta['marian_attn_implementation']} ({meta['params_marian']:,} params)"
    )
    train_tokens = [b["n_tokens"] for b in batches]
    print(
        f"train: {args.train_batches} batches x {args.train_batch} sentences, "
        f"{args.train_min_len}-{args.train_max_len} tokens (+BOS/EOS), target tokens per batch "
        f"{train_tokens}, {args.train_steps} steps per repetition"
    )
    print(
        f"decode: {args.decode_batch} sentences of {args.src_min_len}-{args.src_max_len} "
        f"source tokens, exactly {args.new_tokens} new tokens forced, beam {args.beam}; "
        f"{args.repeats} interleaved repetitions after {args.warmup} warm-up, median"
    )

    if args.profile:
        profile(args, ours, marian, batches, src)
        return

    rows: list[Row] = []
    checks = {}
    start = time.perf_counter()
    for dtype in args.dtypes:
        for measurement, (fn_o, fn_m, work, unit) in workloads(
            args, dtype, ours, marian, batches, src
        ).items():
            warmup = args.warmup
            if measurement in ("greedy", "beam"):  # check the forced length (first warm-up)
                warmup = max(0, warmup - 1)
                beam = 1 if measurement == "greedy" else args.beam
                lo, lm = generated_lengths(
                    decode_ours(ours, src, dtype, args.new_tokens, beam),
                    decode_marian(marian, src, dtype, args.new_tokens, beam),
                )
                checks[f"{dtype}/{measurement}"] = dict(
                    ours_lengths=sorted(lo), marian_lengths=sorted(lm)
                )
                if lo != {args.new_tokens} or lm != {args.new_tokens}:
                    print(
                        f"WARNING {dtype}/{measurement}: generated lengths ours {sorted(lo)}, "
                        f"marian {sorted(lm)}, expected {args.new_tokens}"
                    )
            times = time_interleaved({"ours": fn_o, "marian": fn_m}, args.repeats, warmup)
            values = {}
            for system in ("ours", "marian"):
                if measurement == "train":
                    values[system] = train_rate(
                        batches, args.train_steps, args.warmup, times[system]
                    )
                else:
                    values[system] = work / statistics.median(times[system])
            ratio = values["ours"] / values["marian"]
            label = f"beam{args.beam}" if measurement == "beam" else measurement
            rows.append(
                Row(
                    "ours",
                    dtype,
                    label,
                    values["ours"],
                    unit,
                    ratio,
                    GOALS[measurement],
                    times["ours"],
                )
            )
            rows.append(
                Row("marian", dtype, label, values["marian"], unit, None, None, times["marian"])
            )
            print(
                f"  {dtype:8s} {label:6s} ours {values['ours']:9.1f}  marian "
                f"{values['marian']:9.1f} {unit}  ratio {ratio:.2f}x  "
                f"({time.perf_counter() - start:.0f}s elapsed)",
                flush=True,
            )
    meta["forced_length_checks"] = checks
    meta["wall_s"] = round(time.perf_counter() - start, 1)
    print()
    print(format_table(rows, ratio_header="ratio ours/marian"))
    if args.json:
        write_json(args.json, rows, **meta)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
