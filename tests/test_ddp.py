"""Data-parallel training and evaluation: DDP on CPU (gloo) against a single process.

The DDP runs start ``python -m seq2seq.cli`` in a subprocess (Lightning's ``ddp`` strategy then
starts the second process itself); the single-process run runs in the test's own process. All
train on 200 Multi30k training lines and 7 validation lines. The :class:`Recorder` callback
below is loaded by those runs from this file (``--trainer.callbacks+=test_ddp.Recorder``) and
writes what each rank saw to ``records/``.

Why the runs are comparable: :class:`~seq2seq.data.batching.TokenBudgetBatchSampler` cuts the
same batch list for 1 and 2 processes when that list has an even length (checked below), and
rank ``r`` takes batches ``r, r + 2, ...``. So 2 processes doing one batch per step see the
same batches per optimizer step as 1 process accumulating 2 batches, and with the gradients
normalised by the real target tokens of the whole step the two runs take identical steps.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import multi30k_slice, run_ddp_cli
from torch.utils.data import DataLoader

from seq2seq.checkpoint import load_checkpoint
from seq2seq.checkpoint.format import EMA_KEY, TRAINING_WEIGHTS
from seq2seq.data.batching import TokenBudgetBatchSampler, collate
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.module import TranslationModule
from seq2seq.nn import label_smoothed_cross_entropy

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "tiny.yaml"
TIMEOUT_S = 240  # per subprocess run; a hang fails the test instead of blocking the suite


class Recorder(L.Callback):
    """Writes, per rank, the loss of every training batch before its step, the logged
    ``train/loss`` of every optimizer step, the indices of the held-out sentences the rank
    decoded, the held-out scores and the final parameters."""

    def __init__(self, out_dir: str = "records") -> None:
        self.out_dir = Path(out_dir)
        self.record: dict = {"train": [], "val_indices": [], "val_scores": []}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        with torch.no_grad():
            logits = pl_module(batch["src"], batch["tgt_in"], batch["src_mask"])
            loss_sum, _ = label_smoothed_cross_entropy(
                logits, batch["tgt_out"], pl_module.hparams.label_smoothing, ignore_index=0
            )
        mean = float(loss_sum) / batch["n_tokens"]
        self.record["train"].append([sorted(batch["index"].tolist()), mean])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        logged = trainer.callback_metrics.get("train/loss")  # of the last optimizer step
        if logged is not None and trainer.global_step:
            self.record.setdefault("logged", {})[str(trainer.global_step)] = float(logged)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *_) -> None:
        self.record["val_indices"].append(batch["index"].tolist())

    def on_validation_end(self, trainer, pl_module) -> None:
        scores = pl_module.last_scores.get("val", {})
        loss = trainer.callback_metrics.get("val/loss")
        self.record["val_scores"].append(
            {name: s.value for name, s in scores.items()} | {"loss": float(loss)}
        )
        self._write(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        params = {n: p.detach().double().clone() for n, p in pl_module.named_parameters()}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(params, self.out_dir / f"params{trainer.global_rank}.pt")
        self._write(trainer)

    def _write(self, trainer) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.record))


# ---------------------------------------------------------------------- helpers
def _seq2seq(args: list[str], cwd: Path) -> None:
    run_ddp_cli(args, cwd, TIMEOUT_S)


def _seq2seq_in_process(args: list[str], cwd: Path) -> None:
    """``seq2seq ARGS`` in ``cwd``, in this process (a run without DDP needs no process of
    its own), on one thread as each DDP process."""
    from seq2seq.cli import cli_main

    cwd.mkdir(parents=True, exist_ok=True)
    previous, threads = Path.cwd(), torch.get_num_threads()
    os.chdir(cwd)
    torch.set_num_threads(1)
    try:
        cli_main(args)
    finally:
        os.chdir(previous)
        torch.set_num_threads(threads)


def _records(run: Path, world_size: int) -> list[dict]:
    return [json.loads((run / f"records/rank{r}.json").read_text()) for r in range(world_size)]


def _hypotheses(run: Path) -> list[str]:
    (path,) = run.glob("lightning_logs/tiny/version_0/hypotheses/val.step*.txt")
    return path.read_text(encoding="utf-8").splitlines()


TRAIN_LINES, VAL_LINES, MAX_TOKENS, EVAL_MAX_TOKENS = 200, 7, 256, 120


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, multi30k_dir) -> Path:
    """200 training and 7 validation pairs of Multi30k, plus a shared tokenizer cache."""
    root = tmp_path_factory.mktemp("ddp")
    data = root / "data"
    data.mkdir()
    multi30k_slice(data, {"train": TRAIN_LINES, "val": VAL_LINES}, multi30k_dir)
    return root


def _common(corpus: Path) -> list[str]:
    return [
        "--config", str(TINY),
        "--data.data_dir", str(corpus / "data"),
        "--data.cache_dir", str(corpus / "cache"),  # one tokenizer for every run
        "--data.download", "false",
        "--data.test_splits", "[]",
        "--data.max_tokens", str(MAX_TOKENS),
        "--data.eval_max_tokens", str(EVAL_MAX_TOKENS),
        "--trainer.limit_val_batches", "1.0",
        "--trainer.callbacks+=test_ddp.Recorder",
    ]  # fmt: skip


def _fit(corpus: Path, name: str, devices: int) -> Path:
    """3 optimizer steps of 2 batches each: 1 process accumulating 2, or 2 processes."""
    run = corpus / name
    args = [
        "fit", *_common(corpus),
        "--trainer.max_steps", "-1",
        "--trainer.max_epochs", "1",
        "--trainer.val_check_interval", "1.0",
        "--trainer.limit_train_batches", str(6 // devices),
        "--trainer.accumulate_grad_batches", str(2 // devices),
    ]  # fmt: skip
    # A moving average of the weights, validated and saved: each process updates its own copy.
    args += ["--trainer.callbacks+=seq2seq.callbacks.EMA", "--trainer.callbacks.decay", "0.5"]
    if devices > 1:
        args += ["--trainer.strategy", "ddp", "--trainer.devices", str(devices)]
        _seq2seq(args, run)
    else:
        _seq2seq_in_process(args, run)
    return run


@pytest.fixture(scope="module")
def fits(corpus) -> tuple[Path, Path]:
    """The single-process run and the 2-process DDP run."""
    single = _fit(corpus, "single", devices=1)
    ddp = _fit(corpus, "ddp", devices=2)
    return single, ddp


# ---------------------------------------------------------------------- DDP vs 1 process
def test_same_batch_plan_for_one_and_two_processes(corpus):
    datamodule = TranslationDataModule(
        data_dir=str(corpus / "data"),
        cache_dir=str(corpus / "cache"),
        download=False,
        test_splits=[],
        vocab_size=500,
        max_positions=64,
        max_tokens=MAX_TOKENS,
        eval_max_tokens=EVAL_MAX_TOKENS,
    )
    datamodule.setup("fit")
    plans = []
    for world_size in (1, 2):
        sampler = datamodule._sampler("train", train=True)
        sampler.num_replicas = world_size
        plans.append(sampler.epoch_batches())
    assert len(plans[0]) % 2 == 0, "the comparison needs an even number of training batches"
    assert plans[0] == plans[1]
    val = datamodule._sampler("val", train=False)
    val.num_replicas = 2
    counts = [len(val.epoch_batches()[r::2]) for r in range(2)]
    assert counts[0] != counts[1], "validation should give the two ranks uneven batch counts"


def test_ddp_training_equals_single_process(fits):
    single, ddp = fits
    (one,) = _records(single, 1)
    two = _records(ddp, 2)
    single_losses = {tuple(k): v for k, v in one["train"]}
    ddp_losses = {tuple(k): v for rank in two for k, v in rank["train"]}
    assert len(single_losses) == 6 and single_losses.keys() == ddp_losses.keys()
    for key, loss in single_losses.items():
        assert ddp_losses[key] == pytest.approx(loss, rel=1e-5, abs=1e-6)
    reference = torch.load(single / "records/params0.pt")
    for rank in range(2):
        params = torch.load(ddp / f"records/params{rank}.pt")
        for name, value in reference.items():
            torch.testing.assert_close(params[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_ddp_weight_average_equals_single_process(fits):
    """The EMA that DDP saves equals the single process's, and differs from the training
    weights (so the comparison can fail)."""
    single, ddp = fits
    saved = [load_checkpoint(run / "checkpoints/tiny/last.ckpt") for run in (single, ddp)]
    for checkpoint in saved:
        assert checkpoint[EMA_KEY]["updates"] == 3 and TRAINING_WEIGHTS in checkpoint
    for name, value in saved[0]["state_dict"].items():
        torch.testing.assert_close(saved[1]["state_dict"][name], value, rtol=1e-4, atol=1e-6)
    name = "model.decoder.layers.0.ff.fc1.weight"
    assert not torch.allclose(saved[0]["state_dict"][name], saved[0][TRAINING_WEIGHTS][name])


def test_logged_training_loss_is_the_whole_steps_on_every_rank(fits):
    """train/loss of each optimizer step covers both of its batches: the same value logged by
    the single process (accumulating 2) and by both DDP ranks (one batch each)."""
    single, ddp = fits
    (one,) = _records(single, 1)
    two = _records(ddp, 2)
    assert sorted(one["logged"]) == ["1", "2", "3"]
    for rank in two:
        assert rank["logged"].keys() == one["logged"].keys()
        for step, loss in one["logged"].items():
            assert rank["logged"][step] == pytest.approx(loss, rel=1e-5), step
    # Not one of the two batches' own losses (the batches differ).
    first_step = [loss for _, loss in one["train"][:2]]
    assert all(abs(one["logged"]["1"] - loss) > 1e-4 for loss in first_step)


def test_ddp_validation_equals_single_process(fits):
    single, ddp = fits
    (one,) = _records(single, 1)
    two = _records(ddp, 2)
    assert _hypotheses(ddp) == _hypotheses(single) and len(_hypotheses(single)) == VAL_LINES
    for rank in two:
        for name in ("bleu", "chrf", "ter"):
            expected = one["val_scores"][-1][name]
            assert rank["val_scores"][-1][name] == pytest.approx(expected, rel=1e-6, abs=1e-9)
    shares = [sorted(i for batch in rank["val_indices"] for i in batch) for rank in two]
    assert sorted(shares[0] + shares[1]) == list(range(VAL_LINES))
    assert len(two[0]["val_indices"]) != len(two[1]["val_indices"])  # uneven, and no hang


def test_ddp_validation_loss_equals_single_process(fits):
    single, ddp = fits
    (one,) = _records(single, 1)
    for rank in _records(ddp, 2):
        assert rank["val_scores"][-1]["loss"] == pytest.approx(one["val_scores"][-1]["loss"])


@pytest.mark.slow  # two-process evaluations: ~17 s; CI runs the slow tier too
def test_ddp_evaluation_scores_each_sentence_once(fits, corpus):
    single, _ = fits
    (one,) = _records(single, 1)
    run = corpus / "validate_ddp"
    # The default eval budget puts all 7 sentences into one batch: the sampler splits it so
    # that the second rank has work too (a rank with none would skip validation and hang).
    args = [
        "validate", *_common(corpus),
        "--data.eval_max_tokens", "null",
        "--ckpt_path", str(single / "checkpoints/tiny/last.ckpt"),
        "--trainer.strategy", "ddp",
        "--trainer.devices", "2",
    ]  # fmt: skip
    _seq2seq(args, run)
    two = _records(run, 2)
    shares = [[i for batch in rank["val_indices"] for i in batch] for rank in two]
    assert all(shares) and sorted(shares[0] + shares[1]) == list(range(VAL_LINES))
    assert _hypotheses(run) == _hypotheses(single)
    for rank in two:
        for name in ("bleu", "chrf", "ter"):
            expected = one["val_scores"][-1][name]
            assert rank["val_scores"][-1][name] == pytest.approx(expected, rel=1e-6, abs=1e-9)


# ---------------------------------------------------------------------- held-out sharding
@pytest.mark.parametrize(("n", "world_size"), [(7, 2), (7, 3), (1, 2)])
def test_every_rank_gets_a_heldout_batch(n, world_size):
    shards = [
        list(
            TokenBudgetBatchSampler(
                [5] * n, 1000, shuffle=False, num_replicas=world_size, rank=r, even_batches=False
            )
        )
        for r in range(world_size)
    ]
    assert all(shards)
    flat = sorted(i for shard in shards for batch in shard for i in batch)
    if n >= world_size:
        assert flat == list(range(n))  # split, each sentence exactly once
    else:
        assert sorted(set(flat)) == list(range(n))  # repeated; gather_in_order dedupes


# ---------------------------------------------------------------------- gradient accumulation
def _examples(generator: torch.Generator, n: int, start: int) -> list[dict]:
    examples = []
    for k in range(n):
        s, t = torch.randint(1, 9, (2,), generator=generator).tolist()
        examples.append(
            {
                "index": start + k,
                "src": [*torch.randint(4, 16, (s,), generator=generator).tolist(), 3],
                "tgt": torch.randint(4, 16, (t,), generator=generator).tolist(),
            }
        )
    return examples


def _tiny_module(**kwargs) -> TranslationModule:
    return TranslationModule(
        vocab_size=16, d_model=8, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=16,
        dropout=0.0, max_positions=32, label_smoothing=0.1, **kwargs,
    )  # fmt: skip


def test_accumulated_gradients_equal_one_batch_of_both(tmp_path):
    """One SGD step (lr 1) over 2 accumulated micro-batches moves the parameters by the
    gradient of the mean loss over the real target tokens of one batch holding both."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    first, second = _examples(generator, 2, 0), _examples(generator, 5, 2)
    module = _tiny_module(
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
    )
    reference = copy.deepcopy(module.model).double()
    both = collate(first + second)
    logits = reference(both["src"], both["tgt_in"], both["src_mask"])
    loss_sum, _ = label_smoothed_cross_entropy(logits, both["tgt_out"], 0.1, ignore_index=0)
    (loss_sum / both["n_tokens"]).backward()
    before = {n: p.detach().clone() for n, p in reference.named_parameters()}

    trainer = L.Trainer(
        accelerator="cpu", devices=1, precision="64-true", max_steps=1,
        accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
        limit_val_batches=0, default_root_dir=tmp_path,
    )  # fmt: skip
    batches = [collate(first), collate(second)]
    trainer.fit(module, DataLoader(batches, batch_size=None))
    assert trainer.global_step == 1
    # float64 except for the loss, which label_smoothed_cross_entropy computes in float32, and
    # the module's float32 scale 1 / tokens: agreement to float32 rounding of the loss, whose
    # absolute error reaches the smallest gradient entries too (2e-9 on a 9e-5 entry on an
    # AVX-512 Xeon), hence atol 1e-7, four orders below the token-weighting error checked next.
    grads = dict(reference.named_parameters())
    for name, param in module.model.named_parameters():
        step = before[name] - param.detach()
        torch.testing.assert_close(
            step, grads[name].grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}"
        )

    # The token weighting matters: the mean of the two micro-batch means is another step.
    naive = copy.deepcopy(reference)
    naive.zero_grad()
    means = []
    for examples in (first, second):
        b = collate(examples)
        out = naive(b["src"], b["tgt_in"], b["src_mask"])
        means.append(label_smoothed_cross_entropy(out, b["tgt_out"], 0.1, ignore_index=0)[0])
        means[-1] = means[-1] / b["n_tokens"]
    (sum(means) / 2).backward()
    differences = [
        (p.grad - q.grad).abs().max()
        for p, q in zip(naive.parameters(), reference.parameters(), strict=True)
    ]
    assert max(differences) > 1e-3


# ---------------------------------------------------------------------- pad_to_multiple_of
def test_collate_pads_to_multiple_of():
    generator = torch.Generator().manual_seed(1)
    examples = _examples(generator, 5, 0)
    plain, rounded = collate(examples), collate(examples, pad_to_multiple_of=8)
    for key in ("src", "tgt_in", "tgt_out"):
        length = plain[key].size(1)
        assert rounded[key].size(1) == -(-length // 8) * 8
        assert torch.equal(rounded[key][:, :length], plain[key])
        assert (rounded[key][:, length:] == 0).all()
    S = plain["src"].size(1)
    assert torch.equal(rounded["src_mask"][..., :S], plain["src_mask"])
    assert not rounded["src_mask"][..., S:].any()
    assert rounded["n_tokens"] == plain["n_tokens"]
    # Padding changes nothing: the same loss, in float64.
    torch.manual_seed(0)
    module = _tiny_module()
    model = module.model.double().eval()
    losses = [
        label_smoothed_cross_entropy(
            model(b["src"], b["tgt_in"], b["src_mask"]), b["tgt_out"], 0.1, ignore_index=0
        )[0]
        for b in (plain, rounded)
    ]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        collate(examples, pad_to_multiple_of=0)


def test_datamodule_passes_pad_to_multiple_of():
    generator = torch.Generator().manual_seed(2)
    examples = _examples(generator, 3, 0)
    datamodule = TranslationDataModule(pad_to_multiple_of=8)
    (batch,) = list(datamodule._loader(examples, [[0, 1, 2]]))
    assert batch["src"].size(1) % 8 == 0 and batch["tgt_in"].size(1) % 8 == 0
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        TranslationDataModule(pad_to_multiple_of=0)
