"""Resuming interrupted training, and atomic checkpoint writes.

A run killed with SIGKILL in the middle of an epoch and resumed with ``--ckpt_path last``
must continue exactly where the last checkpoint left it: same learning rate, optimizer
state, batch order and dropout masks, so that (on CPU, float32) its per-step training
losses equal those of a run that was never interrupted.
"""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import multi30k_slice, run_main
from lightning.pytorch.callbacks import Callback

from seq2seq.checkpoint import AtomicCheckpointIO, load_checkpoint

TESTS = Path(__file__).resolve().parent
CONFIGS = TESTS.parent / "configs"

MAX_STEPS = 12
CKPT_EVERY = 3
KILL_AT = 8  # killed before step 9; the last checkpoint holds step 6


class KillAtStep(Callback):
    """Kills its own process with SIGKILL before training batch ``step`` (test helper)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def _hear_sigint() -> None:
    """Ctrl-C as a terminal delivers it: a shell starts a background job with SIGINT ignored,
    which Python then leaves as it is (no KeyboardInterrupt); the helpers that send SIGINT
    restore Python's handler in ``setup``, before ``LastCheckpoint`` looks at it."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class InterruptAtStep(KillAtStep):
    """Sends SIGINT (Ctrl-C) ``times`` times to its own process before the backward pass of
    training batch ``step``, inside the batch (test helper)."""

    def __init__(self, step: int, times: int = 1) -> None:
        super().__init__(step)
        self.times = times

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if trainer.global_step == self.step:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        pass

    def setup(self, trainer, pl_module, stage: str) -> None:
        _hear_sigint()


class SignalAtEpochEndValidation(Callback):
    """Sends SIGTERM to its own process as the validation at the end of epoch 0 starts (test
    helper)."""

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == 0 and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            os.kill(os.getpid(), signal.SIGTERM)


class SignalAtStep(KillAtStep):
    """Sends SIGTERM to its own process before training batch ``step`` (test helper)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class SignalInAccumulation(Callback):
    """Sends SIGTERM to its own process during the backward pass of the first batch of the
    accumulation window of optimizer step ``step`` (test helper)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        loop = trainer.fit_loop.epoch_loop
        if trainer.global_step == self.step and loop._should_accumulate():
            os.kill(os.getpid(), signal.SIGTERM)


class StopAtStep(Callback):
    """Asks the trainer to stop after training batch ``step``, as ``max_time``'s timer does
    (test helper)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


def _write_corpus(multi30k_dir: Path, folder: Path, sizes: dict[str, int]) -> Path:
    """Writes the first ``n`` lines of each Multi30k split ``{split: n}`` as plain files."""
    return multi30k_slice(folder, sizes, multi30k_dir)


def _config(
    tmp_path: Path, data_dir: Path, name: str, kill_at: int | None = None, ema: bool = False
) -> Path:
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    callbacks = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {
                "dirpath": str(tmp_path / name / "checkpoints"),
                "every_n_train_steps": CKPT_EVERY,
                "save_top_k": -1,
                "save_last": True,
            },
        }
    ]
    if ema:  # a moving average of the weights must resume exactly too
        callbacks.append(
            {
                "class_path": "seq2seq.callbacks.EMA",
                "init_args": {"decay": 0.7, "start_step": 2, "every_n_steps": 2},
            }
        )
    if kill_at is not None:
        callbacks.append({"class_path": "test_resume.KillAtStep", "init_args": {"step": kill_at}})
    config["trainer"].update(
        max_steps=MAX_STEPS,
        log_every_n_steps=1,
        val_check_interval=5,
        limit_val_batches=1,
        deterministic=True,
        logger={
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(tmp_path / name / "logs"), "name": "run"},
        },
        callbacks=callbacks,
    )
    config["model"].update(dropout=0.3, attention_dropout=0.1, activation_dropout=0.1)
    config["data"].update(
        data_dir=str(data_dir),
        cache_dir=str(tmp_path / "cache"),
        max_tokens=400,
        download=False,
        test_splits=[],
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _fit(config: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, "-m", "seq2seq.cli", "fit", "--config", str(config), *extra],
        capture_output=True, text=True, env=env, cwd=config.parent, timeout=300,
    )  # fmt: skip


def _fit_here(monkeypatch, capsys, config: Path, *extra: str) -> tuple[int, str]:
    """:func:`_fit` in this process, for runs that no signal stops and no test compares bit for
    bit with another (a process costs some seconds of imports): exit status, and standard
    output and error. Runs compared bit for bit stay in fresh processes, whose arithmetic
    repeats exactly: in a long-lived test process a resumed run's last step once differed from
    its reference in the last bits."""
    with monkeypatch.context() as patch:
        patch.chdir(config.parent)
        code, out, err = run_main(patch, capsys, "fit", "--config", str(config), *extra)
    return code, out + "\n".join(err)


def _last_checkpoint_config(
    tmp_path: Path,
    data: Path,
    name: str,
    tag: object = None,
    checkpoint: dict | None = None,
    helpers: list[dict] | None = None,
    **trainer,
) -> Path:
    """:func:`_config`'s run ``name`` with a ``ModelCheckpoint`` in ``name/checkpoints``
    (``checkpoint``: more of its arguments), ``LastCheckpoint`` and the callbacks ``helpers``
    (this module's test helpers: ``{"class_path": ..., "init_args": ...}``), other trainer
    settings from ``trainer``; written as ``name.tag.yaml``."""
    config = yaml.safe_load(_config(tmp_path, data, name).read_text())
    config["trainer"].update(trainer)
    dirpath = str(tmp_path / name / "checkpoints")
    config["trainer"]["callbacks"] = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": dirpath, **(checkpoint or {})},
        },
        {"class_path": "seq2seq.callbacks.LastCheckpoint"},
        *(helpers or []),
    ]
    path = tmp_path / f"{name}.{tag}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _logged(run_dir: Path, key: str, last_version: bool = False) -> dict[int, float]:
    """``{step: value}`` of one metric over every version of a CSVLogger run (or its newest
    version only: the resumed run's own values)."""
    values = {}
    versions = sorted(
        (run_dir / "logs" / "run").glob("version_*/metrics.csv"),
        key=lambda path: int(path.parent.name.split("_")[1]),
    )
    for metrics in versions[-1:] if last_version else versions:
        with open(metrics, newline="") as f:
            for row in csv.DictReader(f):
                if row.get(key):
                    values[int(row["step"])] = float(row[key])
    return values


@pytest.mark.slow  # two fits and a killed one: ~30 s on 2 cores; CI runs the slow tier too
def test_sigkill_mid_epoch_then_resume_matches_uninterrupted_run(tmp_path, multi30k_dir):
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 600, "val": 20})
    reference = _fit(_config(tmp_path, data, "reference", ema=True))
    assert reference.returncode == 0, reference.stderr[-3000:]

    killed = _fit(_config(tmp_path, data, "resumed", kill_at=KILL_AT, ema=True))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(last)
    assert saved["global_step"] == KILL_AT // CKPT_EVERY * CKPT_EVERY
    assert "rng" in saved["seq2seq"] and "tokenizer" in saved["seq2seq"]
    origin = saved["seq2seq"]["origin"]  # the fingerprint of the run's initial weights

    resumed = _fit(_config(tmp_path, data, "resumed", ema=True), "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    start = saved["global_step"]
    expected = _logged(tmp_path / "reference", "train/loss")
    got = _logged(tmp_path / "resumed", "train/loss")
    assert sorted(expected) == list(range(MAX_STEPS))
    # Steps after the checkpoint were logged twice (killed run, then resumed run); the
    # resumed run's values come last and must equal the uninterrupted run's exactly.
    assert {s: got[s] for s in range(start, MAX_STEPS)} == {
        s: expected[s] for s in range(start, MAX_STEPS)
    }
    expected_lr = _logged(tmp_path / "reference", "train/lr")
    got_lr = _logged(tmp_path / "resumed", "train/lr")
    assert {s: got_lr[s] for s in range(start, MAX_STEPS)} == {
        s: expected_lr[s] for s in range(start, MAX_STEPS)
    }
    final = load_checkpoint(last)
    reference_final = load_checkpoint(tmp_path / "reference" / "checkpoints" / "last.ckpt")
    assert final["global_step"] == reference_final["global_step"] == MAX_STEPS
    # the resume kept the run's origin; the reference run, of the same seed, has the same one
    assert final["seq2seq"]["origin"] == reference_final["seq2seq"]["origin"] == origin
    for key, value in reference_final["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key
    # state_dict holds the moving average, saved beside the training weights: both equal.
    assert final["ema"]["updates"] == reference_final["ema"]["updates"] == 6
    for key, value in reference_final["training_state_dict"].items():
        assert torch.equal(final["training_state_dict"][key], value), key
    name = "model.decoder.layers.0.ff.fc1.weight"
    assert not torch.equal(final["state_dict"][name], final["training_state_dict"][name])


@pytest.mark.slow  # 4 runs of 3 processes each; CI runs the slow tier too (.ci/run)
@pytest.mark.parametrize("stop", ["sigterm", "sigint", "sigint_twice", "max_steps"])
def test_resume_after_a_stop_logs_at_the_uninterrupted_steps(tmp_path, multi30k_dir, stop):
    """last.ckpt written when fit stops between batches (SIGTERM, max_steps after the last
    validation, one Ctrl-C: the batch under way finishes first) or inside one (Ctrl-C twice)
    resumes with the uninterrupted run's losses logged at the same steps (Lightning shifts its
    logging step by one when it resumes from a checkpoint written inside a batch, unless the
    checkpoint allows for it)."""
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 600, "val": 20})

    def config(name: str, signal_at: int | None = None, sigint: int = 0) -> Path:
        helpers = []
        if signal_at is not None:
            helper = "InterruptAtStep" if sigint else "SignalAtStep"
            init = {"step": signal_at, **({"times": sigint} if sigint else {})}
            helpers.append({"class_path": f"test_resume.{helper}", "init_args": init})
        return _last_checkpoint_config(tmp_path, data, name, signal_at, helpers=helpers)

    reference = _fit(config("reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    if stop == "sigterm":  # acted on once the batch under way has finished: step 8
        first = _fit(config("resumed", signal_at=7))
        assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    elif stop == "sigint":  # batch 8 (global step 7) finishes, then fit stops: step 8
        first = _fit(config("resumed", signal_at=7, sigint=1))
        assert first.returncode == 128 + signal.SIGINT, first.stderr[-3000:]
        assert "stopping after the training batch under way" in first.stderr
        assert "KeyboardInterrupt: saved the training state at step 8" in first.stderr
    elif stop == "sigint_twice":  # interrupts batch 9 before its optimizer step
        first = _fit(config("resumed", signal_at=8, sigint=2))
        assert first.returncode == 128 + signal.SIGINT, first.stderr[-3000:]
    else:
        first = _fit(config("resumed"), "--trainer.max_steps", "8")
        assert first.returncode == 0, first.stderr[-3000:]
    start = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")["global_step"]
    assert start == 8  # after the validation at step 5
    resumed = _fit(config("resumed"), "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = _logged(tmp_path / "reference", "train/loss")
    got = _logged(tmp_path / "resumed", "train/loss")
    assert sorted(got) == sorted(expected) == list(range(MAX_STEPS))
    assert {s: got[s] for s in range(start, MAX_STEPS)} == {
        s: expected[s] for s in range(start, MAX_STEPS)
    }


def test_sigterm_exits_143_and_saves_last_checkpoint_only(tmp_path, multi30k_dir):
    """Lightning stops gracefully on SIGTERM; the CLI reports it with status 143 (not 0, so a
    ``fit && test`` chain or a scheduler sees it), and LastCheckpoint writes the state to
    last.ckpt without adding an unscored file among the scored checkpoints."""
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 600, "val": 20})
    config = yaml.safe_load(_config(tmp_path, data, "term").read_text())
    folder = tmp_path / "term" / "checkpoints"
    config["trainer"]["callbacks"] = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(folder), "monitor": "val/bleu", "mode": "max"},
        },
        {"class_path": "seq2seq.callbacks.LastCheckpoint"},
        {"class_path": "test_resume.SignalAtStep", "init_args": {"step": 2}},
    ]
    path = tmp_path / "term.yaml"
    path.write_text(yaml.safe_dump(config))
    run = _fit(path)
    assert run.returncode == 128 + signal.SIGTERM, run.stderr[-3000:]
    assert "seq2seq: terminated (SIGTERM)" in run.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]
    # Lightning acts on the signal once the batch under way has finished (before validation).
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == 3


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    """A write that dies half-way leaves the previous file intact and no temporary file."""
    path = tmp_path / "checkpoints" / "last.ckpt"
    writer = AtomicCheckpointIO()
    writer.save_checkpoint({"global_step": 1, "state_dict": {"w": torch.ones(3)}}, path)
    real_save = torch.save

    def save_half_then_crash(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise KeyboardInterrupt  # stands for the process being stopped mid-write

    monkeypatch.setattr(torch, "save", save_half_then_crash)
    with pytest.raises(KeyboardInterrupt):
        writer.save_checkpoint({"global_step": 2, "state_dict": {"w": torch.zeros(3)}}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(path)["global_step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


@pytest.mark.slow  # 3 runs of 3 processes each; CI runs the slow tier too (.ci/run)
@pytest.mark.parametrize("stop", ["max_steps", "should_stop", "should_stop+last"])
def test_run_stopped_mid_epoch_resumes_that_epoch(tmp_path, multi30k_dir, stop):
    """A run that max_steps or max_time (a stop request mid-epoch) ended before the end of an
    epoch resumes with the rest of that epoch, not the next one: Lightning counts the cut
    epoch as finished when it writes last.ckpt at the end of the epoch or of training, and the
    checkpoint is saved as mid-epoch instead (seq2seq.checkpoint.keep_cut_epoch_unfinished).
    With validation once per epoch, ModelCheckpoint(save_last=True) writes last.ckpt at the
    end of the (cut) training epoch, as in the Multi30k configs. Same batches in the same order
    give the uninterrupted run's losses (dropout on), logged at the same steps, and weights.
    ``should_stop+last`` adds LastCheckpoint, which writes last.ckpt during the validation at
    the stop, before the step counter Lightning's loggers use has counted the last batch."""
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 600, "val": 20})
    last_checkpoint = stop.endswith("+last")

    def config(name: str, stop_at: int | None = None) -> Path:
        path = _config(tmp_path, data, name)
        config = yaml.safe_load(path.read_text())
        # Validation once per epoch; with LastCheckpoint every 4 steps (then no checkpoint is
        # written at the end of the cut epoch, only at the validation the stop adds).
        config["trainer"]["val_check_interval"] = 4 if last_checkpoint else 1.0
        # Dropout on: the stopped run validates at the stop and the reference does not, so the
        # validation must leave the random generators as it found them.
        config["trainer"]["callbacks"] = [
            {
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {
                    "dirpath": str(tmp_path / name / "checkpoints"),
                    "monitor": "val/bleu",
                    "mode": "max",
                    "save_last": True,
                    "enable_version_counter": False,  # as the Multi30k configs
                },
            }
        ]
        if last_checkpoint:  # as the Multi30k configs: also writes last.ckpt at validations
            config["trainer"]["callbacks"].append(
                {"class_path": "seq2seq.callbacks.LastCheckpoint"}
            )
        if stop_at is not None:
            config["trainer"]["callbacks"].append(
                {"class_path": "test_resume.StopAtStep", "init_args": {"step": stop_at}}
            )
        path.write_text(yaml.safe_dump(config))
        return path

    reference = _fit(config("reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    if stop == "max_steps":
        first = _fit(config("resumed"), "--trainer.max_steps", "5")
    else:
        first = _fit(config("resumed", stop_at=5))
    assert first.returncode == 0, first.stderr[-3000:]
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(last)
    assert saved["global_step"] == 5
    assert saved["epoch"] == 0
    assert saved["TranslationDataModule"]["train_sampler"]["epoch"] == 0

    resumed = _fit(config("resumed"), "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming a run trained with" not in resumed.stderr  # the same precision
    expected = _logged(tmp_path / "reference", "train/loss")
    got = _logged(tmp_path / "resumed", "train/loss", last_version=True)
    assert sorted(expected) == list(range(MAX_STEPS))
    assert got == {s: expected[s] for s in range(5, MAX_STEPS)}
    final = load_checkpoint(last)
    reference_final = load_checkpoint(tmp_path / "reference" / "checkpoints" / "last.ckpt")
    assert final["global_step"] == reference_final["global_step"] == MAX_STEPS
    # Still epoch 0 (its 12 first batches), as in the uninterrupted run: the resumed run did
    # not count an extra epoch.
    epochs = final["loops"]["fit_loop"]["epoch_progress"]
    assert epochs == reference_final["loops"]["fit_loop"]["epoch_progress"]
    assert epochs["total"]["completed"] == 0 and final["epoch"] == 0
    assert (
        final["TranslationDataModule"]["train_sampler"]
        == (reference_final["TranslationDataModule"]["train_sampler"])
    )
    for key, value in reference_final["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key


@pytest.mark.slow  # two runs of a tiny model, one stopped by SIGTERM: ~30 s on one core
def test_sigterm_at_the_end_of_an_epoch_resumes_with_the_next_epoch_in_order(
    tmp_path, multi30k_dir
):
    """SIGTERM during the validation that ends epoch 0: the resumed run trains epoch 1 with
    epoch 1's batches (not epoch 2's shuffle) and the same dropout masks, as the uninterrupted
    run does."""
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 300, "val": 20})

    def config(name: str, stop: bool = False) -> Path:
        helpers = [{"class_path": "test_resume.SignalAtEpochEndValidation"}] if stop else []
        return _last_checkpoint_config(
            tmp_path, data, name, stop, helpers=helpers,
            val_check_interval=1.0, max_steps=-1, max_epochs=2,
        )  # fmt: skip

    reference = _fit(config("reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    first = _fit(config("resumed", stop=True))
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    start = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")["global_step"]
    resumed = _fit(config("resumed"), "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for key in ("train/padding", "train/loss"):  # the same batches, the same dropout masks
        expected = _logged(tmp_path / "reference", key)
        got = _logged(tmp_path / "resumed", key, last_version=True)
        end = max(expected) + 1
        assert start < end
        assert got == {s: expected[s] for s in range(start, end)}, key


@pytest.mark.slow  # two runs of a tiny model, one stopped by SIGTERM: ~30 s on one core
def test_sigterm_inside_an_accumulation_window_stops_after_its_update(tmp_path, multi30k_dir):
    """With accumulate_grad_batches 2, a SIGTERM after the first batch of a step's window stops
    after the second one and its optimizer update (a stop in between would drop the first
    batch's gradient: the resumed run skips it); the resumed run ends with the uninterrupted
    run's weights."""
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 600, "val": 20})

    def config(name: str, stop: bool = False) -> Path:
        helpers = []
        if stop:
            helpers = [{"class_path": "test_resume.SignalInAccumulation", "init_args": {"step": 3}}]
        return _last_checkpoint_config(
            tmp_path, data, name, stop, helpers=helpers, accumulate_grad_batches=2, max_steps=6
        )

    reference = _fit(config("reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    first = _fit(config("resumed", stop=True))
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    saved = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert saved["global_step"] == 4
    batches = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["completed"]
    assert batches == 8
    resumed = _fit(config("resumed"), "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    reference_final = load_checkpoint(tmp_path / "reference" / "checkpoints" / "last.ckpt")
    assert final["global_step"] == reference_final["global_step"] == 6
    for key, value in reference_final["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key


class FailAtTrainStart(Callback):
    """Raises as training starts, after Lightning restored a checkpoint (test helper)."""

    def on_train_start(self, trainer, pl_module) -> None:
        raise RuntimeError("failed before the first batch")


def test_error_before_the_first_batch_of_a_resumed_run_keeps_last_ckpt(
    tmp_path, multi30k_dir, monkeypatch, capsys, caplog
):
    """A resumed run that fails before training a batch (a bad setting found after the
    checkpoint was restored) leaves last.ckpt as it was and does not claim to have saved."""
    caplog.set_level("INFO")
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 300, "val": 20})
    path = _last_checkpoint_config(tmp_path, data, "run", max_steps=3)
    config = yaml.safe_load(path.read_text())
    folder = tmp_path / "run" / "checkpoints"
    code, err = _fit_here(monkeypatch, capsys, path)
    assert code == 0, err[-3000:]
    before = (folder / "last.ckpt").read_bytes()

    config["trainer"]["max_steps"] = 6
    config["trainer"]["callbacks"].insert(0, {"class_path": "test_resume.FailAtTrainStart"})
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(RuntimeError, match="failed before the first batch"):
        _fit_here(monkeypatch, capsys, path, "--ckpt_path", "last")  # a traceback, status 1
    output = capsys.readouterr()
    said = output.out + output.err + caplog.text
    assert "saved the training state" not in said and "is saved to" not in said
    assert (folder / "last.ckpt").read_bytes() == before


def test_multi30k_early_stopping_allows_a_stop_before_the_first_validation(
    tmp_path, multi30k_dir, monkeypatch, capsys
):
    """The Multi30k config's EarlyStopping, in a run that max_steps ends before any validation
    (a short smoke run), lets it end normally: Lightning's default checks the monitored
    val/bleu at the end of the training epoch too, where there is none yet, and fails."""
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 300, "val": 20})
    config = yaml.safe_load(_config(tmp_path, data, "early").read_text())
    main = yaml.safe_load((CONFIGS / "multi30k_de_en.yaml").read_text())
    early = [c for c in main["trainer"]["callbacks"] if c["class_path"].endswith("EarlyStopping")]
    assert len(early) == 1
    config["trainer"].update(max_steps=2, val_check_interval=1.0, callbacks=early)
    path = tmp_path / "early.yaml"
    path.write_text(yaml.safe_dump(config))
    code, err = _fit_here(monkeypatch, capsys, path)
    assert code == 0, err[-3000:]


class InterruptValidation(Callback):
    """Sends SIGINT (Ctrl-C) to its own process inside the first validation of fit after
    training step ``step`` (test helper): in its first batch, or (``scoring``) once its
    batches are done, before its scores."""

    def __init__(self, step: int, scoring: bool = False) -> None:
        self.step, self.scoring = step, scoring

    def setup(self, trainer, pl_module, stage: str) -> None:
        _hear_sigint()

    def _interrupt(self, trainer) -> None:
        if not trainer.sanity_checking and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args) -> None:
        if not self.scoring:
            self._interrupt(trainer)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self.scoring:
            self._interrupt(trainer)


def _validation_stop_configs(tmp_path: Path, multi30k_dir: Path, step: int, scoring: bool = False):
    """``config(name, interrupt=False)``: :func:`_last_checkpoint_config`'s run ``name`` on 600
    training lines, every validation's checkpoint kept, with ``interrupt`` Ctrl-C in the
    validation after step ``step`` (:class:`InterruptValidation`)."""
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 600, "val": 20})
    helper = {
        "class_path": "test_resume.InterruptValidation",
        "init_args": {"step": step, "scoring": scoring},
    }

    def config(name: str, interrupt: bool = False) -> Path:
        return _last_checkpoint_config(
            tmp_path, data, name, interrupt,
            checkpoint={"monitor": "val/bleu", "mode": "max", "save_top_k": -1},
            helpers=[helper] if interrupt else [],
        )  # fmt: skip

    return config


def _reference_stop_and_resume(config, max_steps: str | None = None):
    """Fits ``reference`` whole, then ``resumed`` stopped by its Ctrl-C and resumed with
    ``--ckpt_path last`` (the same flags: ``--trainer.max_steps`` too, where given); the resume's
    completed process."""
    flags = ["--trainer.max_steps", max_steps] if max_steps else []
    reference = _fit(config("reference"), *flags)
    assert reference.returncode == 0, reference.stderr[-3000:]
    first = _fit(config("resumed", interrupt=True), *flags)
    assert first.returncode == 128 + signal.SIGINT, first.stderr[-3000:]
    resumed = _fit(config("resumed"), *flags, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return resumed


@pytest.mark.slow  # 4 runs, one stopped by Ctrl-C; CI runs the slow tier too (.ci/run)
def test_validation_cut_short_by_ctrl_c_is_run_again_on_resume(tmp_path, multi30k_dir):
    """Ctrl-C during a validation: the resumed run runs that validation again (its score is
    logged at the uninterrupted run's step), then trains on."""
    config = _validation_stop_configs(tmp_path, multi30k_dir, step=5)
    _reference_stop_and_resume(config)
    expected = _logged(tmp_path / "reference", "val/bleu")
    got = _logged(tmp_path / "resumed", "val/bleu", last_version=True)
    assert got == expected
    names = sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").glob("epoch*.ckpt"))
    assert names == sorted(
        p.name for p in (tmp_path / "reference" / "checkpoints").glob("epoch*.ckpt")
    )
    losses = _logged(tmp_path / "resumed", "train/loss", last_version=True)
    assert losses == {
        s: v for s, v in _logged(tmp_path / "reference", "train/loss").items() if s >= 5
    }
    # Resumed again from its scored checkpoint of the step-10 validation, which it wrote after
    # running the interrupted validation again: that validation is not run a third time.
    (scored,) = (tmp_path / "resumed" / "checkpoints").glob("*step=10*.ckpt")
    again = _fit(config("resumed"), "--ckpt_path", str(scored), "--trainer.max_steps", "11")
    assert again.returncode == 0, again.stderr[-3000:]
    assert not _logged(tmp_path / "resumed", "val/bleu", last_version=True)


@pytest.mark.slow  # 3 runs, one stopped by Ctrl-C; CI runs the slow tier too (.ci/run)
@pytest.mark.parametrize("scoring", [False, True], ids=["in_a_batch", "scoring"])
def test_the_last_validation_cut_short_is_run_on_a_resume_with_the_same_limit(
    tmp_path, multi30k_dir, scoring
):
    """Ctrl-C during the validation at max_steps (in its batch, or while it is scored), resumed
    with the same flags: there is no batch left to train, where Lightning would run it again,
    but the validation still runs, scored and checkpointed as the uninterrupted run's."""
    config = _validation_stop_configs(tmp_path, multi30k_dir, step=10, scoring=scoring)
    resumed = _reference_stop_and_resume(config, max_steps="10")
    assert "nothing trained" not in resumed.stderr
    reference_bleu = _logged(tmp_path / "reference", "val/bleu")
    last = max(reference_bleu)  # the step-10 validation, logged at its batch's index
    assert _logged(tmp_path / "resumed", "val/bleu") == {s: v for s, v in reference_bleu.items()}
    assert _logged(tmp_path / "resumed", "val/bleu", last_version=True) == {
        last: reference_bleu[last]
    }
    names = sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").glob("epoch*.ckpt"))
    assert names == sorted(
        p.name for p in (tmp_path / "reference" / "checkpoints").glob("epoch*.ckpt")
    )


@pytest.mark.slow  # 2 runs, one stopped by Ctrl-C; CI runs the slow tier too (.ci/run)
def test_the_last_validation_of_the_tiny_config_cut_short_is_run_on_resume(tmp_path, multi30k_dir):
    """The same with configs/tiny.yaml's callbacks (its ModelCheckpoint after validations only,
    LastCheckpoint, samples, heatmaps): Lightning's fit loop there ends before its first batch
    and its start hooks; the validation runs, its checkpoint is written and last.ckpt records
    it scored."""
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 600, "val": 20})
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["trainer"].update(max_steps=10, val_check_interval=5, limit_val_batches=2, logger=False)
    config["trainer"]["callbacks"][0]["init_args"]["dirpath"] = str(tmp_path / "ck")
    config["data"].update(data_dir=str(data), cache_dir=str(tmp_path / "cache"), test_splits=[])
    path = tmp_path / "run.yaml"
    interrupt = {"class_path": "test_resume.InterruptValidation", "init_args": {"step": 10}}
    path.write_text(yaml.safe_dump({**config, "trainer": {**config["trainer"], "callbacks": [
        *config["trainer"]["callbacks"], interrupt]}}))  # fmt: skip
    first = _fit(path)
    assert first.returncode == 128 + signal.SIGINT, first.stderr[-3000:]
    assert not list((tmp_path / "ck").glob("*step=10*"))
    path.write_text(yaml.safe_dump(config))
    resumed = _fit(path, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "nothing trained" not in resumed.stderr
    assert [p.name for p in (tmp_path / "ck").glob("*step=10*")] == ["epoch=0-step=10.ckpt"]
    last = torch.load(tmp_path / "ck" / "last.ckpt", map_location="cpu", weights_only=False)
    progress = last["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]["current"]
    assert progress["completed"] == progress["ready"] > 0
    assert (tmp_path / "hypotheses" / "val.step10.txt").is_file()


def test_last_checkpoint_message_tells_an_error_from_a_stop(monkeypatch, caplog):
    """After Ctrl-C or SIGTERM the saved state is resumed as it is; after an error (e.g. a bad
    line met in a streamed corpus) the message says to mend the cause first."""
    import logging
    from types import SimpleNamespace

    from seq2seq.callbacks import LastCheckpoint

    caplog.set_level(logging.INFO)
    callback = LastCheckpoint()
    callback._start_step = 0
    monkeypatch.setattr(LastCheckpoint, "_path", lambda self, trainer: Path("run/last.ckpt"))
    monkeypatch.setattr(LastCheckpoint, "_save", lambda self, trainer, path: None)
    trainer = SimpleNamespace(global_step=5)
    callback.on_exception(trainer, None, ValueError("misaligned files"))
    assert (
        "training stopped on an error (ValueError, below); the training state at step 5 is "
        f"saved to {Path('run/last.ckpt')}: once the cause is mended, resume with --ckpt_path last"
    ) in caplog.text
    caplog.clear()
    callback.on_exception(trainer, None, KeyboardInterrupt())
    assert "KeyboardInterrupt: saved the training state at step 5" in caplog.text
    # A run given --checkpoint_dir is resumed with it.
    callback.checkpoint_dir = "ckpts/fr_en"
    for stop in (KeyboardInterrupt(), ValueError("misaligned files")):
        caplog.clear()
        callback.on_exception(trainer, None, stop)
        assert caplog.text.rstrip().endswith(
            "resume with --ckpt_path last --checkpoint_dir ckpts/fr_en added to the run's command"
        ), caplog.text
    # ... and with the logger's name where the command line gave it (its TensorBoard folder)
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from seq2seq.cli.app import _logger_name_given

    callback.logger_name = "tiny_term"
    caplog.clear()
    callback.on_exception(trainer, None, KeyboardInterrupt())
    assert caplog.text.rstrip().endswith(
        "--checkpoint_dir ckpts/fr_en --trainer.logger.init_args.name tiny_term added to the run's "
        "command"
    ), caplog.text
    board = SimpleNamespace(logger=TensorBoardLogger("logs", name="tiny_term"))
    for argv, name in (
        (["--trainer.logger.init_args.name", "tiny_term"], "tiny_term"),
        (["--trainer.logger.init_args.name=tiny_term"], "tiny_term"),
        (["--trainer.logger.name", "tiny_term"], "tiny_term"),
        (["--config", "tiny.yaml"], None),  # the config's name: the config gives it again
    ):
        assert _logger_name_given(argv, board) == name, argv
    csv = SimpleNamespace(logger=CSVLogger("logs", name="tiny_term"))  # a new version anyway
    assert _logger_name_given(["--trainer.logger.init_args.name", "x"], csv) is None


def test_resume_on_a_grown_corpus_keeps_the_checkpoints_tokenizer(tmp_path, multi30k_dir):
    """fit --ckpt_path last after lines were added to the training and validation files
    continues with the checkpoint's SentencePiece model: no new one is trained (it would
    differ, and the module would refuse it after the corpus was tokenised). Each changed split
    is named in a warning."""
    from seq2seq.cli import cli_main

    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 600, "val": 20})
    argv = [
        "fit",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(data),
        "--data.cache_dir", str(tmp_path / "cache"),
        "--data.vocab_size", "300",
        "--data.test_splits", "[]",
        "--data.download", "false",
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
        "--checkpoint_dir", str(tmp_path / "checkpoints"),
        "--trainer.val_check_interval", "2",
        "--trainer.limit_val_batches", "1",
    ]  # fmt: skip
    cli_main([*argv, "--trainer.max_steps", "2"])
    models = sorted((tmp_path / "cache").glob("spm_*.model"))
    assert len(models) == 1
    _write_corpus(multi30k_dir, tmp_path / "more", {"train": 800, "val": 25})
    for name in ("train.de", "train.en", "val.de", "val.en"):
        grown = (tmp_path / "more" / name).read_text(encoding="utf-8")
        (data / name).write_text(grown, encoding="utf-8")
    with pytest.warns(UserWarning) as caught:
        cli = cli_main([*argv, "--trainer.max_steps", "4", "--ckpt_path", "last"])
    assert cli.trainer.global_step == 4
    changed = [str(w.message) for w in caught if "other sentence pairs" in str(w.message)]
    assert changed == [
        "The training split 'train' holds other sentence pairs than when the checkpoint was "
        "written (576 then, 767 now, those the length filters keep): epoch 0 goes on after 2 "
        "batches, in a plan of batches of these pairs, so some are left out of it and others "
        "trained twice. To train the checkpoint's model on another corpus, start a new run "
        "from its weights (--init_from), with a schedule, step count and checkpoint ranking "
        "of its own.",
        "The validation split 'val' holds other sentence pairs than when the checkpoint was "
        "written (20 then, 25 now): its scores are not comparable with the checkpoint's, by "
        "which the best checkpoints were ranked and early stopping waits; to rank them afresh, "
        "start a new run from its weights (--init_from).",
    ]
    assert sorted((tmp_path / "cache").glob("spm_*.model")) == models


def test_resuming_in_another_precision_says_so(tmp_path, multi30k_dir, monkeypatch, capsys):
    """A run resumed with another --trainer.precision than it trained in is told so in one
    line (it goes on, with other rounding and speed); resumed in the same precision it says
    nothing (test_run_stopped_mid_epoch_resumes_that_epoch)."""
    data = _write_corpus(multi30k_dir, tmp_path / "data", {"train": 300, "val": 20})
    path = _last_checkpoint_config(tmp_path, data, "run", max_steps=2)
    code, err = _fit_here(monkeypatch, capsys, path)
    assert code == 0, err[-3000:]
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert saved["seq2seq"]["precision"] == "32-true"
    other = ("--ckpt_path", "last", "--trainer.max_steps", "3", "--trainer.precision", "bf16-mixed")
    code, err = _fit_here(monkeypatch, capsys, path, *other)
    assert code == 0, err[-3000:]
    expected = (
        "seq2seq: warning: resuming a run trained with --trainer.precision 32-true under "
        "--trainer.precision bf16-mixed: it goes on in bf16-mixed (give --trainer.precision "
        "32-true to keep the run's)"
    )
    assert expected in err.splitlines(), err[-3000:]


def test_data_changes_name_each_split_that_holds_other_pairs():
    """The checkpoint's record of each split (pairs, digest of their token lengths) against
    the run's: the same data, a split the checkpoint has no record of (one written before
    the record, or a new split) and the predict file say nothing; the same number of pairs of
    other lengths is a change; the training split's warning says where the epoch goes on."""
    import numpy as np

    from seq2seq.data.resume import data_changes, data_record

    def lengths(*rows):
        return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])

    run = {"train": lengths((3, 4), (5, 6), (7, 7)), "val": lengths((2, 2)), "predict": lengths()}
    state = {"data": data_record(run), "train_sampler": {"epoch": 3, "batches_yielded": 7}}
    assert data_changes(state, run, "train") == []
    assert data_changes({}, run, "train") == []
    assert data_changes({"data": {}}, {"test": lengths((1, 1))}, "train") == []
    other = {"train": lengths((3, 4), (5, 6), (7, 8)), "val": lengths((2, 2), (3, 3)),
             "predict": lengths((1, 1))}  # fmt: skip
    train, val = data_changes(state, other, "train")
    assert train.startswith(
        "The training split 'train' holds other sentence pairs than when the checkpoint was "
        "written (3, as many, those the length filters keep): epoch 3 goes on after 7 batches"
    )
    assert val.startswith(
        "The validation split 'val' holds other sentence pairs than when the checkpoint was "
        "written (1 then, 2 now): its scores are not comparable"
    )
    at_an_epoch_end = {**state, "train_sampler": {"epoch": 4, "batches_yielded": 0}}
    (train,) = data_changes(at_an_epoch_end, {"train": other["train"]}, "train")
    assert "keep): training goes on over these pairs. To train" in train
