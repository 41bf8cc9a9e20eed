"""seq2seq.callbacks.EMA: the moving average's arithmetic, validation with the average, the
checkpoint layout (average as ``state_dict``, training weights beside it) and who reads which
weights. Its exact resume is in test_resume.py, its DDP run in test_ddp.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS, tiny_model

from seq2seq.callbacks import EMA
from seq2seq.checkpoint import load_checkpoint
from seq2seq.checkpoint.format import EMA_KEY, TRAINING_WEIGHTS


def _trainer(step: int = 0, fn: str = "fit") -> SimpleNamespace:
    return SimpleNamespace(global_step=step, state=SimpleNamespace(fn=fn))


def _train(module, ema: EMA, steps: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``steps`` fake optimizer steps (random changes to every parameter), each followed by
    the callback's batch end; returns the parameters after each step (float64)."""
    generator = torch.Generator().manual_seed(seed)
    history = []
    for step in range(1, steps + 1):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(torch.randn(p.shape, generator=generator).to(p.dtype))
        ema.on_train_batch_end(_trainer(step), module)
        history.append({n: p.detach().double().clone() for n, p in module.named_parameters()})
    return history


def _reference(history, decay: float, start_step: int, every_n_steps: int):
    average = None
    for step, weights in enumerate(history, start=1):
        if step < max(start_step, 1) or (step - start_step) % every_n_steps:
            continue
        if average is None:
            average = {k: v.clone() for k, v in weights.items()}
        else:
            average = {k: decay * average[k] + (1 - decay) * weights[k] for k in average}
    return average


def _saved(module, ema: EMA) -> dict:
    checkpoint = {"state_dict": module.state_dict()}
    ema.on_save_checkpoint(_trainer(), module, checkpoint)
    return checkpoint


@pytest.mark.parametrize(
    "decay, start_step, every_n_steps", [(0.9, 0, 1), (0.5, 3, 2), (0.75, 1, 4)]
)
def test_average_follows_the_formula(decay, start_step, every_n_steps):
    module = tiny_model()
    ema = EMA(decay=decay, start_step=start_step, every_n_steps=every_n_steps)
    ema.setup(_trainer(), module, "fit")
    history = _train(module, ema, steps=11)
    expected = _reference(history, decay, start_step, every_n_steps)
    checkpoint = _saved(module, ema)
    updates = sum(
        1 for s in range(1, 12) if s >= max(start_step, 1) and (s - start_step) % every_n_steps == 0
    )
    assert checkpoint[EMA_KEY]["updates"] == ema.updates == updates
    for name, value in expected.items():
        torch.testing.assert_close(
            checkpoint["state_dict"][name].double(), value, rtol=1e-5, atol=1e-5
        )
        assert torch.equal(checkpoint[TRAINING_WEIGHTS][name], module.state_dict()[name])


def test_tied_weights_carry_the_average_under_every_key():
    module = tiny_model(tie_embeddings="all")
    keys = {
        k
        for k, v in module.state_dict(keep_vars=True).items()
        if v is module.model.encoder.embed.weight
    }
    assert len(keys) >= 2, "tiny model should tie the embeddings"
    ema = EMA(decay=0.5)
    ema.setup(_trainer(), module, "fit")
    _train(module, ema, steps=3)
    state = _saved(module, ema)["state_dict"]
    first = state[sorted(keys)[0]]
    assert all(torch.equal(state[k], first) for k in keys)
    assert not torch.equal(first, module.model.encoder.embed.weight.detach())


def test_update_reads_nothing_back_from_the_device(monkeypatch):
    """No ``.item()``, ``bool(tensor)``, ``.tolist()`` or ``.cpu()`` in an update: each would
    be a host synchronisation per training step on a GPU."""
    module = tiny_model()
    ema = EMA(decay=0.9)
    ema.setup(_trainer(), module, "fit")
    ema.on_train_batch_end(_trainer(1), module)  # the first update copies

    def forbidden(*args, **kwargs):
        raise AssertionError("read back from the device")

    for name in ("item", "__bool__", "tolist", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    for step in range(2, 5):
        ema.on_train_batch_end(_trainer(step), module)
    monkeypatch.undo()
    assert ema.updates == 4


def test_validation_runs_on_the_average_and_gives_the_training_weights_back():
    module = tiny_model()
    ema = EMA(decay=0.5)
    ema.setup(_trainer(), module, "fit")
    history = _train(module, ema, steps=4)
    training = {k: v.clone() for k, v in module.state_dict().items()}
    expected = _reference(history, 0.5, 0, 1)
    ema.on_validation_start(_trainer(4), module)
    for name, p in module.named_parameters():
        torch.testing.assert_close(p.detach().double(), expected[name], rtol=1e-5, atol=1e-5)
    # A checkpoint written now (Ctrl-C during validation) still has both sets right.
    checkpoint = _saved(module, ema)
    for name, value in training.items():
        assert torch.equal(checkpoint[TRAINING_WEIGHTS][name], value), name
    for name, value in expected.items():
        torch.testing.assert_close(checkpoint["state_dict"][name].double(), value)
    ema.on_validation_end(_trainer(4), module)
    for name, value in module.state_dict().items():
        assert torch.equal(value, training[name]), name
    # Outside fit (validate, test) the model's weights are left as they are.
    ema.on_validation_start(_trainer(4, fn="validate"), module)
    assert all(torch.equal(v, training[k]) for k, v in module.state_dict().items())


def test_bf16_weights_are_averaged_in_float32():
    module = tiny_model().to(torch.bfloat16)
    ema = EMA(decay=0.9)
    ema.setup(_trainer(), module, "fit")
    _train(module, ema, steps=3)
    assert all(t.dtype == torch.float32 for t in ema._average)
    state = _saved(module, ema)["state_dict"]
    assert state["model.encoder.embed.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize(
    "settings, message",
    [({"decay": 1.0}, "decay"), ({"decay": 0.0}, "decay"), ({"start_step": -1}, "start_step"),
     ({"every_n_steps": 0}, "every_n_steps")],
)  # fmt: skip
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        EMA(**settings)


# ---------------------------------------------------------------------- through the commands
@pytest.fixture(scope="module")
def ema_run(tmp_path_factory, multi30k_dir) -> Path:
    """configs/tiny.yaml (20 steps, validations at 10 and 20) with an EMA of decay 0.8."""
    from seq2seq.cli import cli_main

    workdir = tmp_path_factory.mktemp("ema_run")
    cli_main(
        [
            "fit", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--checkpoint_dir", str(workdir / "checkpoints"),
            "--trainer.logger.init_args.save_dir", str(workdir / "logs"),
            "--data.cache_dir", str(workdir / "cache"),
            "--trainer.callbacks+=seq2seq.callbacks.EMA",
            "--trainer.callbacks.decay", "0.8",
        ]
    )  # fmt: skip
    return workdir


def test_training_weights_are_those_of_a_run_without_ema(ema_run, tiny_run):
    """The average does not touch training: the training weights saved beside it equal a run
    of the same config without EMA, and the average (state_dict) differs from them."""
    with_ema = load_checkpoint(ema_run / "checkpoints/last.ckpt")
    without = load_checkpoint(tiny_run / "checkpoints/tiny/last.ckpt")
    assert with_ema["global_step"] == without["global_step"] == 20
    assert with_ema[EMA_KEY]["updates"] == 20
    for name, value in without["state_dict"].items():
        assert torch.equal(with_ema[TRAINING_WEIGHTS][name], value), name
    name = "model.decoder.layers.0.ff.fc1.weight"
    assert not torch.equal(with_ema["state_dict"][name], with_ema[TRAINING_WEIGHTS][name])


def test_fit_validates_the_average_that_validate_reads(
    ema_run, multi30k_dir, monkeypatch, tmp_path
):
    """The hypotheses of fit's last validation equal those of ``validate --ckpt_path last``,
    which reads state_dict (the average)."""
    from seq2seq.cli import cli_main

    monkeypatch.chdir(tmp_path)
    cli_main(
        [
            "validate", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--data.cache_dir", str(ema_run / "cache"),
            "--ckpt_path", str(ema_run / "checkpoints/last.ckpt"),
            "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
        ]
    )  # fmt: skip
    fitted = (ema_run / "logs/tiny/version_0/hypotheses/val.step20.txt").read_text()
    (validated,) = (tmp_path / "logs").rglob("hypotheses/val*.txt")
    assert validated.read_text() == fitted


def test_average_says_it_takes_the_ema_weights(ema_run, tmp_path, capsys):
    from seq2seq.cli import cli_main

    checkpoints = ema_run / "checkpoints"
    (best,) = [p for p in checkpoints.glob("*.ckpt") if p.name != "last.ckpt"]
    output = tmp_path / "avg.ckpt"
    cli_main(
        ["average", "--inputs", str(best), str(checkpoints / "last.ckpt"), "--output", str(output)]
    )
    assert "(their EMA weights)" in capsys.readouterr().out
    averaged = load_checkpoint(output)
    assert TRAINING_WEIGHTS not in averaged and EMA_KEY not in averaged
    last, first = (load_checkpoint(p)["state_dict"] for p in (checkpoints / "last.ckpt", best))
    name = "model.encoder.layers.0.ff.fc1.weight"
    torch.testing.assert_close(averaged["state_dict"][name], (last[name] + first[name]) / 2)


def test_init_from_says_it_takes_the_ema_weights(ema_run, caplog):
    import logging

    from seq2seq.checkpoint.format import model_config
    from seq2seq.cli.checkpoint_args import load_initial_weights
    from seq2seq.module import TranslationModule

    path = ema_run / "checkpoints/last.ckpt"
    checkpoint = load_checkpoint(path)
    model = TranslationModule(**model_config(checkpoint))
    datamodule = SimpleNamespace(tokenizer_path=None, tokenizer=None)
    with caplog.at_level(logging.INFO):
        load_initial_weights(model, datamodule, str(path), load_checkpoint)
    assert "from the EMA weights (decay 0.8, 20 updates) of" in caplog.text
    name = "encoder.layers.0.ff.fc1.weight"
    assert torch.equal(model.model.state_dict()[name], checkpoint["state_dict"]["model." + name])


def test_bf16_mixed_training_keeps_a_float32_average(tmp_path, multi30k_dir):
    from seq2seq.cli import cli_main

    cli_main(
        [
            "fit", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--checkpoint_dir", str(tmp_path / "checkpoints"),
            "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
            "--data.cache_dir", str(tmp_path / "cache"),
            "--trainer.precision", "bf16-mixed",
            "--trainer.max_steps", "4", "--trainer.val_check_interval", "4",
            "--trainer.limit_val_batches", "1",
            "--trainer.callbacks+=seq2seq.callbacks.EMA",
            "--trainer.callbacks.decay", "0.5",
        ]
    )  # fmt: skip
    saved = load_checkpoint(tmp_path / "checkpoints/last.ckpt")
    assert saved[EMA_KEY]["updates"] == 4
    name = "model.decoder.layers.0.ff.fc1.weight"
    assert saved["state_dict"][name].dtype == torch.float32
    assert not torch.equal(saved["state_dict"][name], saved[TRAINING_WEIGHTS][name])
