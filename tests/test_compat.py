"""Contract tests of :mod:`seq2seq.compat`: each private attribute of Lightning, jsonargparse,
argparse, datasets or torch that seq2seq reaches still exists and means what seq2seq takes it
to mean. A failure here after an upgrade names the accessor to adapt."""

from __future__ import annotations

import argparse
import inspect
import typing
from datetime import timedelta

import lightning as L
import pytest
import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel

from seq2seq import compat


class _Recorder(L.Callback):
    """Records the compat accessors' answers at every training batch end and validation."""

    def __init__(self) -> None:
        self.accumulating: list[bool] = []
        self.written: list[bool] = []
        self.sigterm: list[bool | None] = []
        self.val_steps: list[tuple[int, int]] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.accumulating.append(compat.accumulating(trainer))
        self.written.append(compat.logs_written_now(trainer))
        self.sigterm.append(compat.sigterm_received(trainer))

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.val_steps.append((compat.logged_step(trainer), trainer.global_step))


def _fit(tmp_path, **trainer_kwargs) -> tuple[L.Trainer, _Recorder]:
    recorder = _Recorder()
    settings = dict(
        default_root_dir=tmp_path,
        max_steps=4,
        limit_val_batches=1,
        val_check_interval=4,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    settings.update(trainer_kwargs)
    trainer = L.Trainer(**settings)
    trainer.fit(BoringModel())
    return trainer, recorder


def test_loop_accessors_follow_lightnings_loop(tmp_path):
    """With accumulate_grad_batches 2 every other batch accumulates; the logged step during a
    validation in fit is one below global_step; values go to the loggers every
    log_every_n_steps optimizer steps; no SIGTERM is pending."""
    trainer, recorder = _fit(tmp_path, accumulate_grad_batches=2, max_steps=2, log_every_n_steps=2)
    assert recorder.accumulating == [True, False, True, False]
    assert recorder.sigterm == [False] * 4
    # should_update_logs counts optimizer steps: true on the batches of step 2 only
    assert recorder.written[-1] is True and recorder.written.count(True) < len(recorder.written)
    trainer, recorder = _fit(tmp_path)
    assert recorder.val_steps == [(3, 4)]
    assert compat.logged_step(trainer) == trainer.global_step == 4


def test_set_logged_step_and_saved_count(tmp_path):
    trainer, _ = _fit(tmp_path)
    compat.set_logged_step(trainer, 2)
    assert compat.logged_step(trainer) == 2
    state = trainer.fit_loop.state_dict()
    checkpoint = {"loops": {"fit_loop": state}}
    before = state["epoch_loop.state_dict"]["_batches_that_stepped"]
    assert before == 2  # the key Lightning saves the count under
    compat.add_to_saved_logged_step(checkpoint, 1)
    assert checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] == 3
    compat.add_to_saved_logged_step({}, 1)  # no loop state: nothing to change


def test_set_sigterm_received_stops_lightning_gracefully(tmp_path):
    """Setting the flag after a batch makes Lightning stop fit after that batch (the graceful
    SIGTERM stop LastCheckpoint relies on for Ctrl-C)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    class StopAtTwo(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 2:
                assert compat.set_sigterm_received(trainer, True)
                assert compat.sigterm_received(trainer) is True

    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=10,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StopAtTwo()],
    )
    with pytest.raises(SIGTERMException):
        trainer.fit(BoringModel())
    assert trainer.global_step == 2
    assert compat.set_sigterm_received(object(), True) is False
    assert compat.sigterm_received(object()) is None


def test_val_check_time_interval(tmp_path):
    trainer = L.Trainer(default_root_dir=tmp_path, val_check_interval=timedelta(minutes=5))
    assert compat.val_check_time_interval(trainer) is not None
    assert compat.val_check_time_interval(L.Trainer(default_root_dir=tmp_path)) is None


def test_lightning_cli_still_merges_checkpoint_hparams_through_parse_ckpt_path():
    """SkipCheckpointHparams turns off a method LightningCLI calls during __init__."""
    assert hasattr(LightningCLI, "_parse_ckpt_path")
    assert "self._parse_ckpt_path()" in inspect.getsource(LightningCLI.__init__)
    assert "hyper_parameters" in inspect.getsource(LightningCLI._parse_ckpt_path)
    assert compat.SkipCheckpointHparams()._parse_ckpt_path() is None


def test_subcommand_parsers_and_parser_internals(tmp_path):
    class NoRun(LightningCLI):
        def _run_subcommand(self, subcommand):  # parse only
            pass

    cli = NoRun(BoringModel, args=["fit", "--trainer.default_root_dir", str(tmp_path)])
    parsers = compat.subcommand_parsers(cli)
    assert set(parsers) == {"fit", "validate", "test", "predict"}
    fit = parsers["fit"]
    assert isinstance(fit, LightningArgumentParser)
    assert "ckpt_path" in [a.dest for a in compat.parser_actions(fit)]
    assert "--trainer.max_steps" in compat.option_strings(fit)
    assert any("Runs the full" in (g.title or "") for g in compat.action_groups(fit))
    assert compat.subcommand_names(cli.parser) == ["fit", "validate", "test", "predict"]
    assert compat.subcommand_names(fit) == []
    helps = {c.dest: c.help for c in compat.subcommand_choice_actions(cli.parser)}
    assert set(helps) == {"fit", "validate", "test", "predict"}
    assert compat.parser_logger(fit) is not None
    limit = next(a for a in compat.parser_actions(fit) if a.dest == "trainer.limit_val_batches")
    assert set(typing.get_args(compat.action_typehint(limit))) == {int, float, type(None)}
    compat.set_action_typehint(limit, int | float | None)
    assert fit.parse_args(["--trainer.limit_val_batches", "1"]).trainer.limit_val_batches == 1
    assert compat.action_typehint(argparse.Action(["-x"], "x")) is None


def test_error_parser_is_the_subcommands_parser():
    """jsonargparse attaches the subcommand's parser to the error of an unknown config key of
    that subcommand (the exception ``error`` receives, the cause of the one it raises)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    sub = ArgumentParser(exit_on_error=False)
    sub.add_argument("--n", type=int)
    parser.add_subcommands().add_subcommand("run", sub)
    with pytest.raises(argparse.ArgumentError) as caught:
        parser.parse_object({"run": {"zzz": 1}})
    assert compat.error_parser(caught.value.__cause__, parser) is sub
    assert compat.error_parser(None, parser) is parser


def test_print_config_skipped_then_printed_as_asked(capsys):
    """Within ``print_config_skipped`` jsonargparse parses a --print_config command line to its
    end without printing or exiting; ``print_config_if_requested`` then prints the (changed)
    config with the flag's options and exits, and does nothing for a command line without it."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    sub = ArgumentParser(exit_on_error=False)
    sub.add_argument("--config", action=ActionConfigFile)  # which adds --print_config
    sub.add_argument("--n", type=int, default=1)
    sub.add_argument("--m", type=int, default=2)
    parser.add_subcommands().add_subcommand("run", sub)
    with compat.print_config_skipped():
        config = parser.parse_args(["run", "--n", "5", "--print_config=skip_default"])
    assert capsys.readouterr().out == ""
    config.run.m = 7  # a change after the parse is what gets printed
    with pytest.raises(SystemExit):
        compat.print_config_if_requested(parser, config)
    assert capsys.readouterr().out == "n: 5\nm: 7\n"
    with compat.print_config_skipped():
        config = parser.parse_args(["run", "--n", "5"])
    compat.print_config_if_requested(parser, config)
    assert capsys.readouterr().out == ""


def test_dataset_fingerprint_changes_with_content():
    import datasets

    a = datasets.Dataset.from_dict({"x": [1, 2]})
    b = datasets.Dataset.from_dict({"x": [1, 3]})
    assert isinstance(compat.dataset_fingerprint(a), str)
    assert compat.dataset_fingerprint(a) != compat.dataset_fingerprint(b)


def test_foreach_ops_match_the_plain_ones():
    tensors = [torch.randn(3, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)]
    expected = [t * 0.5 for t in tensors]
    norms = compat.foreach_norm(tensors)
    assert all(torch.allclose(n, t.norm()) for n, t in zip(norms, tensors, strict=True))
    compat.foreach_mul_(tensors, 0.5)
    assert all(torch.equal(t, e) for t, e in zip(tensors, expected, strict=True))
