"""TranslationModule: the fused training loss equals the plain one; decoding settings are
checked when the module is built."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from conftest import CONFIGS, quiet_cpu_trainer, run_main, tiny_model

from seq2seq.checkpoint import load_checkpoint
from seq2seq.data.batching import collate
from seq2seq.module import TranslationModule
from seq2seq.nn import DecodingConfig, greedy_search


def _module() -> TranslationModule:
    torch.manual_seed(0)
    return TranslationModule(
        vocab_size=40,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        dropout=0.0,
        max_positions=32,
    )


def _batch_of(seed: int, lengths: list[tuple[int, int]]) -> dict:
    """Pairs of random ids with the given (source, target) lengths, padded."""
    g = torch.Generator().manual_seed(seed)
    examples = [
        {
            "index": i,
            "src": torch.randint(4, 40, (n,), generator=g).tolist() + [3],
            "tgt": torch.randint(4, 40, (m,), generator=g).tolist(),
        }
        for i, (n, m) in enumerate(lengths)
    ]
    return collate(examples, pad_id=0)


def _batch() -> dict:
    """Three pairs of different lengths (16 target tokens with EOS), padded."""
    return _batch_of(0, [(5, 9), (2, 3), (11, 1)])


def test_fused_loss_path_equals_full_logits_path():
    module = _module().double()
    prepared = _batch()
    index = prepared["tgt_index"]
    assert index.numel() == prepared["n_tokens"] == 16
    torch.testing.assert_close(index, (prepared["tgt_out"].flatten() != 0).nonzero().squeeze(1))
    plain = module._loss_sums({k: v for k, v in prepared.items() if k != "tgt_index"})
    fused = module._loss_sums(prepared)
    for a, b in zip(plain, fused, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-6, atol=0)
    # Gradients agree as well.
    plain[0].backward()
    ref = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    module._loss_sums(prepared)[0].backward()
    for r, p in zip(ref, module.parameters(), strict=True):
        torch.testing.assert_close(p.grad, r, rtol=1e-4, atol=1e-7)


def test_loss_under_bfloat16_autocast_matches_float32():
    """As Lightning's ``bf16-mixed`` runs the step on CPU: the packed, fused path works and is
    close to float32."""
    module = _module()
    batch = _batch()
    ref = module._loss_sums(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = module._loss_sums(batch)
    low[0].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in module.parameters())
    torch.testing.assert_close(low[0].float(), ref[0].float(), rtol=0.02, atol=0.0)
    assert int(low[2]) == int(ref[2]) == 16


@pytest.mark.parametrize(
    ("name", "value"), [("max_len_a", -1.0), ("max_len_b", -50), ("min_len", -1)]
)
def test_negative_length_limits_are_refused_at_construction(name, value):
    """ValueError: 'model.decoding.max_len_a must be >= 0, got -1.0', not outputs cut short."""
    with pytest.raises(ValueError, match=rf"^model\.decoding\.{name} must be >= 0, got {value}$"):
        TranslationModule(vocab_size=40, d_model=16, n_heads=2, d_ff=32, decoding={name: value})
    with pytest.raises(ValueError, match=rf"^{name} must be >= 0, got {value}$"):
        TranslationModule(
            vocab_size=40, d_model=16, n_heads=2, d_ff=32, decoding=DecodingConfig(**{name: value})
        )


def test_a_sampling_field_without_sampling_is_warned_about():
    sizes = dict(vocab_size=40, d_model=16, n_heads=2, d_ff=32)
    with pytest.warns(UserWarning, match=r"^model\.decoding\.sampling_topk applies to sampling"):
        TranslationModule(**sizes, decoding={"sampling_topk": 5, "sampling_seed": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TranslationModule(**sizes, decoding={"sampling": True, "sampling_topk": 5})
        TranslationModule(**sizes, decoding={"beam_size": 3})


def test_decoding_is_a_config_and_a_plain_dict_in_the_hyperparameters():
    module = TranslationModule(vocab_size=40, d_model=16, n_heads=2, d_ff=32)
    assert module.decoding == DecodingConfig() and module.n_best == 1
    assert module.hparams.decoding == DecodingConfig().to_dict()
    given = DecodingConfig(beam_size=2, min_len=1)
    module = TranslationModule(vocab_size=40, d_model=16, n_heads=2, d_ff=32, decoding=given)
    assert module.decoding is given and module.hparams.decoding["beam_size"] == 2
    rebuilt = TranslationModule(**module.hparams)  # as load_from_checkpoint builds it
    assert rebuilt.decoding == given
    with pytest.raises(ValueError, match=r"^unknown decoding settings: \['beams'\]"):
        TranslationModule(vocab_size=40, d_model=16, n_heads=2, d_ff=32, decoding={"beams": 2})


def test_min_len_above_the_maximum_length_is_allowed_and_the_maximum_wins():
    module = TranslationModule(
        vocab_size=40, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32,
        decoding=DecodingConfig(max_len_a=0.0, max_len_b=3, min_len=10),
    )  # fmt: skip
    hp = module.decoding
    src = torch.randint(4, 40, (2, 5), generator=torch.Generator().manual_seed(0))
    limits = DecodingConfig(max_len_a=hp.max_len_a, max_len_b=hp.max_len_b, min_len=hp.min_len)
    for hyps in greedy_search(module.model.eval(), src, None, 2, 3, limits):
        assert len(hyps[0].tokens) == 3


def test_logged_training_loss_covers_every_micro_batch_of_the_step(tmp_path):
    """With gradient accumulation, train/loss and train/nll are the per-token means over all
    micro-batches of the optimizer step (weighted by their target tokens), not the last
    micro-batch's."""
    batches = [_batch(), _batch_of(1, [(4, 30), (7, 25)])]
    module = _module()
    with torch.no_grad():
        expected = [module._loss_sums(b) for b in batches]
    tokens = sum(int(n) for _, _, n in expected)
    loss = sum(float(s) for s, _, _ in expected) / tokens
    nll = sum(float(s) for _, s, _ in expected) / tokens
    last_only = float(expected[1][0]) / int(expected[1][2])
    assert abs(loss - last_only) > 1e-3  # the two micro-batches differ
    trainer = quiet_cpu_trainer(tmp_path, max_steps=1, accumulate_grad_batches=2)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    metrics = trainer.callback_metrics
    assert float(metrics["train/loss"]) == pytest.approx(loss, rel=1e-5)
    assert float(metrics["train/nll"]) == pytest.approx(nll, rel=1e-5)
    assert float(metrics["train/ppl"]) == pytest.approx(torch.tensor(nll).exp().item(), rel=1e-5)


def test_a_run_stopped_between_logging_steps_logs_that_steps_grad_norm(tmp_path):
    """A stop between two logging steps (max_time, early stopping) makes Lightning write the
    step metrics once more: train/grad_norm there is that step's, not the last logged one."""
    import csv

    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    class StopAtStep3(L.Callback):  # as Lightning's Timer stops a run: should_stop
        def on_train_batch_end(self, trainer, *args) -> None:
            trainer.should_stop = trainer.global_step == 3

    batches = [_batch(), _batch_of(1, [(4, 30), (7, 25)]), _batch_of(2, [(9, 12), (5, 5)])]
    trainer = L.Trainer(
        accelerator="cpu", max_steps=10, log_every_n_steps=2, callbacks=[StopAtStep3()],
        logger=CSVLogger(tmp_path), enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(_module(), train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    assert trainer.global_step == 3
    with open(trainer.logger.log_dir + "/metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("train/grad_norm")]
    norms = {int(row["step"]): float(row["train/grad_norm"]) for row in rows}
    assert sorted(norms) == [1, 2], norms  # logging step 1 (step 2), then the stop at step 3
    assert norms[2] != norms[1]


def test_lr_scheduler_none_is_a_constant_rate_and_a_plateau_schedule_is_the_modules_to_step():
    """``lr_scheduler=None`` gives the optimizer alone; a ``ReduceLROnPlateau`` is named with the
    validation metric its mode asks for (or Lightning's subclass's own) and left to the module,
    which steps it after each validation; a metric the validation does not log is refused when
    the module is built."""
    from functools import partial

    from lightning.pytorch.cli import ReduceLROnPlateau as Named
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    assert isinstance(tiny_model(lr_scheduler=None).configure_optimizers(), torch.optim.AdamW)
    for mode, monitor in (("min", "val/loss"), ("max", "val/bleu")):
        plateau = tiny_model(lr_scheduler=partial(ReduceLROnPlateau, mode=mode))
        schedule = plateau.configure_optimizers()["lr_scheduler"]
        assert isinstance(schedule["scheduler"], ReduceLROnPlateau)
        assert (schedule["monitor"], schedule["reduce_on_plateau"]) == (monitor, False)
        plateau.lr_scheduler_step(schedule["scheduler"], None)  # Lightning's call: not stepped
        assert schedule["scheduler"].last_epoch == 0
    named = tiny_model(lr_scheduler=partial(Named, monitor="val/de-en/chrf", mode="max"))
    assert named.configure_optimizers()["lr_scheduler"]["monitor"] == "val/de-en/chrf"
    with pytest.raises(ValueError, match=r"monitors 'val/accuracy', which the validation does"):
        tiny_model(lr_scheduler=partial(Named, monitor="val/accuracy", mode="max"))
    with pytest.raises(ValueError, match=r"monitors 'val/blue' \(did you mean val/bleu\?\), wh"):
        tiny_model(lr_scheduler=partial(Named, monitor="val/blue", mode="max"))
    with pytest.raises(ValueError, match=r"monitors 'val/bleu'.* for loss, nll, ppl, chrf "):
        tiny_model(lr_scheduler=partial(ReduceLROnPlateau, mode="max"), metrics=["chrf"])


def test_a_callback_monitoring_another_pair_is_refused_when_the_fit_starts():
    """A ModelCheckpoint or EarlyStopping watching ``val/<pair>/<name>`` of a pair the run does
    not train (or any pair's key in a run of one pair) is refused at the fit's start, before the
    first validation would find out."""
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    module = tiny_model()
    pairs = SimpleNamespace(pair_names=["de-en", "fr-en"])
    module._trainer = SimpleNamespace(callbacks=[], ckpt_path=None, datamodule=pairs)
    module._trainer.callbacks = [EarlyStopping(monitor="val/fr-en/bleu", mode="max")]
    module.on_fit_start()
    module._trainer.callbacks.append(ModelCheckpoint(monitor="val/it-en/bleu", mode="max"))
    with pytest.raises(ValueError, match=r"^ModelCheckpoint monitors 'val/it-en/bleu', which the "
                       r"validation of this run does not log; it logs val/<pair>/bleu for "
                       r"de-en, fr-en$"):  # fmt: skip
        module.on_fit_start()
    module._trainer.datamodule = SimpleNamespace(pair_names=["de-en"])
    module._trainer.callbacks = [EarlyStopping(monitor="val/de-en/bleu", mode="max")]
    with pytest.raises(ValueError, match=r"logs val/bleu \(one language pair\)$"):
        module.on_fit_start()


def test_chrfpp_is_a_metric_to_choose_and_monitor():
    """``metrics=["chrfpp"]`` is accepted (an unknown name is refused, naming the choices); a
    plateau schedule may monitor ``val/chrfpp``, and ``min`` on it is against the metric."""
    from functools import partial

    from lightning.pytorch.cli import ReduceLROnPlateau as Named

    from seq2seq.optim import mode_against_metric

    assert tiny_model(metrics=["bleu", "chrfpp"]).metrics == ["bleu", "chrfpp"]
    with pytest.raises(
        ValueError,
        match=r"unknown metric 'chrf\+\+' in metrics; choose from bleu, chrf, chrfpp, ter$",
    ):
        tiny_model(metrics=["chrf++"])
    monitored = partial(Named, monitor="val/chrfpp", mode="max")
    assert tiny_model(lr_scheduler=monitored, metrics=["chrfpp"]).metrics == ["chrfpp"]
    with pytest.raises(
        ValueError, match=r"monitors .val/chrfpp., which .* ter \(model.metrics; add chrfpp\)$"
    ):
        tiny_model(lr_scheduler=monitored)  # the default metrics leave chrF++ out
    assert mode_against_metric("val/chrfpp", "max") is None
    assert mode_against_metric("val/de-en/chrfpp", "min") == (
        "monitors val/de-en/chrfpp in mode min, but a higher chrfpp is better"
    )


def test_resumed_schedule_check_of_checkpoints_with_and_without_the_record():
    from seq2seq.checkpoint.restore import check_resumed_schedule

    inverse = "seq2seq.optim.InverseSqrtLR"
    check_resumed_schedule({"seq2seq": {"lr_scheduler": inverse}}, inverse)
    check_resumed_schedule({"seq2seq": {"lr_scheduler": None}}, None)
    torch_plateau, lightning_plateau = (
        "torch.optim.lr_scheduler.ReduceLROnPlateau",
        "lightning.pytorch.cli.ReduceLROnPlateau",
    )  # the same state; Lightning's has a monitor of its own
    check_resumed_schedule({"seq2seq": {"lr_scheduler": torch_plateau}}, lightning_plateau)
    check_resumed_schedule({"seq2seq": {"lr_scheduler": lightning_plateau}}, torch_plateau)
    with pytest.raises(ValueError, match=r"trained with lr_scheduler torch.optim.lr_scheduler.Re"):
        check_resumed_schedule({"seq2seq": {"lr_scheduler": torch_plateau}}, inverse)
    with pytest.raises(ValueError, match=r"trained with lr_scheduler null \(a constant rate\), "):
        check_resumed_schedule({"seq2seq": {"lr_scheduler": None}}, inverse)
    # written before the record: whether the run had a schedule at all
    check_resumed_schedule({"seq2seq": {}, "lr_schedulers": [{"last_epoch": 3}]}, inverse)
    check_resumed_schedule({"seq2seq": {}, "lr_schedulers": []}, None)
    with pytest.raises(ValueError, match=r"trained with lr_scheduler a schedule, this run's is n"):
        check_resumed_schedule({"seq2seq": {}, "lr_schedulers": [{"last_epoch": 3}]}, None)


@pytest.mark.parametrize(
    "scheduler",
    [
        ["--model.lr_scheduler", "null"],
        # validations after each batch of every second epoch only: none before the first
        # epoch's end, two in the second epoch
        ["--model.lr_scheduler", "torch.optim.lr_scheduler.ReduceLROnPlateau",
         "--trainer.val_check_interval", "1", "--trainer.check_val_every_n_epoch", "2"],
    ],
)  # fmt: skip
def test_fit_without_a_schedule_or_with_a_plateau_schedule(
    tiny_cache, multi30k_dir, tmp_path, monkeypatch, capsys, scheduler
):
    """A plateau schedule steps after every validation of the fit, not at epoch ends."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(
        monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(tiny_cache),
        "--trainer.limit_train_batches", "2", "--trainer.max_epochs", "2",
        "--trainer.max_steps", "-1", "--trainer.val_check_interval", "1.0",
        "--trainer.limit_val_batches", "1", *scheduler,
    )  # fmt: skip
    assert code == 0, err
    last = load_checkpoint(tmp_path / "checkpoints" / "tiny" / "last.ckpt")
    if scheduler[1] == "null":
        assert last["lr_schedulers"] == [] and last["seq2seq"]["lr_scheduler"] is None
    else:
        assert last["lr_schedulers"][0]["last_epoch"] == 2  # two validations
        # a resume with another plateau mode: refused before any data is read or logged
        code, out, err = run_main(
            monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(tiny_cache),
            "--trainer.limit_train_batches", "2", "--trainer.max_epochs", "3",
            "--trainer.max_steps", "-1", *scheduler, "--model.lr_scheduler.init_args.mode",
            "max", "--ckpt_path", "last",
        )  # fmt: skip
        assert code == 1 and len(err) == 1, err
        assert "ReduceLROnPlateau has mode min, this run's max" in err[0]
        assert "Training pairs" not in out + "\n".join(err)
        assert not list(tmp_path.glob("lightning_logs/**/config.resumed*"))


def test_fit_with_the_cosine_schedule_resumes_it_exactly(
    tiny_cache, multi30k_dir, tmp_path, monkeypatch, capsys, caplog
):
    """``--model.lr_scheduler seq2seq.optim.CosineLR``: a run stopped at step 6 and resumed
    to step 12 takes every step at the uninterrupted run's rate, and ends at the floor. Without
    ``max_steps`` the schedule takes the run's: ``trainer.max_steps``, else ``max_epochs``
    epochs of steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def fit(folder: str, *argv: str) -> tuple[dict[int, float], str]:
        (tmp_path / folder).mkdir(exist_ok=True)
        monkeypatch.chdir(tmp_path / folder)
        code, _, err = run_main(
            monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(tiny_cache),
            "--model.lr_scheduler", "seq2seq.optim.CosineLR",
            "--model.lr_scheduler.init_args.warmup_steps", "3",
            "--model.lr_scheduler.init_args.min_lr_ratio", "0.1",
            "--trainer.log_every_n_steps", "1", "--trainer.val_check_interval", "100",
            "--trainer.limit_val_batches", "1", *argv,
        )  # fmt: skip
        assert code == 0, err
        logs = EventAccumulator(str(tmp_path / folder / "lightning_logs" / "tiny" / "version_0"))
        logs.Reload()
        return {event.step: event.value for event in logs.Scalars("train/lr")}, "\n".join(err)

    caplog.set_level(logging.INFO)
    reference, _ = fit("reference", "--trainer.max_steps", "12")  # max_steps taken from it
    assert sorted(reference) == list(range(12))  # Lightning's step axis counts from 0
    assert reference[2] == pytest.approx(0.003) and reference[11] == pytest.approx(0.0003)
    assert "lr_scheduler CosineLR" not in caplog.text
    length = ("--model.lr_scheduler.init_args.max_steps", "12")
    _, err = fit("resumed", "--trainer.max_steps", "6", *length)
    assert "CosineLR max_steps 12 is not trainer.max_steps 6: the learning rate stops" in err
    resumed, err = fit("resumed", "--trainer.max_steps", "12", "--ckpt_path", "last", *length)
    assert resumed == reference and "CosineLR max_steps" not in err
    epochs, _ = fit(
        "epochs", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "5",
        "--trainer.val_check_interval", "1.0",
    )  # fmt: skip
    assert "lr_scheduler CosineLR max_steps 5: trainer.max_epochs 1 x 5 optimizer" in caplog.text
    assert [epochs[s] for s in range(5)] == pytest.approx([0.001, 0.002, 0.003, 0.00165, 0.0003])


@pytest.mark.slow  # two torch.compile passes: ~13 s; CI runs the slow tier too
def test_compile_compiles_twice_for_batches_of_varying_rows_and_lengths(monkeypatch):
    """``compile=True`` under torch's automatic dynamic shapes: the first batch's sizes, then
    one graph with the changing sizes symbolic, not one graph per batch shape."""
    from torch._dynamo.testing import CompileCounter

    counter, compile_ = CompileCounter(), torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, backend=counter, **kw))
    module = tiny_model(compile=True)
    torch._dynamo.reset()
    for rows, length in ((3, 5), (7, 9), (4, 6), (9, 4), (2, 11)):
        src = torch.randint(4, 16, (rows, length))
        module._forward(src, src[:, :-1], (src != 0)[:, None, None, :])
    torch._dynamo.reset()
    assert counter.frame_count == 2


def test_plateau_checks_before_training():
    """A pair's metric that the run's pairs do not log is refused before training, a negative
    patience when the module is built; a mode against its metric is warned about; the
    monitor of Lightning's class is no setting a resume keeps (the configured one is used)."""
    from functools import partial

    from lightning.pytorch.cli import ReduceLROnPlateau as Named
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    from seq2seq.checkpoint.restore import changed_settings
    from seq2seq.optim import check_plateau_monitor, lightning_schedule

    def schedule(monitor: str, mode: str = "max") -> dict:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        return lightning_schedule(Named(optimizer, monitor=monitor, mode=mode), ["bleu"])

    check_plateau_monitor(schedule("val/de-en/bleu"), ["de-en", "fr-en"])
    with pytest.raises(ValueError, match=r"logs val/<pair>/bleu for de-en, fr-en$"):
        check_plateau_monitor(schedule("val/it-en/bleu"), ["de-en", "fr-en"])
    with pytest.raises(ValueError, match=r"logs val/bleu \(one language pair\)$"):
        check_plateau_monitor(schedule("val/de-en/bleu"), ["de-en"])
    with pytest.warns(UserWarning, match=r"val/bleu in mode min, but a higher bleu is better"):
        check_plateau_monitor(schedule("val/bleu", "min"), ["de-en"])
    with pytest.warns(UserWarning, match=r"val/loss in mode max, but a lower loss is better"):
        check_plateau_monitor(schedule("val/loss", "max"), ["de-en"])
    with pytest.raises(ValueError, match=r"lr_scheduler patience must be >= 0, got -1"):
        tiny_model(lr_scheduler=partial(ReduceLROnPlateau, patience=-1))
    saved = {"lr_schedulers": [schedule("val/de-en/bleu")["scheduler"].state_dict()]}
    assert changed_settings(saved, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1),
                            schedule("val/bleu")["scheduler"]) == []  # fmt: skip


def test_resume_with_another_plateau_mode_is_refused():
    """The checkpoint's plateau mode and best value would be restored while a monitor left to
    the mode follows the configured one: a resume with another mode is refused, naming both."""
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    from seq2seq.checkpoint.format import class_name
    from seq2seq.checkpoint.restore import check_resumed_training

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.001)
    saved = ReduceLROnPlateau(optimizer, mode="max").state_dict()
    checkpoint = {
        "seq2seq": {"optimizer": class_name(optimizer), "lr_scheduler": class_name(
            ReduceLROnPlateau(optimizer))},
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [saved],
    }  # fmt: skip
    check_resumed_training(checkpoint, optimizer, ReduceLROnPlateau(optimizer, mode="max"))
    with pytest.raises(
        ValueError,
        match=r"ReduceLROnPlateau has mode max, this run's min: .* "
        r"resume with mode max \(model\.lr_scheduler\.init_args\.mode\)",
    ):
        check_resumed_training(checkpoint, optimizer, ReduceLROnPlateau(optimizer, mode="min"))
