"""Corpus filtering by the model's score (``seq2seq score``): how well the sum and the mean per
piece of a translation's log-probability tell clean pairs from noise.

Clean pairs (a held-out set) are mixed with noisy ones made from other lines of the same set:
misaligned (a target from another line), untranslated (the source copied as target), garbage
(random characters) and empty targets. Every pair is scored with a checkpoint
(:meth:`seq2seq.translator.Translator.score`); the script prints, for the sum and the mean per
piece, the ROC AUC of clean against noisy pairs and how many noisy pairs survive when the best
``--keep`` share of the mixed corpus is kept.

    python benchmarks/score_filter.py --ckpt checkpoints/multi30k_de_en/last.ckpt \
        --data_dir ../shared/data/multi30k
"""

from __future__ import annotations

import argparse
import random
import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import read_split  # noqa: E402

KINDS = ("misaligned", "untranslated", "garbage", "empty")


def noisy_pairs(src: list[str], tgt: list[str], counts: dict[str, int], seed: int):
    """``(source, target, kind)`` of noisy pairs made from the lines of ``src``/``tgt``."""
    rng = random.Random(seed)
    made = []
    for kind in KINDS:
        for _ in range(counts[kind]):
            i = rng.randrange(len(src))
            if kind == "misaligned":
                j = (i + rng.randrange(1, len(tgt))) % len(tgt)
                made.append((src[i], tgt[j], kind))
            elif kind == "untranslated":
                made.append((src[i], src[i], kind))
            elif kind == "garbage":
                length = rng.randrange(10, 60)
                text = "".join(rng.choice(string.ascii_letters + " ") for _ in range(length))
                made.append((src[i], text.strip() or "x", kind))
            else:
                made.append((src[i], "", kind))
    return made


def auc(clean: list[float], noisy: list[float]) -> float:
    """ROC AUC: the probability that a clean pair scores above a noisy one (ties count half)."""
    wins = sum((c > n) + 0.5 * (c == n) for c in clean for n in noisy)
    return wins / (len(clean) * len(noisy))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="checkpoint (or CTranslate2 folder)")
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--src_lang", default="de")
    parser.add_argument("--tgt_lang", default="en")
    parser.add_argument("--clean", type=int, default=1000, help="clean pairs (the set's first)")
    parser.add_argument(
        "--noisy",
        default="100,40,30,30",
        help="noisy pairs of each kind: misaligned,untranslated,garbage,empty",
    )
    parser.add_argument("--keep", type=float, default=0.8, help="share of the mix kept")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from seq2seq.translator import Translator

    src = read_split(args.data_dir, args.split, args.src_lang)
    tgt = read_split(args.data_dir, args.split, args.tgt_lang)
    counts = dict(zip(KINDS, (int(n) for n in args.noisy.split(",")), strict=True))
    pairs = [(s, t, "clean") for s, t in zip(src, tgt, strict=True)][: args.clean]
    pairs += noisy_pairs(src, tgt, counts, args.seed)
    translator = Translator.from_checkpoint(args.ckpt, device="cpu")
    scores = translator.score([p[0] for p in pairs], [p[1] for p in pairs])
    kept_count = int(args.keep * len(pairs))
    print(f"{len(pairs) - sum(counts.values())} clean pairs of {args.split}, noisy: {counts}; "
          f"keeping the best {kept_count} of {len(pairs)}")  # fmt: skip
    print("| score | ROC AUC clean vs noisy | noisy kept | clean kept | noisy kept, by kind |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("sum", "mean per piece"):
        values = [s.log_prob if name == "sum" else s.per_token for s in scores]
        clean = [v for v, p in zip(values, pairs, strict=True) if p[2] == "clean"]
        noisy = [v for v, p in zip(values, pairs, strict=True) if p[2] != "clean"]
        order = sorted(range(len(pairs)), key=lambda i: values[i], reverse=True)[:kept_count]
        kinds = [pairs[i][2] for i in order]
        by_kind = ", ".join(f"{k} {kinds.count(k)}" for k in KINDS if kinds.count(k))
        noisy_kept = len(kinds) - kinds.count("clean")
        print(f"| {name} | {auc(clean, noisy):.3f} | {noisy_kept} of {len(noisy)} | "
              f"{kinds.count('clean')} of {len(clean)} | {by_kind or '-'} |")  # fmt: skip


if __name__ == "__main__":
    main()
