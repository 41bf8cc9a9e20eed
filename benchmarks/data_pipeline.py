"""Data pipeline at scale: tokenisation throughput, cache reuse and memory while training.

Builds :class:`~seq2seq.data.datamodule.TranslationDataModule` on a synthetic parallel corpus
of ``--pairs`` sentence pairs (random words from a fixed vocabulary, 5-40 words per sentence,
target lengths within 3 words of the source's; aligned ``train.src`` / ``train.tgt`` files,
optionally gzip-compressed) and reports:

* ``prepare_data`` time and throughput (pairs/s): SentencePiece training on a sample of
  ``--spm-sample`` sentences (``spm_input_sentence_size``), then tokenising every split and
  caching it as Arrow through ``datasets``;
* the time of a second ``prepare_data`` on a fresh data module (the cache is reused, so it
  should be close to zero beyond hashing the corpus files);
* the peak RSS of the process that ran ``prepare_data`` (``VmHWM``);
* resident memory (RSS) before and after iterating the train dataloader for one epoch (or
  ``--max-batches`` batches), and the peak RSS during the iteration, in a fresh process
  that only runs ``setup("fit")`` and the loader, as a training run would. Its peak counter
  (``VmHWM`` in ``/proc/self/status``) is reset through ``/proc/self/clear_refs`` after
  setup, so the peak covers the iteration alone (the peak of setup is reported too). RSS
  counts the pages of the memory-mapped Arrow cache that have been read (``RssFile``:
  shared with the page cache, reclaimable) besides private memory (``RssAnon``, sampled
  every 100 batches for its peak); both are shown. The goal is a peak under 2 GB while
  iterating, because the tokenised corpus stays memory-mapped instead of being loaded.

With ``--streaming`` the data module streams the training split instead
(``TranslationDataModule(streaming=True)``): ``prepare_data`` only trains SentencePiece on the
first ``--spm-sample`` pairs of the stream and caches the held-out split, and the fresh
process reads, tokenises and batches the training files pool by pool while it iterates; its
throughput (training pairs read per second) and memory are reported the same way.

Run from the repository root::

    python benchmarks/data_pipeline.py                      # 2,000,000 pairs
    python benchmarks/data_pipeline.py --pairs 200000 --json results.json
    python benchmarks/data_pipeline.py --workdir /tmp/pipe --gzip --max-batches 2000
    python benchmarks/data_pipeline.py --streaming --pool-size 100000 --workers 1
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from seq2seq.data.datamodule import TranslationDataModule

GOAL_PEAK_BYTES = 2 * 1024**3


def memory() -> dict[str, int]:
    """Bytes of ``VmRSS`` (resident), ``VmHWM`` (its peak since start or the last reset),
    ``RssAnon`` (private memory) and ``RssFile`` (file pages mapped in, e.g. the memory-mapped
    Arrow cache; shared with the page cache and reclaimable) from ``/proc/self/status``."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def reset_peak_rss() -> bool:
    """Resets ``VmHWM`` to the current RSS (Linux >= 4.0); False if not permitted."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def write_corpus(root: Path, pairs: int, compress: bool, seed: int, n_words: int) -> None:
    """Writes ``train`` (``pairs`` lines) and ``val`` (1,000 lines) as aligned src/tgt files."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = {
        side: np.array(["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(n_words)])
        for side in ("src", "tgt")
    }
    root.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if compress else ""
    opener = gzip.open if compress else open
    for split, n in (("train", pairs), ("val", 1000)):
        # Target lengths follow source lengths (+-3 words), as in real translations.
        src_lengths = rng.integers(5, 41, n)
        tgt_lengths = np.clip(src_lengths + rng.integers(-3, 4, n), 5, 40)
        for side, side_lengths in (("src", src_lengths), ("tgt", tgt_lengths)):
            path = root / f"{split}.{side}{suffix}"
            with opener(path, "wt", encoding="utf-8") as out:
                for start in range(0, n, 50_000):
                    lengths = side_lengths[start : start + 50_000]
                    ids = rng.integers(0, n_words, int(lengths.sum()))
                    tokens = words[side][ids]
                    ends = np.cumsum(lengths)
                    out.write(
                        "".join(
                            " ".join(tokens[e - k : e]) + "\n"
                            for e, k in zip(ends.tolist(), lengths.tolist(), strict=True)
                        )
                    )


def make_dm(args: argparse.Namespace, data: Path, cache: Path) -> TranslationDataModule:
    return TranslationDataModule(
        data_dir=str(data),
        src_lang="src",
        tgt_lang="tgt",
        test_splits=[],
        vocab_size=args.vocab_size,
        spm_input_sentence_size=args.spm_sample,
        cache_dir=str(cache),
        max_tokens=args.max_tokens,
        download=False,
        num_workers=args.workers,
        streaming=args.streaming,
        stream_pool_size=args.pool_size,
    )


def iterate(args: argparse.Namespace, data: Path, cache: Path) -> dict[str, float]:
    """Sets up the cached data module and iterates the train loader; returns memory figures."""
    dm = make_dm(args, data, cache)
    dm.setup("fit")
    loader = dm.train_dataloader()
    n_total = None if args.streaming else len(loader)  # a stream has no length
    limit = args.max_batches or n_total
    setup = memory()
    peak_reset = reset_peak_rss()
    before = memory()
    peak_anon = before["RssAnon"]
    start = time.perf_counter()
    n_batches = n_sentences = n_tokens = 0
    for batch in loader:
        n_batches += 1
        n_sentences += len(batch["index"])
        n_tokens += batch["n_tokens"]
        if n_batches % 100 == 0:
            peak_anon = max(peak_anon, memory()["RssAnon"])
        if limit and n_batches >= limit:
            break
    t_iter = time.perf_counter() - start
    after = memory()
    counts = dm.train_set.last_counts if args.streaming else None
    return {
        "epoch_batches": n_total if n_total is not None else n_batches,
        "pairs_read": counts["pairs"] if counts else None,
        "iter_batches": n_batches,
        "iter_sentences": n_sentences,
        "iter_target_tokens": n_tokens,
        "iter_s": t_iter,
        "peak_rss_setup_bytes": setup["VmHWM"],
        "rss_before_bytes": before["VmRSS"],
        "rss_anon_before_bytes": before["RssAnon"],
        "rss_file_before_bytes": before["RssFile"],
        "rss_after_bytes": after["VmRSS"],
        "rss_anon_after_bytes": after["RssAnon"],
        "rss_file_after_bytes": after["RssFile"],
        "peak_rss_iter_bytes": after["VmHWM"],
        "peak_rss_iter_is_lifetime": not peak_reset,
        "peak_rss_anon_iter_bytes": max(peak_anon, after["RssAnon"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2_000_000, help="training sentence pairs")
    parser.add_argument("--workdir", type=Path, help="folder for corpus and cache (kept)")
    parser.add_argument("--gzip", action="store_true", help="write the corpus gzip-compressed")
    parser.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece pieces")
    parser.add_argument("--words", type=int, default=20_000, help="words per side's vocabulary")
    parser.add_argument(
        "--spm-sample", type=int, default=200_000, help="spm_input_sentence_size (0: all)"
    )
    parser.add_argument("--max-tokens", type=int, default=4096, help="token budget per batch")
    parser.add_argument(
        "--max-batches", type=int, default=0, help="stop iterating after this many (0: epoch)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--streaming", action="store_true", help="stream the training split (no train cache)"
    )
    parser.add_argument("--pool-size", type=int, default=100_000, help="stream_pool_size")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="seq2seq_pipeline_"))
    data, cache = workdir / "corpus", workdir / "cache"
    try:
        start = time.perf_counter()
        write_corpus(data, args.pairs, args.gzip, args.seed, args.words)
        t_write = time.perf_counter() - start
        corpus_bytes = sum(p.stat().st_size for p in data.iterdir())

        dm = make_dm(args, data, cache)
        start = time.perf_counter()
        dm.prepare_data()
        t_prepare = time.perf_counter() - start

        dm2 = make_dm(args, data, cache)
        start = time.perf_counter()
        dm2.prepare_data()
        t_prepare_again = time.perf_counter() - start

        peak_prepare = memory()["VmHWM"]
        del dm, dm2
        # A fresh process, as a training run would be: the parent's heap still holds what
        # prepare_data allocated (and freed without returning it to the system).
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            it = pool.submit(iterate, args, data, cache).result()
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    gib = 1024**3

    def gb(n: int) -> str:
        return f"{n / gib:.2f} GiB"

    rows = [
        (
            "corpus written",
            f"{args.pairs:,} pairs, {corpus_bytes / gib:.2f} GiB",
            f"{t_write:.1f} s",
        ),
        (
            "prepare_data (spm on the stream's head, cache val)"
            if args.streaming
            else "prepare_data (spm + tokenise + cache)",
            "" if args.streaming else f"{args.pairs / t_prepare:,.0f} pairs/s",
            f"{t_prepare:.1f} s",
        ),
        ("prepare_data again (cache reuse)", "", f"{t_prepare_again:.2f} s"),
        ("peak RSS of the prepare_data process", f"{peak_prepare / gib:.2f} GiB", ""),
        (
            ("streamed" if args.streaming else "train") + " loader (fresh process)",
            f"{it['iter_batches']:,} of {it['epoch_batches']:,} batches, "
            f"{it['iter_sentences']:,} pairs",
            f"{it['iter_s']:.1f} s",
        ),
        (
            "  throughput (kept pairs yielded per second)",
            f"{it['iter_sentences'] / it['iter_s']:,.0f} pairs/s",
            "",
        ),
        ("peak RSS of setup('fit') in that process", gb(it["peak_rss_setup_bytes"]), ""),
        (
            "RSS before iterating (private + file-mapped)",
            gb(it["rss_before_bytes"]),
            f"{gb(it['rss_anon_before_bytes'])} + {gb(it['rss_file_before_bytes'])}",
        ),
        (
            "RSS after iterating (private + file-mapped)",
            gb(it["rss_after_bytes"]),
            f"{gb(it['rss_anon_after_bytes'])} + {gb(it['rss_file_after_bytes'])}",
        ),
        (
            "peak RSS while iterating"
            + (" (not reset: lifetime)" if it["peak_rss_iter_is_lifetime"] else ""),
            gb(it["peak_rss_iter_bytes"]),
            "goal < 2 GiB: " + ("met" if it["peak_rss_iter_bytes"] < GOAL_PEAK_BYTES else "missed"),
        ),
        (
            "peak private RSS while iterating (sampled)",
            gb(it["peak_rss_anon_iter_bytes"]),
            "goal < 2 GiB: "
            + ("met" if it["peak_rss_anon_iter_bytes"] < GOAL_PEAK_BYTES else "missed"),
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    if args.json:
        results = {
            "pairs": args.pairs,
            "gzip": args.gzip,
            "corpus_bytes": corpus_bytes,
            "spm_input_sentence_size": args.spm_sample,
            "vocab_size": args.vocab_size,
            "max_tokens": args.max_tokens,
            "streaming": args.streaming,
            "stream_pool_size": args.pool_size,
            "num_workers": args.workers,
            "iter_pairs_per_s": it["iter_sentences"] / it["iter_s"],
            "write_s": t_write,
            "prepare_s": t_prepare,
            "prepare_pairs_per_s": args.pairs / t_prepare,
            "prepare_again_s": t_prepare_again,
            "peak_rss_prepare_bytes": peak_prepare,
            **it,
        }
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
