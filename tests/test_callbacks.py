"""Tests of seq2seq.callbacks: the class paths the configs name, and TranslationWriter's
output order and formats, ExactResume's presence and generator states (the TensorBoard
callbacks and TextProgress: test_monitoring.py; LastCheckpoint's and ExactResume's stops and
resumes: test_resume.py)."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import CONFIGS, quiet_cpu_trainer, tiny_model

import seq2seq.callbacks
from seq2seq.callbacks import ExactResume, TokenThroughput, TranslationWriter


def _config_class_paths() -> set[str]:
    found = set()
    for path in sorted(CONFIGS.rglob("*.yaml")):
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        trainer = config.get("trainer", config) if isinstance(config, dict) else {}
        for callback in trainer.get("callbacks") or []:
            if isinstance(callback, dict) and callback["class_path"].startswith("seq2seq."):
                found.add(callback["class_path"])
    return found


def test_the_configs_callbacks_resolve_and_keep_their_short_path(tiny_run):
    """Each ``seq2seq.callbacks.X`` of the configs imports, and the config.yaml a run saves
    names it by that short path (as before the callbacks became a package of modules)."""
    paths = _config_class_paths()
    assert paths >= {"seq2seq.callbacks.LastCheckpoint", "seq2seq.callbacks.ValidationSamples"}
    for class_path in paths:
        module, name = class_path.rsplit(".", 1)
        assert isinstance(getattr(importlib.import_module(module), name), type)
    assert set(seq2seq.callbacks.__all__) >= {p.rsplit(".", 1)[1] for p in paths}
    saved = yaml.safe_load(
        (tiny_run / "lightning_logs/tiny/version_0/config.yaml").read_text(encoding="utf-8")
    )
    tiny = yaml.safe_load((CONFIGS / "tiny.yaml").read_text(encoding="utf-8"))

    def ours(config) -> list[str]:
        paths = [c["class_path"] for c in config["trainer"]["callbacks"]]
        return [p for p in paths if p.startswith("seq2seq.")]

    assert ours(saved) == ours(tiny) and ours(tiny)


def _write(writer: TranslationWriter, predictions) -> None:
    trainer = SimpleNamespace(global_rank=0, is_global_zero=True)
    writer.write_on_epoch_end(trainer, None, predictions, None)


@pytest.mark.parametrize("nested", [False, True])
def test_translations_are_written_in_input_order(tmp_path, capsys, nested):
    """Batches arrive in any order (a token-budget sampler sorts by length); the file has one
    line per input line, in input order; predictions of several loaders are flattened."""
    batches = [
        [(2, [("c", -0.3)]), (0, [("a", -0.1)])],
        [(1, [("b", -0.2)])],
    ]
    writer = TranslationWriter(str(tmp_path / "out" / "hyp.txt"))
    _write(writer, [batches] if nested else batches)
    assert (tmp_path / "out" / "hyp.txt").read_text(encoding="utf-8") == "a\nb\nc\n"
    assert capsys.readouterr().out == f"wrote 3 translations to {writer.output_path}\n"


def test_n_best_rows_carry_line_and_score(tmp_path):
    writer = TranslationWriter(str(tmp_path / "hyp.txt"), n_best=2)
    _write(writer, [[(1, [("b1", -0.5), ("b2", -1.25)]), (0, [("a1", -0.1), ("a2", -2.0)])]])
    rows = Path(writer.output_path).read_text(encoding="utf-8").splitlines()
    assert rows == ["0\t-0.1000\ta1", "0\t-2.0000\ta2", "1\t-0.5000\tb1", "1\t-1.2500\tb2"]


def test_other_ranks_write_nothing(tmp_path):
    writer = TranslationWriter(str(tmp_path / "hyp.txt"))
    trainer = SimpleNamespace(global_rank=1, is_global_zero=False)
    writer.write_on_epoch_end(trainer, None, [[(0, [("a", 0.0)])]], None)
    assert not writer.output_path.exists()


def test_the_module_adds_its_callbacks_once_to_a_trainer_without_them(tmp_path, caplog):
    """A config that names neither ExactResume nor TokenThroughput still resumes exactly and
    logs train/tokens_per_s: the module adds them (``configure_callbacks``), once however often
    the trainer runs it."""
    from seq2seq.data.batching import collate

    module = tiny_model()
    batch = collate([{"index": 0, "src": [5, 6, 3], "tgt": [7, 8]}], pad_id=0)
    trainer = quiet_cpu_trainer(tmp_path, max_steps=1, enable_checkpointing=False)
    ours = (ExactResume, TokenThroughput)
    assert not any(isinstance(c, ours) for c in trainer.callbacks)
    loader = torch.utils.data.DataLoader([batch], batch_size=None)
    with caplog.at_level(logging.INFO):
        trainer.fit(module, train_dataloaders=loader)
        trainer.fit(module, train_dataloaders=loader)  # max_steps reached: returns at once
    for kind in ours:
        assert sum(isinstance(c, kind) for c in trainer.callbacks) == 1, kind
    assert "override" not in caplog.text


def test_exact_resume_restores_the_generators_at_the_first_training_batch_only(caplog):
    from seq2seq.checkpoint.training import capture_rng_state

    callback = ExactResume()
    state = capture_rng_state()
    expected = float(torch.rand(()))
    trainer = SimpleNamespace(state=SimpleNamespace(fn="fit"))
    with caplog.at_level(logging.INFO):
        callback.on_load_checkpoint(trainer, None, {"seq2seq": {"rng": state}})
    assert "Random generators continue from the checkpoint" in caplog.text  # not the seed
    float(torch.rand(()))  # e.g. the data loaders' set-up
    callback.on_train_batch_start(None, None, {}, 0)
    assert float(torch.rand(())) == expected
    again = capture_rng_state()
    callback.on_train_batch_start(None, None, {}, 1)
    assert callback._step_rng["torch"].equal(again["torch"])  # the states at this batch's start
