"""Single-query attention products over a time-major and a batch-major self-attention cache.

One decoding step of self-attention reads, for every row and head, the ``L`` cached keys and
values: ``q K^T`` then ``p V`` as batched matrix products (``torch.bmm``). This script times those
two products over the two layouts a preallocated cache can have, side by side in one process:

* batch-major ``(B, H, capacity, Dh)``, each row's prefix ``[:L]`` a ``(L, Dh)`` block with a
  gap of ``capacity - L`` positions before the next row's;
* time-major ``(capacity, B, H, Dh)`` (``seq2seq.nn.fast.TimeMajorKVCache``, beam search), the
  prefix ``[:L]`` one contiguous block and each row's keys a ``(L, Dh)`` matrix with row stride
  ``B * H * Dh``.

Between timed calls a pass over ``--evict-mb`` MB of other memory pushes the cache out of the CPU's
caches, as the rest of a decoder step (weights, cross-attention keys and values, the output
projection) does in a real decoding loop. ``--evict-mb 0`` times warm caches.

Run ``python benchmarks/kv_cache_layout.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--batch", type=int, default=64, help="rows B (sentences x beams)")
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=32, help="capacity; L runs over 1..steps")
    p.add_argument("--repeats", type=int, default=30, help="timed calls per layout and L")
    p.add_argument("--evict-mb", type=float, default=48.0, help="memory read between calls")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b, h, dh, cap = args.batch, args.n_heads, args.head_dim, args.steps
    rows = b * h
    batch_major = [torch.randn(b, h, cap, dh) for _ in "kv"]
    time_major = [torch.randn(cap, b, h, dh) for _ in "kv"]
    evict = torch.randn(max(1, int(args.evict_mb * 2**20 / 4)))
    q = torch.randn(rows, 1, dh)

    def views(layout: str, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        if layout == "batch-major":  # (B, H, L, Dh) -> (B * H, L, Dh), a view
            return tuple(t[:, :, :length].flatten(0, 1) for t in batch_major)
        return tuple(t[:length].permute(1, 2, 0, 3).flatten(0, 1) for t in time_major)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(args.repeats):
            if args.evict_mb:
                evict.sum()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={b}, H={h}, Dh={dh}, "
        f"capacity {cap}, {args.evict_mb:g} MB read between calls, median of {args.repeats}"
    )
    print(f"{'L':>3}  {'batch-major us':>14}  {'time-major us':>13}  ratio")
    totals = {"batch-major": 0.0, "time-major": 0.0}
    for length in range(1, cap + 1):
        probs = torch.randn(rows, 1, length).softmax(-1)
        row = {}
        for layout in totals:
            keys, values = views(layout, length)
            row[layout] = timed(
                lambda k=keys, v=values, p=probs: (torch.bmm(q, k.transpose(1, 2)), torch.bmm(p, v))
            )
            totals[layout] += row[layout]
        print(
            f"{length:>3}  {row['batch-major']:>14.1f}  {row['time-major']:>13.1f}  "
            f"{row['batch-major'] / row['time-major']:.2f}x"
        )
    print(
        f"sum over L=1..{cap}: batch-major {totals['batch-major'] / 1000:.2f} ms, time-major "
        f"{totals['time-major'] / 1000:.2f} ms, ratio "
        f"{totals['batch-major'] / totals['time-major']:.2f}x (batch-major / time-major)"
    )


if __name__ == "__main__":
    main()
