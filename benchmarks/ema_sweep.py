"""Choose the EMA settings of a recipe on validation BLEU from one training run.

During ``fit``, the :class:`Snapshots` callback saves the training weights every
``every_n_steps`` optimizer steps. Afterwards, ``main`` replays the moving average
``ema = decay * ema + (1 - decay) * weights`` over those snapshots for each decay asked
(exactly what ``seq2seq.callbacks.EMA(decay, start_step, every_n_steps)`` with the same
``every_n_steps`` computes during training), and scores each average, and the training
weights themselves, on a held-out split with the checkpoint's decoding settings.

    PYTHONPATH=benchmarks seq2seq fit --config configs/multi30k_de_en.yaml ... \\
        --trainer.callbacks+=ema_sweep.Snapshots --trainer.callbacks.dirpath snapshots
    python benchmarks/ema_sweep.py --snapshots snapshots --ckpt checkpoints/run/last.ckpt \\
        --data_dir ../shared/data/multi30k --split val --decays 0.9,0.95,0.98
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import lightning as L  # noqa: E402
from common import read_split  # noqa: E402  (benchmarks/ is the script's folder)


class Snapshots(L.Callback):
    """Saves the training weights (``pl_module.state_dict()``) after every ``every_n_steps``-th
    optimizer step as ``dirpath/step{N:06d}.pt`` (rank 0 only)."""

    def __init__(self, dirpath: str = "snapshots", every_n_steps: int = 10) -> None:
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self._last = -1

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        step = trainer.global_step
        if step == self._last or step % self.every_n_steps or trainer.global_rank != 0:
            return
        self._last = step
        self.dirpath.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        torch.save(state, self.dirpath / f"step{step:06d}.pt")


def main(argv: list[str] | None = None) -> list[tuple[str, float, float]]:
    import sacrebleu

    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.checkpoint.format import EMA_KEY, TRAINING_WEIGHTS
    from seq2seq.translator import Translator

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snapshots", required=True, help="folder of Snapshots' files")
    parser.add_argument("--ckpt", required=True, help="a checkpoint of the same run")
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--src_lang", default="de")
    parser.add_argument("--tgt_lang", default="en")
    parser.add_argument("--decays", default="0.8,0.9,0.95,0.98")
    parser.add_argument("--start_step", type=int, default=0)
    parser.add_argument("--until_step", type=int, default=0, help="last snapshot (0: all)")
    parser.add_argument("--beam_size", type=int, default=0, help="0: the checkpoint's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hypotheses", default="", help="folder for each candidate's output")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    files = sorted(Path(args.snapshots).glob("step*.pt"))
    steps = [int(f.stem[4:]) for f in files]
    chosen = [
        (s, f)
        for s, f in zip(steps, files, strict=True)
        if s >= max(args.start_step, 1) and (not args.until_step or s <= args.until_step)
    ]
    if not chosen:
        parser.error(f"no snapshots in {args.snapshots} from step {args.start_step}")
    decays = [float(d) for d in args.decays.split(",") if d]
    averages: dict[float, dict[str, torch.Tensor]] = {}
    for _, path in chosen:
        state = torch.load(path, weights_only=True)
        for d in decays:
            if d not in averages:
                averages[d] = {k: v.double() for k, v in state.items() if v.is_floating_point()}
            else:
                for k, v in averages[d].items():
                    v.mul_(d).add_(state[k].double(), alpha=1 - d)
    last_state = state
    base = load_checkpoint(args.ckpt)
    for key in (TRAINING_WEIGHTS, EMA_KEY, "optimizer_states", "lr_schedulers"):
        base.pop(key, None)
    src = read_split(args.data_dir, args.split, args.src_lang)
    ref = read_split(args.data_dir, args.split, args.tgt_lang)
    decoding = {"beam_size": args.beam_size} if args.beam_size else {}
    rows = []
    candidates = [("training weights", last_state)] + [
        (f"EMA decay {d}", {k: v.float() for k, v in averages[d].items()}) for d in decays
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, weights in candidates:
            base["state_dict"] = {**base["state_dict"], **weights}
            path = Path(tmp) / "candidate.ckpt"
            torch.save(base, path)
            translator = Translator.from_checkpoint(path, device="cpu", **decoding)
            hyps = translator.translate(src)
            if args.hypotheses:
                folder = Path(args.hypotheses)
                folder.mkdir(parents=True, exist_ok=True)
                file = folder / f"{args.split}.{name.replace(' ', '_')}.txt"
                file.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
            bleu = sacrebleu.corpus_bleu(hyps, [ref])
            chrf = sacrebleu.corpus_chrf(hyps, [ref])
            rows.append((name, bleu.score, chrf.score))
            print(
                f"{name:22s} {args.split} BLEU {bleu.score:6.2f} chrF2 {chrf.score:6.2f}",
                flush=True,
            )
    print(f"snapshots {chosen[0][0]}..{chosen[-1][0]} (every {steps[1] - steps[0]} steps)")
    return rows


if __name__ == "__main__":
    main()
