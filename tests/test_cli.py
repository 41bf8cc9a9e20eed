"""End-to-end tests of the ``seq2seq`` command line on real Multi30k lines."""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import typing
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from conftest import refuse_new_files, run_main

from seq2seq.checkpoint import (
    CheckpointError,
    UnsafeCheckpointError,
    average_checkpoints,
    load_checkpoint,
    resolve_ckpt_path,
)
from seq2seq.cli import cli_main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MAIN_CONFIGS = sorted(CONFIGS.glob("*.yaml"))
PIECES = sorted((CONFIGS / "trainer").glob("*.yaml"))


@pytest.mark.parametrize("config", MAIN_CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["vocab_size"] > 0 and printed["model"]["d_model"] > 0


@pytest.mark.parametrize("piece", PIECES, ids=lambda p: p.name)
def test_every_trainer_piece_parses(piece, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(
            [
                "fit",
                "--config",
                str(CONFIGS / "tiny.yaml"),
                "--trainer",
                str(piece),
                "--print_config",
            ]
        )
    assert exit_info.value.code == 0


def test_a_config_naming_the_old_default_optimizer_paths_parses(tmp_path, capsys):
    """Configs printed before the defaults moved to seq2seq.optim name them in seq2seq.module."""
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["model"]["optimizer"] = "seq2seq.module._default_optimizer"
    config["model"]["lr_scheduler"] = "seq2seq.module._default_scheduler"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)["model"]
    assert printed["optimizer"] == "seq2seq.optim.default_optimizer"
    assert printed["lr_scheduler"] == "seq2seq.optim.default_scheduler"


def test_unknown_config_key_is_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(CONFIGS / "tiny.yaml"), "--model.d_modle", "64"])
    assert exit_info.value.code != 0
    assert "d_modle" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--trainer.max_ep", "--data.vocab"])
def test_abbreviated_options_are_refused(option, capsys):
    """An unambiguous prefix of an option is a typo to report, not the option itself."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(CONFIGS / "tiny.yaml"), option, "7", "--print_config"])
    assert exit_info.value.code == 2
    assert f"unrecognized option {option}" in capsys.readouterr().err


def _exit_of_main(monkeypatch, capsys, *argv):
    """Runs the console script's ``main`` on ``argv``; its exit status and captured output."""
    from seq2seq.cli import main

    monkeypatch.setattr("sys.argv", ["seq2seq", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr()


def test_mistyped_option_is_reported_briefly_with_the_closest_option(monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    tiny = str(CONFIGS / "tiny.yaml")
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", tiny, "--model.d_modle", "64")
    assert code == 2
    assert out.err.splitlines() == [
        "seq2seq: error: unrecognized option --model.d_modle (did you mean --model.d_model?)",
        "For the full list of options run: seq2seq fit --help",
    ]
    code, out = _exit_of_main(monkeypatch, capsys, "test", "--config", tiny, "--max_epochs", "3")
    assert code == 2
    err = out.err.splitlines()
    assert len(err) <= 3, err
    assert "--max_epochs (did you mean --trainer.max_epochs?)" in err[0]
    assert err[-1] == "For the full list of options run: seq2seq test --help"


@pytest.mark.parametrize(
    ("command", "given", "meant"),
    [
        ("fit", "--lr", "--model.optimizer.init_args.lr"),
        ("fit", "--warmup-updates", "--model.lr_scheduler.init_args.warmup_steps"),
        ("fit", "--update-freq", "--trainer.accumulate_grad_batches"),
        ("fit", "--clip-norm", "--trainer.gradient_clip_val"),
        ("fit", "--share-all-embeddings", "--model.tie_embeddings all"),
        ("fit", "--max-update", "--trainer.max_steps"),
        ("fit", "--save-dir", "--checkpoint_dir"),
        ("fit", "--seed", "--seed_everything"),
        ("test", "--beam", "--model.decoding.beam_size"),
        ("translate", "--lenpen", "--length_penalty"),
        ("translate", "--num_beams", "--beam_size"),
        ("translate", "--max_new_tokens", "--max_len_a 0 --max_len_b N"),
        (
            "test",
            "--generation_max_length",
            "--model.decoding.max_len_a 0 --model.decoding.max_len_b N",
        ),
        ("translate", "--num_return_sequences", "--n_best"),
        ("predict", "--num_return_sequences", "--prediction_writer.n_best"),
        ("fit", "--per_device_train_batch_size", "--data.max_tokens"),
        ("fit", "--early_stopping_patience", "--patience"),
        ("fit", "--eval_steps", "--trainer.val_check_interval"),
    ],
)
def test_options_of_fairseq_and_hugging_face_name_ours(monkeypatch, capsys, command, given, meant):
    """A fairseq or Seq2SeqTrainer option is answered with the one that does its work here,
    where no spelling is close (--lr, --seed: not --data.seed, which seeds the batches alone)."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    rest = (
        ["--config", str(CONFIGS / "tiny.yaml")] if command != "translate" else ["--ckpt_path", "x"]
    )
    code, out = _exit_of_main(monkeypatch, capsys, command, *rest, given, "1")
    assert code == 2
    assert out.err.splitlines()[0].endswith(f"unrecognized option {given} (did you mean {meant}?)")


def test_unknown_key_in_a_config_file_is_reported_briefly(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    config = tmp_path / "typo.yaml"
    config.write_text("modle:\n  d_model: 64\n", encoding="utf-8")
    code, out = _exit_of_main(
        monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"), "--config", str(config)
    )
    assert code == 2
    err = out.err.splitlines()
    assert len(err) <= 3, err
    assert err[0] == (
        f"seq2seq: error: unknown config key 'modle.d_model' in {config} "
        "(did you mean model.d_model?)"
    )
    # ... a class's argument under a misspelt group: no parser key, the group put right
    config.write_text(
        "modle:\n  optimizer:\n    class_path: torch.optim.AdamW\n    init_args:\n      lr: 0.1\n",
        encoding="utf-8",
    )
    code, out = _exit_of_main(
        monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"), "--config", str(config)
    )
    assert code == 2 and out.err.splitlines()[0] == (
        f"seq2seq: error: unknown config key 'modle.optimizer.init_args.lr' in {config} "
        "(did you mean model.optimizer.init_args.lr?)"
    )
    # ... a key of a group, also with --print_config (whose error comes from the root parser)
    config.write_text("trainer:\n  max_stepz: 3\n", encoding="utf-8")
    code, out = _exit_of_main(
        monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"),
        f"--config={config}", "--print_config",
    )  # fmt: skip
    assert code == 2
    assert out.err.splitlines()[0] == (
        f"seq2seq: error: unknown config key 'trainer.max_stepz' in {config} "
        "(did you mean trainer.max_steps or trainer.max_time?)"
    )


def test_every_unknown_key_of_a_config_file_is_named_in_one_run(monkeypatch, capsys, tmp_path):
    """jsonargparse stops at the first unknown key: the file's others are named with it, and
    a whole config (a shipped one, or one --print_config writes) adds none of its own."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    tiny = str(CONFIGS / "tiny.yaml")
    config = tmp_path / "typos.yaml"
    config.write_text(
        "modle:\n  n_heads: 2\nmodel:\n  d_modle: 64\n  decoding:\n    beam_szie: 3\n"
        "data:\n  max_token: 500\n  max_positions: 64\ntrainer:\n  max_steps: 3\n"
        "  callbacks:\n    - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
        "      init_args:\n        monitor: val/bleu\n",
        encoding="utf-8",
    )
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", tiny, "--config", str(config))
    assert code == 2
    assert out.err.splitlines()[:-1] == [
        f"seq2seq: error: unknown config key '{key}' in {config} (did you mean {meant}?)"
        for key, meant in (
            ("modle.n_heads", "model.n_heads"),
            ("model.d_modle", "model.d_model"),
            ("model.decoding.beam_szie", "model.decoding.beam_size"),
            ("data.max_token", "data.max_tokens"),
        )
    ]
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", tiny, "--print_config")
    assert code == 0
    printed = yaml.safe_load(out.out)
    wholes = {"printed": printed}
    for name in ("multi30k_de_en", "multi30k_multi", "finetune_opus_mt"):
        wholes[name] = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text(encoding="utf-8"))
    for name, whole in wholes.items():
        whole.setdefault("data", {})["max_token"] = 500
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(whole), encoding="utf-8")
        code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", str(path))
        assert code == 2
        assert out.err.splitlines()[:-1] == [
            f"seq2seq: error: unknown config key 'data.max_token' in {path} (did you mean "
            "data.max_tokens?)"
        ], name


def test_an_argument_a_class_does_not_take_gets_the_closest_it_takes(monkeypatch, capsys, tmp_path):
    """A misspelt init_args key of an optimizer, a schedule or a callback in a config file:
    one line naming the class, the closest argument it takes, and the file."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    tiny = str(CONFIGS / "tiny.yaml")
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", tiny,
                              "--model.lr_scheduler.init_args.warmup", "10")  # fmt: skip
    assert code == 2
    assert out.err.splitlines()[0] == (
        "seq2seq: error: --model.lr_scheduler.init_args.warmup: seq2seq.optim.InverseSqrtLR "
        "takes no argument 'warmup' (did you mean warmup_steps?); it takes warmup_steps"
    )
    config = tmp_path / "callbacks.yaml"
    config.write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
        "      init_args:\n        monitor: val/bleu\n        patiense: 3\n",
        encoding="utf-8",
    )
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", tiny, "--config", str(config))
    assert code == 2
    assert out.err.splitlines()[0].startswith(
        f"seq2seq: error: trainer.callbacks in {config}: lightning.pytorch.callbacks."
        "EarlyStopping takes no argument 'patiense' (did you mean patience?); it takes monitor, "
    )
    # a flag of a callback's argument sets the list's last class: the flag is named, not a file
    main = str(CONFIGS / "multi30k_de_en.yaml")
    for flag in ("--trainer.callbacks.patience", "--trainer.callbacks.init_args.patience"):
        code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", main, flag, "2")
        assert code == 2
        assert out.err.splitlines()[0] == (
            "seq2seq: error: --trainer.callbacks.patience: seq2seq.callbacks.BestScoreHparams "
            "takes no argument 'patience'; it takes monitor, mode, name; a "
            "--trainer.callbacks.<argument> flag sets the last class of the list "
            "(EarlyStopping's patience: --patience N)"
        )
    # a callback added without an argument it needs: what to give, in one line
    code, out = _exit_of_main(
        monkeypatch, capsys, "fit", "--config", tiny, "--trainer.callbacks+=EarlyStopping"
    )
    assert code == 2
    assert out.err.splitlines()[0] == (
        "seq2seq: error: --trainer.callbacks: lightning.pytorch.callbacks.EarlyStopping needs "
        "monitor: give --trainer.callbacks.monitor val/loss after it (a "
        "--trainer.callbacks.<argument> flag sets the last class of the list), or its "
        "init_args in the config file"
    )


def test_a_decoding_setting_outside_model_decoding_points_there(monkeypatch, capsys, tmp_path):
    """The decoding settings are keys of model.decoding: the flat spelling of earlier configs
    (--model.beam_size, model: beam_size:) is refused in one line that names the new one."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    tiny = str(CONFIGS / "tiny.yaml")
    code, out = _exit_of_main(
        monkeypatch, capsys, "fit", "--config", tiny, "--model.beam_size", "3"
    )
    assert code == 2
    assert out.err.splitlines() == [
        "seq2seq: error: unrecognized option --model.beam_size (did you mean "
        "--model.decoding.beam_size?)",
        "For the full list of options run: seq2seq fit --help",
    ]
    config = tmp_path / "flat.yaml"
    config.write_text("model:\n  max_len_b: 3\n", encoding="utf-8")
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", tiny, "--config", str(config))
    assert code == 2
    assert out.err.splitlines()[0] == (
        f"seq2seq: error: unknown config key 'model.max_len_b' in {config} (did you mean "
        "model.decoding.max_len_b?)"
    )


def test_invalid_value_names_the_option_and_the_value(monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    tiny = str(CONFIGS / "tiny.yaml")
    argv = ["validate", "--config", tiny, "--trainer.max_epochs", "abc"]
    code, out = _exit_of_main(monkeypatch, capsys, *argv)
    assert code == 2
    err = out.err.splitlines()
    assert len(err) <= 3 and "usage:" not in out.err, err
    assert err[0] == (
        "seq2seq: error: invalid value 'abc' for --trainer.max_epochs (expected int or null)"
    )
    assert "seq2seq validate --help" in err[-1]
    # a list option given one bare value: the message writes the list
    code, out = _exit_of_main(
        monkeypatch, capsys, "validate", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.test_splits", "test_2016_flickr",
    )  # fmt: skip
    assert code == 2
    assert out.err.splitlines()[0] == (
        "seq2seq: error: invalid value 'test_2016_flickr' for --data.test_splits (expected "
        "list or null; a list of one: --data.test_splits '[test_2016_flickr]')"
    )
    code, out = _exit_of_main(
        monkeypatch, capsys, "validate", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.test_splits", "test_2016_flickr,test_2017_flickr",
    )  # fmt: skip
    assert out.err.splitlines()[0].endswith(
        "as a list: --data.test_splits '[test_2016_flickr,test_2017_flickr]')"
    )
    # Lightning's top-level --optimizer would replace configure_optimizers: not offered
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", tiny, "--optimizer", "x")
    assert code == 2 and out.err.splitlines()[0] == (
        "seq2seq: error: unrecognized option --optimizer (did you mean --model.optimizer?)"
    )
    # an argument of the class given (the plateau schedule's mode, the optimizer's lr)
    plateau = ["--model.lr_scheduler", "torch.optim.lr_scheduler.ReduceLROnPlateau"]
    for extra, line in (
        ([*plateau, "--model.lr_scheduler.init_args.mode", "foo"],
         "'foo' for --model.lr_scheduler.init_args.mode (expected one of 'min', 'max')"),
        (["--model.optimizer.init_args.lr", "abc"],
         "'abc' for --model.optimizer.init_args.lr (expected float)"),
    ):  # fmt: skip
        code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", tiny, *extra)
        assert code == 2 and out.err.splitlines()[0] == f"seq2seq: error: invalid value {line}"
    # a class given without an argument it requires (Lightning's plateau class, its monitor)
    lightning_plateau = "lightning.pytorch.cli.ReduceLROnPlateau"
    code, out = _exit_of_main(
        monkeypatch, capsys, "fit", "--config", tiny, "--model.lr_scheduler", lightning_plateau
    )
    assert code == 2 and out.err.splitlines()[0] == (
        f"seq2seq: error: --model.lr_scheduler {lightning_plateau} needs "
        "--model.lr_scheduler.init_args.monitor"
    )
    # SEQ2SEQ_TRACEBACK=1: jsonargparse's own report, usage and full message
    monkeypatch.setenv("SEQ2SEQ_TRACEBACK", "1")
    code, out = _exit_of_main(monkeypatch, capsys, *argv)
    assert code == 2
    assert "usage:" in out.err and "Given value: abc" in out.err


def test_help_still_lists_every_option(monkeypatch, capsys):
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--help")
    assert code == 0
    assert len(out.out.splitlines()) > 50
    assert "--model.d_model" in out.out and "--trainer.max_epochs" in out.out
    # Docstrings shown as plain text: no reStructuredText markup.
    assert "``" not in out.out and ":func:" not in out.out and ":class:" not in out.out
    assert "seq2seq.data.corpus.locate_split" in out.out


def test_no_command_is_an_error_naming_every_command(monkeypatch, capsys):
    from seq2seq.cli import main

    monkeypatch.setattr("sys.argv", ["seq2seq"])
    assert main() == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("seq2seq: error: name a command: fit, validate, test or predict")
    for command in ("translate", "average", "export", "import"):
        assert f"\n  {command} " in captured.err, captured.err
    # options without a command: the same error, saying where they go
    monkeypatch.setattr("sys.argv", ["seq2seq", "--print_config"])
    assert main() == 2
    assert capsys.readouterr().err.startswith(
        "seq2seq: error: name a command: fit, validate, test or predict, or one of the further "
        "commands below; give --print_config after it"
    )


def test_top_level_and_translate_help_name_every_command_and_default(monkeypatch, capsys):
    from seq2seq.cli import main

    monkeypatch.setattr("sys.argv", ["seq2seq", "--help"])
    assert main() == 0
    out = capsys.readouterr().out
    usage = out[: out.index("\n\n")]
    for command in ("fit", "validate", "test", "predict", "translate", "average"):
        assert command in usage, usage
    assert "Lightning Trainer command line tool" not in out
    assert "score a checkpoint on the test sets" in " ".join(out.split())
    # written without LightningCLI: its text names the commands LightningCLI runs
    from seq2seq.cli import Seq2SeqCLI
    from seq2seq.cli.messages import SUBCOMMAND_HELP

    assert set(SUBCOMMAND_HELP) == set(Seq2SeqCLI.subcommands())
    assert "--config FILE" in out and "--print_config" in out
    code, out = _exit_of_main(monkeypatch, capsys, "translate", "--help")
    assert code == 0 and "``" not in out.out
    text = " ".join(out.out.split())
    assert "(default: the checkpoint's model.decoding.beam_size)" in text
    assert "(default: 4096)" in text
    # A command's own help: its usage line alone, seq2seq's summary, no sentence cut short.
    code, out = _exit_of_main(monkeypatch, capsys, "test", "--help")
    assert code == 0 and out.out.startswith("usage: seq2seq [options] test ")
    assert "{translate,average}" not in out.out and "never run on your" not in out.out
    assert "Score a checkpoint on the test sets" in out.out
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--help")
    text = " ".join(out.out.split())
    assert '"hpc"' not in text and "Resume the run of this checkpoint" in text


def test_fit_fast_dev_run(in_tmp, multi30k_dir, tiny_cache, capsys):
    cli = cli_main(
        [
            "fit",
            "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--data.cache_dir", str(tiny_cache),
            "--trainer.fast_dev_run", "true",
            "--ckpt_path", "last",  # nothing to resume: says so and starts from scratch
        ]
    )  # fmt: skip
    assert cli.trainer.global_step == 1
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    err = capsys.readouterr().err
    assert (
        "seq2seq: warning: --ckpt_path last: no last.ckpt in checkpoints/tiny (a new folder); "
        "training from scratch"
    ) in err
    assert not (in_tmp / "checkpoints").exists()  # a smoke run writes no checkpoint, nor its folder
    # a mistyped --checkpoint_dir: the folder spelt alike beside it is named
    (in_tmp / "checkpoints" / "run_one").mkdir(parents=True)
    cli_main(["fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir),
              "--data.cache_dir", str(tiny_cache), "--trainer.fast_dev_run", "true",
              "--ckpt_path", "last", "--checkpoint_dir", "checkpoints/run_oen"])  # fmt: skip
    assert (
        "no last.ckpt in checkpoints/run_oen (a new folder; did you mean checkpoints/run_one?); "
        "training from scratch"
    ) in capsys.readouterr().err


def test_tiny_run_outputs(tiny_run):
    assert (tiny_run / "checkpoints/tiny/last.ckpt").is_file()
    hyps = sorted((tiny_run / "lightning_logs/tiny/version_0/hypotheses").glob("val.step*.txt"))
    assert hyps, "validation hypotheses were not written"
    # last.ckpt holds the state after the final validation (max_steps 20, validations every 10
    # steps), whether or not that validation's checkpoint was kept (LastCheckpoint).
    last = torch.load(
        tiny_run / "checkpoints/tiny/last.ckpt", map_location="cpu", weights_only=False
    )
    assert last["global_step"] == 20


def _test_best_of_tiny_run(tiny_run, multi30k_dir, monkeypatch, *extra: str):
    """``seq2seq test --ckpt_path best`` of the shared tiny run, in its folder."""
    monkeypatch.chdir(tiny_run)
    config = ["--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir)]
    return cli_main(["test", *config, "--ckpt_path", "best", *extra])


def test_test_bleu_is_the_first_listed_sets(tiny_run, multi30k_dir, monkeypatch, capsys):
    """test/bleu is the score of the first set of data.test_splits, and the sets are reported
    in that order, not alphabetically, ending with one table of every set's scores."""
    cli = _test_best_of_tiny_run(
        tiny_run, multi30k_dir, monkeypatch,
        "--data.test_splits", "[val, test_2016_flickr]", "--model.decoding.beam_size", "1",
    )  # fmt: skip
    metrics = cli.trainer.callback_metrics
    assert float(metrics["test/bleu"]) == float(metrics["test/val/bleu"])
    assert float(metrics["test/val/bleu"]) != float(metrics["test/test_2016_flickr/bleu"])
    out = capsys.readouterr().out
    assert 0 <= out.index("test/val: BLEU") < out.index("test/test_2016_flickr: BLEU"), out
    # One row per set instead of Lightning's table (every set's metrics under every column).
    assert "DataLoader 1" not in out
    table = out[out.index("set  ") :].splitlines()[:4]
    assert table[0].split() == ["set", "BLEU", "chrF2", "TER"], table
    assert [row.split()[0] for row in table[1:3]] == ["val", "test_2016_flickr"], table
    assert float(table[1].split()[1]) == pytest.approx(float(metrics["test/val/bleu"]), abs=0.005)
    assert table[3] == "(test/bleu, test/chrf, test/ter: val's)"


def test_chrfpp_chosen_in_model_metrics_is_logged_printed_and_tabled(
    tiny_run, multi30k_dir, monkeypatch, capsys
):
    """``--model.metrics '[bleu, chrfpp]'``: ``test/<set>/chrfpp`` and ``test/chrfpp`` are
    logged, its line is printed with its sacreBLEU signature as BLEU's is, and the table has a
    ``chrF2++`` column."""
    cli = _test_best_of_tiny_run(
        tiny_run, multi30k_dir, monkeypatch, "--model.metrics", "[bleu, chrfpp]",
        "--data.test_splits", "[val, test_2016_flickr]", "--model.decoding.beam_size", "1",
    )  # fmt: skip
    metrics = cli.trainer.callback_metrics
    assert float(metrics["test/chrfpp"]) == float(metrics["test/val/chrfpp"])
    assert "test/chrf" not in metrics and "test/ter" not in metrics
    out = capsys.readouterr().out
    line = out[out.index("test/val: chrF2++ = ") :].splitlines()
    assert line[1].startswith("  signature: nrefs:1|case:mixed|eff:yes|nc:6|nw:2|"), line
    table = out[out.index("set  ") :].splitlines()[:4]
    assert table[0].split() == ["set", "BLEU", "chrF2++"], table
    assert table[3] == "(test/bleu, test/chrfpp: val's)"


def test_test_from_best_checkpoint_matches_sacrebleu(tiny_run, multi30k_dir, monkeypatch):
    cli = _test_best_of_tiny_run(
        tiny_run, multi30k_dir, monkeypatch, "--trainer.limit_test_batches", "1.0"
    )
    logged = float(cli.trainer.callback_metrics["test/test_2016_flickr/bleu"])
    assert float(cli.trainer.callback_metrics["test/bleu"]) == logged
    log_dir = Path(cli.trainer.logger.log_dir)
    (hyp_file,) = (log_dir / "hypotheses").glob("test.test_2016_flickr.step*.txt")
    # Named after the evaluated checkpoint's step.
    step = load_checkpoint(cli.trainer.ckpt_path)["global_step"]
    assert step > 0 and hyp_file.name == f"test.test_2016_flickr.step{step}.txt"
    refs = gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8").read()
    ref_file = tiny_run / "refs.en"
    ref_file.write_text(refs, encoding="utf-8")
    assert len(hyp_file.read_text(encoding="utf-8").splitlines()) == len(refs.splitlines())
    printed = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(ref_file), "-i", str(hyp_file), "-b"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert f"{logged:.1f}" == printed or round(logged, 1) == float(printed)


def test_validate_from_last_checkpoint(tiny_run, multi30k_dir, monkeypatch):
    monkeypatch.chdir(tiny_run)
    cli = cli_main(
        [
            "validate",
            "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--ckpt_path", "last",
        ]
    )  # fmt: skip
    assert "val/bleu" in cli.trainer.callback_metrics


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_evaluation_has_no_progress_bar_when_stdout_is_not_a_terminal(
    tiny_run, multi30k_dir, tiny_cache, monkeypatch, capsys, tmp_path
):
    """validate/test/predict into a log or pipe: score lines without progress-bar redraws
    (Lightning's bar is tqdm when rich is not installed; it writes carriage returns); fit:
    a plain line of progress every log_every_n_steps steps instead."""
    from lightning.pytorch.callbacks import TQDMProgressBar
    from lightning.pytorch.trainer.connectors import callback_connector

    from seq2seq.callbacks import TextProgress
    from seq2seq.cli import Seq2SeqCLI

    monkeypatch.setattr(callback_connector, "_RICH_AVAILABLE", False)
    monkeypatch.chdir(tiny_run)
    common = ["--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir)]
    argv = ["validate", *common, "--ckpt_path", "last", "--trainer.enable_progress_bar", "null"]
    cli = cli_main(argv)
    assert cli.trainer.progress_bar_callback is None
    out = capsys.readouterr().out
    assert "val: BLEU = " in out and "\r" not in out
    # fit prints plain progress lines instead (TextProgress, every log_every_n_steps steps).
    monkeypatch.chdir(tmp_path)  # a run of its own, beside the shared tiny_run
    fit_argv = ["fit", *common, "--data.cache_dir", str(tiny_cache)]
    fit_argv += ["--trainer.enable_progress_bar", "null"]
    fit = cli_main([*fit_argv, "--trainer.max_steps", "10", "--trainer.log_every_n_steps", "5"])
    assert fit.trainer.progress_bar_callback is None
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert [line.split(" | ")[:2] for line in lines] == [
        ["epoch 0", "step 5"],
        ["epoch 0", "step 10"],
    ]
    assert all(" | loss " in line and " | lr " in line for line in lines)
    # The bar is kept on a terminal and when asked for (only instantiated here; fit resumes
    # the run above, as a new run is refused in a folder that holds checkpoints).
    monkeypatch.setattr(Seq2SeqCLI, "_run_subcommand", lambda self, subcommand: None)
    fit_argv = ["fit", *common, "--ckpt_path", "last", "--trainer.enable_progress_bar", "null"]
    assert cli_main([*argv[:-1], "true"]).trainer.progress_bar_callback is not None
    assert cli_main([*fit_argv[:-1], "true"]).trainer.progress_bar_callback is not None
    monkeypatch.setattr("sys.stdout", _Terminal())
    assert cli_main(argv).trainer.progress_bar_callback is not None
    fit = cli_main(fit_argv)
    assert isinstance(fit.trainer.progress_bar_callback, TQDMProgressBar)
    assert not [c for c in fit.trainer.callbacks if isinstance(c, TextProgress)]


def test_fit_prints_progress_lines_into_a_log_also_with_the_bar_turned_off(
    in_tmp, multi30k_dir, monkeypatch
):
    """configs/tiny.yaml sets trainer.enable_progress_bar: false, which turns off the bar
    only: fit into a log or pipe still prints a line every log_every_n_steps (5) steps; on a
    terminal it prints neither (only instantiated here)."""
    from seq2seq.callbacks import TextProgress
    from seq2seq.cli import Seq2SeqCLI

    monkeypatch.setattr(Seq2SeqCLI, "_run_subcommand", lambda self, subcommand: None)
    argv = ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir)]
    for terminal, every in ((False, [5]), (True, [])):
        if terminal:
            monkeypatch.setattr("sys.stdout", _Terminal())
        trainer = cli_main(argv).trainer
        assert trainer.progress_bar_callback is None
        lines = [c.every_n_steps for c in trainer.callbacks if isinstance(c, TextProgress)]
        assert lines == every, terminal


def _predict_argv(source: Path, ckpt: Path, output: Path) -> list[str]:
    """``predict`` with the tiny config: translate ``source`` with ``ckpt`` into ``output``."""
    return [
        "predict",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.predict_file", str(source),
        "--ckpt_path", str(ckpt),
        "--prediction_writer.output_path", str(output),
    ]  # fmt: skip


def test_predict_stopped_by_ctrl_c_says_that_nothing_is_written(
    tiny_run, monkeypatch, tmp_path, capsys
):
    from seq2seq.module import TranslationModule

    def interrupted(self, batch, batch_idx, dataloader_idx=0):
        raise KeyboardInterrupt

    monkeypatch.chdir(tiny_run)
    monkeypatch.setattr(TranslationModule, "predict_step", interrupted)
    source, output = tmp_path / "input.de", tmp_path / "output.en"
    source.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    argv = _predict_argv(source, tiny_run / "checkpoints/tiny/last.ckpt", output)
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code != 0 and not output.exists()
    assert (
        f"seq2seq: predict stopped: nothing is written to {output}, which is written whole "
        "once every line is translated"
    ) in err, err


def test_predict_of_a_missing_file_names_the_setting_alone(tiny_run, monkeypatch, tmp_path, capsys):
    """The file is checked before the checkpoint is read, and nothing had started, so no
    "predict stopped" line comes before the error."""
    monkeypatch.chdir(tiny_run)
    missing, output = tmp_path / "nope.de", tmp_path / "output.en"
    argv = _predict_argv(missing, tiny_run / "checkpoints/tiny/last.ckpt", output)
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code != 0 and not output.exists()
    assert not [line for line in err if "predict stopped" in line], err
    assert f"data.predict_file {missing} does not exist; fix the path." in err[-1], err


def test_predict_writes_one_line_per_input(tiny_run, monkeypatch, tmp_path):
    monkeypatch.chdir(tiny_run)
    source = tmp_path / "input.de"
    lines = ["Ein Mann fährt Fahrrad.", "", "Hund " * 300, "Zwei Frauen\u2028lachen."]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "output.en"
    logs = sorted((tiny_run / "lightning_logs").rglob("*"))
    cli_main(_predict_argv(source, tiny_run / "checkpoints/tiny/last.ckpt", output))
    assert sorted((tiny_run / "lightning_logs").rglob("*")) == logs  # no log folder of its own
    assert not (tiny_run / "config.yaml").exists()
    written = output.read_text(encoding="utf-8").split("\n")
    assert written[-1] == ""
    assert len(written) - 1 == len(lines)
    assert written[1] == "" and written[0] != ""  # an empty line is translated as an empty line
    # n-best rows: n_best of them for every line, the empty one included (empty text, score 0).
    argv = _predict_argv(source, tiny_run / "checkpoints/tiny/last.ckpt", output)
    cli_main([*argv, "--prediction_writer.n_best", "2", "--model.decoding.beam_size", "2"])
    rows = [row.split("\t") for row in output.read_text(encoding="utf-8").splitlines()]
    assert [row[0] for row in rows] == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert rows[2] == rows[3] == ["1", "0.0000", ""]


def test_predict_refuses_to_write_over_its_input_or_checkpoint(
    tiny_run, monkeypatch, tmp_path, capsys
):
    """--prediction_writer.output_path equal to the predict file or the checkpoint is refused
    (exit 1, one line) before anything is written; both files stay as they were."""
    monkeypatch.chdir(tiny_run)
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    source = tmp_path / "input.de"
    source.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    ckpt = tmp_path / "copy.ckpt"
    ckpt.write_bytes((tiny_run / "checkpoints/tiny/last.ckpt").read_bytes())
    for output, name in ((source, "--data.predict_file"), (ckpt, "--ckpt_path")):
        before = output.read_bytes()
        code, _, err = run_main(monkeypatch, capsys, *_predict_argv(source, ckpt, output))
        assert code == 1
        assert f"is the {name} file; give another file name" in err[-1], err
        assert output.read_bytes() == before


def test_predict_on_an_empty_file_writes_an_empty_output(tiny_run, monkeypatch, tmp_path, capsys):
    """As translate on empty input: no lines in, no lines out (and a notice), not an error."""
    monkeypatch.chdir(tiny_run)
    empty, gzipped = tmp_path / "empty.de", tmp_path / "empty.de.gz"
    empty.write_bytes(b"")
    gzipped.write_bytes(gzip.compress(b"\xef\xbb\xbf"))  # a byte-order mark only: no line
    for source in (empty, gzipped):
        output = tmp_path / "out" / f"{source.name}.en"
        cli_main(_predict_argv(source, tiny_run / "checkpoints/tiny/last.ckpt", output))
        assert output.read_bytes() == b""
        err = capsys.readouterr().err.splitlines()
        assert f"seq2seq: the predict file {source} has no lines; wrote an empty {output}" in err


def test_translate_from_checkpoint_alone(tiny_run, tmp_path):
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes((tiny_run / "checkpoints/tiny/last.ckpt").read_bytes())
    lines = ["Ein Mann fährt Fahrrad.", "", "Eine Frau singt."]
    result = subprocess.run(
        [sys.executable, "-m", "seq2seq.cli", "translate", "--ckpt_path", str(ckpt),
         "--beam_size", "2"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, cwd=tmp_path, check=True,
    )  # fmt: skip
    out = result.stdout.split("\n")
    assert len(out) - 1 == len(lines)
    assert out[1] == "" and out[0] != "" and out[2] != ""


def _translate_main(monkeypatch, capsys, stdin: bytes, *argv: str):
    """``seq2seq translate ARGV`` in this process with ``stdin``: (exit status, stdout, stderr)."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    return run_main(monkeypatch, capsys, "translate", *argv, stdin=stdin)


def test_translate_refuses_bad_input_and_settings_before_decoding(
    tiny_run, tmp_path, monkeypatch, capsys
):
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    source = tmp_path / "in.de"
    source.write_text("Ein Hund.\n", encoding="utf-8")
    # Invalid UTF-8 on stdin: one line naming <stdin> and the line, as for --input files.
    code, out, err = _translate_main(
        monkeypatch, capsys, "Ein Hund.\nGrüße\n".encode("latin-1"), "--ckpt_path", ckpt
    )
    assert code == 1 and len(out.splitlines()) == 1  # of the line before it
    assert len(err) == 1 and "<stdin>, line 2: invalid UTF-8" in err[0], err
    assert "The translation of the first line is written to standard output." in err[0]
    code, out, err = _translate_main(monkeypatch, capsys, "Grüße\n".encode("latin-1"),
                                     "--ckpt_path", ckpt)  # fmt: skip
    assert code == 1 and out == "" and "No translation is written." in err[0], err
    # ... met after lines were read: those before it are translated and written, whatever
    # the buffer; the message says how many lines they hold
    bad = "Ein Hund.\nEine Katze.\nGrüße\nJa.\n".encode("latin-1")
    for buffer in ("1", "10000"):
        code, out, err = _translate_main(monkeypatch, capsys, bad, "--ckpt_path", ckpt,
                                         "--buffer_size", buffer)  # fmt: skip
        assert code == 1 and len(out.splitlines()) == 2
        assert "<stdin>, line 3: invalid UTF-8" in err[0] and (
            "The translations of the first 2 lines are written to standard output." in err[0]
        ), err
    # An --input file is read through first: its bad line stops translate before any part.
    source.write_bytes(bad)
    for output in ("-", str(tmp_path / "o.en")):
        code, out, err = _translate_main(monkeypatch, capsys, b"", "--ckpt_path", ckpt,
                                         "--input", str(source), "--output", output,
                                         "--buffer_size", "1")  # fmt: skip
        assert code == 1 and out == "" and len(err) == 1, err
        assert "in.de, line 3: invalid UTF-8" in err[0] and "Nothing is translated." in err[0]
    assert not (tmp_path / "o.en").exists()
    source.write_text("Ein Hund.\n", encoding="utf-8")
    # Lines with nothing the model knows (spaces, a zero-width space, a word joiner, which
    # SentencePiece turns into a word boundary and <unk>) give empty lines; the others a
    # translation.
    lines = ["Ein Hund läuft.", "   ", "\u200b", "\u2060", "Eine Frau singt."]
    code, out, err = _translate_main(
        monkeypatch, capsys, "\n".join(lines).encode(), "--ckpt_path", ckpt, "--beam_size", "2"
    )
    assert code == 0, err
    assert [bool(line) for line in out.split("\n")] == [True, False, False, False, True, False]
    refusals = [
        (["--n_best", "8"], "--n_best 8 exceeds the beam size"),  # the checkpoint's beam
        (["--device", "gpu"], "--device gpu: not a device"),
        (["--output", str(source / "out.en")], "is not a folder"),
        (["--output", str(tmp_path)], "is a folder"),
        (["--input", str(source), "--output", str(source)], "is the input file"),
        (["--input", str(source), "--output", ckpt], "is the checkpoint"),
        (["--length_penalty", "nan"], "--length_penalty must be a finite number"),
    ]
    if not torch.cuda.is_available():
        refusals.append((["--device", "cuda"], "no CUDA device is available"))
    for extra, expected in refusals:
        code, out, err = _translate_main(
            monkeypatch, capsys, b"Ein Hund.\n", "--ckpt_path", ckpt, *extra
        )
        assert code == 2 and out == "", extra
        assert expected in err[-1], (extra, err)
    # A checkpoint folder as --ckpt_path: a file of it is named
    code, out, err = _translate_main(monkeypatch, capsys, b"Ein Hund.\n", "--ckpt_path",
                                     str(Path(ckpt).parent))  # fmt: skip
    assert code == 1 and out == "" and len(err) == 1, err
    assert "is a folder of checkpoints (" in err[0] and f"e.g. {ckpt}" in err[0], err
    # Missing folders of --output are created, as predict and average create theirs.
    output = tmp_path / "new" / "sub" / "out.en"
    code, out, err = _translate_main(
        monkeypatch, capsys, b"Ein Hund.\n", "--ckpt_path", ckpt, "--output", str(output)
    )
    assert code == 0 and out == "", err
    assert len(output.read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # Abbreviations are refused (a typo must not pick an option by its prefix).
        (
            ["translate", "--ckpt_path", "m.ckpt", "--n_b", "2"],
            "unrecognized option --n_b (did you mean --n_best?)",
        ),
        # fairseq's spelling is pointed to ours.
        (
            ["translate", "--ckpt_path", "m.ckpt", "--beam-size", "2"],
            "unrecognized option --beam-size (did you mean --beam_size?)",
        ),
        # A mistyped required option is named after argparse's "required".
        (
            ["translate", "--ckpt", "m.ckpt"],
            "the following arguments are required: --ckpt_path; --ckpt is not an option of this "
            "command (did you mean --ckpt_path?)",
        ),
        (
            ["translate", "--ckpt-path", "m.ckpt"],
            "the following arguments are required: --ckpt_path; --ckpt-path is not an option of "
            "this command (did you mean --ckpt_path?)",
        ),
        (["translate"], "the following arguments are required: --ckpt_path"),
        # A mistyped choice gets the closest one.
        (
            ["export", "--ckpt_path", "m.ckpt", "--format", "ctranslate", "--output", "x"],
            "argument --format: invalid choice: 'ctranslate' (choose from 'ctranslate2', "
            "'huggingface') (did you mean --format ctranslate2?)",
        ),
        (
            ["translate", "--ckpt_path", "m.ckpt", "--dtype", "float16"],
            "argument --dtype: invalid choice: 'float16' (choose from 'float32', 'bfloat16', "
            "'fp32', 'bf16') (did you mean --dtype bfloat16?)",
        ),
        # A prefix is pointed to the options it abbreviates.
        (
            ["average", "--in", "a.ckpt", "--output", "o.ckpt"],
            "unrecognized option --in (did you mean --inputs?)",
        ),
        (
            ["translate", "--ckpt_path", "m.ckpt", "--beam", "2"],
            "unrecognized option --beam (did you mean --beam_size?)",
        ),
        # A config file belongs to the Lightning commands.
        (
            ["translate", "--config", "c.yaml", "--ckpt_path", "m.ckpt"],
            "unrecognized option --config (this command reads the model and its settings from "
            "--ckpt_path; a config file is for fit, validate, test and predict)",
        ),
        # argparse's own errors: one line naming the option.
        (
            ["translate", "--ckpt_path", "m.ckpt", "--n_best", "x"],
            "argument --n_best: invalid int value: 'x'",
        ),
    ],
)
def test_translate_and_average_options_are_not_abbreviated(monkeypatch, capsys, argv, expected):
    code, out = _exit_of_main(monkeypatch, capsys, *argv)
    err = out.err.strip().splitlines()
    assert code == 2 and out.out == ""
    assert err == [f"seq2seq {argv[0]}: error: {expected}"]


def test_translator_api_and_n_best(tiny_run):
    from seq2seq.translator import Translator

    translator = Translator.from_checkpoint(tiny_run / "checkpoints/tiny/last.ckpt", device="cpu")
    single = translator.translate(["Ein Hund läuft."], beam_size=2)
    assert isinstance(single[0], str)
    nbest = translator.translate(["Ein Hund läuft."], beam_size=2, n_best=2)
    assert len(nbest[0]) == 2 and nbest[0][0][1] >= nbest[0][1][1]
    assert nbest[0][0][0] == single[0]
    with pytest.raises(ValueError, match=r"n_best \(5\) exceeds the beam size \(2\)"):
        translator.translate(["Ein Hund läuft."], beam_size=2, n_best=5)
    assert translator.translate(["", "Ein Hund."])[0] == ""


def test_average_is_elementwise_mean(tiny_run, tmp_path):
    last = tiny_run / "checkpoints/tiny/last.ckpt"
    checkpoint = load_checkpoint(last)
    shifted = dict(checkpoint)
    shifted["state_dict"] = {
        k: v + 1.0 if v.is_floating_point() else v for k, v in checkpoint["state_dict"].items()
    }
    other = tmp_path / "shifted.ckpt"
    torch.save(shifted, other)
    out = average_checkpoints([last, other], tmp_path / "avg.ckpt")
    averaged = load_checkpoint(out)["state_dict"]
    for key, value in checkpoint["state_dict"].items():
        if value.is_floating_point():
            torch.testing.assert_close(averaged[key], value + 0.5)
    from seq2seq.translator import Translator

    assert len(Translator.from_checkpoint(out, device="cpu").translate(["Ein Hund."])) == 1


class _Exploit:
    def __reduce__(self):
        return (print, ("this ran during unpickling",))


def test_malicious_checkpoint_is_refused(tmp_path, capsys):
    path = tmp_path / "evil.ckpt"
    buffer = io.BytesIO()
    torch.save({"state_dict": {}, "payload": _Exploit()}, buffer)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(UnsafeCheckpointError, match="evil.ckpt"):
        load_checkpoint(path)
    assert "this ran during unpickling" not in capsys.readouterr().out


def test_console_script_exits_zero_after_a_run(tmp_path, multi30k_dir, tiny_cache):
    """`seq2seq fit ... && seq2seq test ...` in README needs exit status 0 on success."""
    script = Path(sys.executable).parent / "seq2seq"
    result = subprocess.run(
        [str(script), "fit", "--config", str(CONFIGS / "tiny.yaml"),
         "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(tiny_cache),
         "--trainer.fast_dev_run", "true"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_file_that_is_not_a_checkpoint_is_named_as_such(tmp_path):
    notes = tmp_path / "README.md"
    notes.write_text("# not a checkpoint\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="README.md is not a PyTorch checkpoint") as info:
        load_checkpoint(notes)
    assert not isinstance(info.value, UnsafeCheckpointError)


def test_a_missing_checkpoint_is_named_with_the_closest_file_of_its_folder(tmp_path):
    from seq2seq.checkpoint import missing_checkpoint

    for name in ("last.ckpt", "epoch03-step400-bleu20.10.ckpt", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert missing_checkpoint(tmp_path / "lats.ckpt") == (
        f"checkpoint not found: {tmp_path / 'lats.ckpt'} (did you mean {tmp_path / 'last.ckpt'}?)"
    )
    assert missing_checkpoint(tmp_path / "model.ckpt").endswith("model.ckpt")  # nothing close
    missing_folder = tmp_path / "nowhere" / "last.ckpt"
    assert missing_checkpoint(missing_folder) == f"checkpoint not found: {missing_folder}"
    assert missing_checkpoint("bset", aliases=("best", "last")).endswith("(did you mean best?)")
    with pytest.raises(FileNotFoundError, match="did you mean .*last.ckpt"):
        load_checkpoint(tmp_path / "lst.ckpt")


def test_user_errors_are_one_line_without_traceback(tmp_path, monkeypatch, capsys):
    from seq2seq.cli import main

    monkeypatch.setattr("sys.argv", ["seq2seq", "translate", "--ckpt_path", "nope.ckpt"])
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main() == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "seq2seq: error: checkpoint not found: nope.ckpt (SEQ2SEQ_TRACEBACK=1 shows where)"
    )


def test_more_user_errors_are_one_line(tmp_path, monkeypatch, capsys):
    """Bad settings and bad files of every command: one line, exit status 1 (argument
    errors: argparse's status 2)."""
    from seq2seq.cli import main

    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "fake.ckpt"
    fake.write_text("not a checkpoint\n")
    latin1 = tmp_path / "latin1.de"
    latin1.write_bytes("Grüße\n".encode("latin-1"))
    cases = [
        (["translate", "--ckpt_path", str(fake)], "fake.ckpt"),
        (["translate", "--ckpt_path", str(fake), "--input", str(tmp_path)], None),
        (
            [
                "fit",
                "--config",
                str(CONFIGS / "tiny.yaml"),
                "--data.data_dir",
                str(tmp_path / "nodata"),
                "--data.download",
                "false",
            ],
            "nodata",
        ),
        (
            ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--model.val_beam_size", "0"],
            "model.val_beam_size must be >= 1",
        ),
    ]
    for argv, expected in cases:
        monkeypatch.setattr("sys.argv", ["seq2seq", *argv])
        assert main() == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("seq2seq: error: "), (argv, err)
        if expected:
            assert expected in err[0]
    monkeypatch.setattr(
        "sys.argv", ["seq2seq", "translate", "--ckpt_path", "x", "--beam_size", "0"]
    )
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert "--beam_size must be >= 1, got 0" in capsys.readouterr().err


def test_bad_checkpoints_are_refused_before_any_data_is_read(
    tiny_run, tmp_path, monkeypatch, capsys
):
    """A missing file, a folder, or (for fit) a weights-only checkpoint: one line, before the
    data module looks for corpora (nothing is downloaded into the missing data folder)."""
    from seq2seq.cli import main

    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    averaged = average_checkpoints(
        [tiny_run / "checkpoints/tiny/last.ckpt"] * 2, tmp_path / "avg.ckpt"
    )
    config = ["--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(tmp_path / "nodata")]
    hf = tmp_path / "opus-mt-de-en"  # a Hugging Face folder, not imported
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    ct2 = tmp_path / "ct2"  # a CTranslate2 export's files
    ct2.mkdir()
    (ct2 / "config.json").write_text("{}")
    (ct2 / "model.bin").write_bytes(b"")
    cases = [
        (["test", *config, "--ckpt_path", "nope.ckpt"], "checkpoint not found: nope.ckpt"),
        (["test", *config, "--ckpt_path", "bset"], "not found: bset (did you mean best?)"),
        (["test", *config, "--ckpt_path", "avg.ckp"], "avg.ckp (did you mean avg.ckpt?)"),
        (["test", *config, "--ckpt_path", str(tmp_path)], "is a folder, not a checkpoint file"),
        (
            ["fit", *config, "--init_from", str(hf)],
            "a Hugging Face folder becomes one with seq2seq",
        ),
        (["fit", *config, "--ckpt_path", str(averaged)], "holds model weights only"),
        (
            ["test", *config, "--ckpt_path", str(ct2)],
            "holds a CTranslate2 model, which seq2seq translate and score read",
        ),
    ]
    for argv, expected in cases:
        monkeypatch.setattr("sys.argv", ["seq2seq", *argv])
        assert main() == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], (argv, err)
    assert not (tmp_path / "nodata").exists()
    # Over another run's checkpoint folder, the file is named first (resuming it elsewhere
    # would fail the same way).
    other_run = tmp_path / "checkpoints" / "tiny"
    other_run.mkdir(parents=True)
    shutil.copy(tiny_run / "checkpoints/tiny/last.ckpt", other_run / "last.ckpt")
    monkeypatch.setattr("sys.argv", ["seq2seq", "fit", *config, "--ckpt_path", str(averaged)])
    assert main() == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds model weights only" in err[0], err


@pytest.mark.parametrize("command", ["validate", "test", "predict", "fit"])
def test_torch_files_that_are_no_checkpoints_are_one_line(command, in_tmp, monkeypatch, capsys):
    """A PyTorch file that is no Lightning checkpoint (no weights, or no Lightning version):
    one line naming it, exit status 1, before any data is read (Lightning's own restore
    fails with a traceback and ``KeyError: 'pytorch-lightning_version'``)."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    files = {
        "other.pt": ({"a": 1}, "holds no model weights (no state_dict)"),
        "empty.pt": ({"state_dict": {}}, "holds no model weights (no state_dict)"),
        "bare.pt": ({"state_dict": {"w": torch.ones(2)}}, "is not a Lightning checkpoint"),
    }
    for name, (content, _) in files.items():
        torch.save(content, in_tmp / name)
    argv = [command, "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", "nodata"]
    if command == "predict":
        argv += ["--data.predict_file", "in.de", "--prediction_writer.output_path", "out.en"]
    for name, (_, expected) in files.items():
        code, out, err = run_main(monkeypatch, capsys, *argv, "--ckpt_path", name)
        assert code == 1 and out == "", (name, err)
        assert len(err) == 1 and err[0].startswith(f"seq2seq: error: {name} {expected}"), err
    assert sorted(p.name for p in in_tmp.iterdir()) == sorted(files)  # nothing read or made


def test_predict_refuses_an_output_path_it_cannot_write_before_reading_anything(
    in_tmp, monkeypatch, capsys
):
    """--prediction_writer.output_path that is a folder, or in a folder that cannot be written:
    one line naming the option, before the checkpoint (here no checkpoint at all) is read, not
    an error after every line is translated."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    (in_tmp / "out").mkdir()
    (in_tmp / "locked").mkdir()
    refuse_new_files(monkeypatch, "locked")  # as a read-only folder (chmod does not stop root)
    cases = [
        ("out", "--prediction_writer.output_path out is a folder; give a file name"),
        ("locked/out.en", "--prediction_writer.output_path locked/out.en: no file can be"),
        ("locked/new/out.en", "--prediction_writer.output_path locked/new/out.en: no file can"),
    ]
    for output, expected in cases:
        code, out, err = run_main(
            monkeypatch, capsys, *_predict_argv(in_tmp / "in.de", in_tmp / "no.ckpt", output)
        )
        assert code == 1 and out == "", err
        assert len(err) == 1 and err[0].startswith(f"seq2seq: error: {expected}"), err
    assert sorted(p.name for p in in_tmp.iterdir()) == ["locked", "out"]
    assert not any(in_tmp.rglob("*.*"))


def test_predict_writes_through_a_temporary_file_of_its_own(
    tiny_run, monkeypatch, tmp_path, capsys
):
    """A user's file named like the output plus .tmp is left alone, and no temporary file is
    left behind."""
    monkeypatch.chdir(tiny_run)
    source = tmp_path / "input.de"
    source.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    output = tmp_path / "output.en"
    (tmp_path / "output.en.tmp").write_text("the user's notes\n", encoding="utf-8")
    cli_main(_predict_argv(source, tiny_run / "checkpoints/tiny/last.ckpt", output))
    assert len(output.read_text(encoding="utf-8").splitlines()) == 1
    assert (tmp_path / "output.en.tmp").read_text(encoding="utf-8") == "the user's notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "input.de",
        "output.en",
        "output.en.tmp",
    ]


def test_a_checkpoint_trained_with_other_data_settings_is_one_line(monkeypatch, capsys):
    """Lightning's hparams clash between a checkpoint's model and the config's data module is
    reported in one line with what to do; other RuntimeErrors keep their traceback."""
    import seq2seq.cli.entry as cli

    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.setattr("sys.argv", ["seq2seq", "test"])
    clash = RuntimeError(
        "Error while merging hparams: the keys ['max_positions'] are present in both the "
        "LightningModule's and LightningDataModule's hparams but have different values."
    )

    def raise_(error):
        raise error

    monkeypatch.setattr(cli, "cli_main", lambda: raise_(clash))
    assert cli.main() == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_positions" in err[0] and "--data.max_positions" in err[0]
    monkeypatch.setattr(cli, "cli_main", lambda: raise_(RuntimeError("something else")))
    with pytest.raises(RuntimeError, match="something else"):
        cli.main()


def test_yaml_syntax_error_names_the_config_file_and_line(monkeypatch, capsys, tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text("trainer:\n  max_epochs: 1\n  callbacks: [unclosed\n", encoding="utf-8")
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", str(config))
    assert code == 2
    err = out.err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"seq2seq: error: YAML syntax error in {config}, line 4, column 1: ")
    # A trainer piece given as a file is checked the same way.
    tiny = str(CONFIGS / "tiny.yaml")
    code, out = _exit_of_main(
        monkeypatch, capsys, "fit", "--config", tiny, "--trainer", str(config)
    )
    assert code == 2 and out.err.startswith(f"seq2seq: error: YAML syntax error in {config}")


def test_a_key_set_twice_in_a_config_names_the_key_and_both_lines(monkeypatch, capsys, tmp_path):
    """YAML loaders keep the last of two equal keys without a word; the run refuses them."""
    config = tmp_path / "twice.yaml"
    config.write_text(
        "trainer:\n  max_epochs: 1\n  callbacks:\n"
        "    - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
        "      init_args:\n        monitor: val/bleu\n        patience: 3\n"
        "        monitor: val/loss\n",
        encoding="utf-8",
    )
    tiny = str(CONFIGS / "tiny.yaml")
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", tiny, "--config", str(config))
    assert code == 2
    assert out.err.splitlines() == [
        f"seq2seq: error: {config}, line 8: trainer.callbacks[0].init_args.monitor is set twice "
        "(first on line 6), and only the last one would count: remove one of them"
    ]
    # Top-level groups too; YAML merge keys (<<) and equal keys in different mappings are fine.
    config.write_text("trainer:\n  max_epochs: 1\nmodel: {}\ntrainer:\n  max_steps: 2\n")
    code, out = _exit_of_main(monkeypatch, capsys, "fit", "--config", str(config))
    assert code == 2 and f"{config}, line 4: trainer is set twice (first on line 1)" in out.err
    merged = tmp_path / "merged.yaml"
    merged.write_text("a: &a {x: 1}\nb:\n  <<: *a\n  x: 2\nc:\n  x: 3\n", encoding="utf-8")
    from seq2seq.cli.messages import check_config_syntax

    check_config_syntax(["fit", "--config", str(merged)])  # returns
    for name in CONFIGS.glob("*.yaml"):
        check_config_syntax(["fit", "--config", str(name)])


@pytest.mark.parametrize("flag", [["-c", "{}"], ["--config", "{}"], ["--config={}"]])
def test_a_config_file_that_does_not_exist_names_the_files_spelt_alike(
    monkeypatch, capsys, tmp_path, flag
):
    (tmp_path / "run_de_en.yaml").write_text("trainer: {}\n", encoding="utf-8")
    (tmp_path / "other.yaml").write_text("trainer: {}\n", encoding="utf-8")
    argv = [part.format(tmp_path / "run_de_en.yml") for part in flag]
    code, out = _exit_of_main(monkeypatch, capsys, "test", *argv)
    assert code == 2 and out.err.splitlines() == [
        f"seq2seq: error: --config {tmp_path / 'run_de_en.yml'}: no such file "
        f"(did you mean {tmp_path / 'run_de_en.yaml'}?)"
    ]
    code, out = _exit_of_main(monkeypatch, capsys, "test", "--config", str(tmp_path / "x.yaml"))
    assert code == 2 and out.err.splitlines() == [
        f"seq2seq: error: --config {tmp_path / 'x.yaml'}: no such file"
    ]


@pytest.mark.parametrize("flag", [["-c", "{}"], ["--config", "{}"], ["--config={}"]])
def test_a_config_of_one_command_before_the_command_is_one_line(monkeypatch, capsys, flag):
    tiny = str(CONFIGS / "tiny.yaml")
    argv = [part.format(tiny) for part in flag]
    code, out = _exit_of_main(monkeypatch, capsys, *argv, "test", "--ckpt_path", "best")
    assert code == 2
    assert out.err.strip() == (
        f"seq2seq: error: {tiny} holds the settings of one command: give it after the "
        f"command, seq2seq test --config {tiny} ..."
    )


def test_an_option_before_the_config_that_sets_it_is_one_line(tmp_path, monkeypatch, capsys):
    """jsonargparse applies arguments in order: the config's value would replace an option
    given before it, silently."""
    tiny = str(CONFIGS / "tiny.yaml")
    for given in (["--trainer.max_steps", "3"], ["--trainer.max_steps=3"]):
        argv = ["fit", *given, "--config", tiny, "--trainer.fast_dev_run", "true"]
        code, out = _exit_of_main(monkeypatch, capsys, *argv)
        assert code == 2 and out.out == ""
        assert out.err.strip() == (
            f"seq2seq: error: --trainer.max_steps comes before --config {tiny}, which sets "
            f"trainer.max_steps too, and the later one wins: give the config first, seq2seq "
            f"fit --config {tiny} --trainer.max_steps ..."
        )
    # Keys under a class_path's init_args count; keys the file leaves alone are no clash.
    from seq2seq.cli.messages import check_options_before_config

    config = tmp_path / "c.yaml"
    config.write_text(
        "trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.TensorBoardLogger\n"
        "    init_args:\n      save_dir: logs\n"
    )
    with pytest.raises(SystemExit):
        check_options_before_config(["test", "--trainer.logger.save_dir", "x", "-c", str(config)])
    check_options_before_config(["test", "--trainer.max_epochs", "3", "-c", str(config)])
    check_options_before_config(["test", "--config", str(config), "--trainer.logger.save_dir", "x"])
    capsys.readouterr()


def test_resuming_a_run_whose_max_time_is_spent_says_why_nothing_trains(
    tmp_path, multi30k_dir, tiny_cache, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    argv = [
        "fit",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir),
        "--data.cache_dir", str(tiny_cache),
        "--trainer.max_steps", "-1",
        "--trainer.max_time", "00:00:00:02",
        "--trainer.limit_val_batches", "0",
    ]  # fmt: skip
    first = cli_main(argv)
    assert first.trainer.global_step > 0
    capsys.readouterr()
    again = cli_main([*argv, "--ckpt_path", "last"])
    assert again.trainer.global_step == first.trainer.global_step
    assert "seq2seq: nothing trained: the resumed run had already spent" in capsys.readouterr().err


def test_lightnings_val_check_interval_advice_is_given_as_a_flag(
    tiny_cache, multi30k_dir, tmp_path, monkeypatch, capsys
):
    """val_check_interval above the batches of an epoch: Lightning's error, with its advice
    (check_val_every_n_epoch=None) written as the command-line flag that does it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    code, _, err = run_main(
        monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(tiny_cache),
        "--trainer.limit_train_batches", "3", "--trainer.val_check_interval", "5",
    )  # fmt: skip
    assert code == 1 and err[-1].startswith("seq2seq: error: "), err
    assert "`val_check_interval` (5) must be less than or equal" in err[-1], err
    assert "set --trainer.check_val_every_n_epoch null" in err[-1], err


def test_resuming_a_run_at_its_max_steps_says_why_nothing_trains(
    tiny_run, tiny_cache, multi30k_dir, tmp_path, monkeypatch, capsys
):
    """tiny_run's last.ckpt is at step 20, tiny.yaml's max_steps: resuming it trains nothing
    and says which limit to raise, writing no config file beside the run's (a copy of it, in
    its own folder as the run was)."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    monkeypatch.chdir(run)
    last = run / "checkpoints/tiny/last.ckpt"
    argv = [
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir),
        "--data.cache_dir", str(tiny_cache), "--ckpt_path", str(last),
    ]  # fmt: skip
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 0, err
    expected = (
        "seq2seq: nothing trained: the resumed run is at step 20, --trainer.max_steps is 20; "
        "raise --trainer.max_steps to train on"
    )
    assert expected in err, err
    assert list(run.rglob("config.yaml")) and not list(run.rglob("config.resumed-step*"))


def test_early_stopping_says_why_the_fit_stopped_and_patience_is_one_flag(
    tiny_cache, multi30k_dir, tmp_path, monkeypatch, capsys
):
    """--patience replaces the patience of the config's EarlyStopping (fairseq's --patience);
    a fit it stops says so, as Lightning says which limit ended one."""
    monkeypatch.chdir(tmp_path)
    argv = [
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir),
        "--data.cache_dir", str(tiny_cache), "--trainer.max_steps", "60",
        "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/loss",
        "--trainer.callbacks.min_delta", "100", "--trainer.callbacks.patience", "3",
    ]  # fmt: skip
    code, out, err = run_main(monkeypatch, capsys, *argv, "--patience", "1")
    assert code == 0, err
    # validations every 10 steps: the first sets the best, the second (step 20) stops the run
    assert load_checkpoint(tmp_path / "checkpoints/tiny/last.ckpt")["global_step"] == 20
    assert re.search(
        r"^`Trainer\.fit` stopped by EarlyStopping: Monitored metric val/loss did not improve "
        r"in the last 1 records\. Best score: [\d.]+\.$",
        out,
        re.MULTILINE,
    ), out
    code, out, _ = run_main(monkeypatch, capsys, *argv, "--patience", "1", "--print_config")
    assert code == 0 and "patience: 1\n" in out and "patience: 3" not in out, out  # as applied
    code, _, err = run_main(monkeypatch, capsys, *argv[:7], "--patience", "2")
    assert code == 1 and err[-1].startswith(
        "seq2seq: error: --patience 2: the config has no EarlyStopping in trainer.callbacks"
    ), err


def test_early_stopping_or_checkpoints_against_their_metric_are_warned_about(capsys):
    """EarlyStopping's default mode min on val/bleu would stop while BLEU rises: warned, as a
    ModelCheckpoint keeping the lowest BLEU; modes along their metric are not."""
    from jsonargparse import Namespace

    from seq2seq.cli.callback_args import warn_callback_modes

    def config(*callbacks):
        return Namespace(trainer=Namespace(callbacks=[
            Namespace(class_path=f"lightning.pytorch.callbacks.{kind}", init_args=Namespace(**args))
            for kind, args in callbacks
        ]))  # fmt: skip

    early, kept = {"monitor": "val/bleu", "mode": None}, {"monitor": "val/loss", "mode": "max"}
    warn_callback_modes(config(("EarlyStopping", early), ("ModelCheckpoint", kept)))
    assert capsys.readouterr().err.splitlines() == [
        "seq2seq: warning: EarlyStopping monitors val/bleu in mode min, but a higher bleu is "
        "better: give it mode max",
        "seq2seq: warning: ModelCheckpoint monitors val/loss in mode max, but a lower loss is "
        "better: give it mode min",
    ]
    early, kept = {"monitor": "val/de-en/chrf", "mode": "max"}, {"monitor": None, "mode": "min"}
    warn_callback_modes(config(("EarlyStopping", early), ("ModelCheckpoint", kept)))
    assert capsys.readouterr().err == ""


def test_a_monitor_the_validation_does_not_log_or_a_second_ema_is_refused_before_training(
    multi30k_dir, tmp_path, monkeypatch, capsys
):
    """A ModelCheckpoint or EarlyStopping monitoring a misspelt val/ key is refused with a
    suggestion before any data is read (Lightning would find out at the first validation);
    another key (train/loss) is left to Lightning. A second EMA, the README's flags added to a
    config that has one, is refused in one line instead of Lightning's traceback."""
    monkeypatch.chdir(tmp_path)
    text = (CONFIGS / "tiny.yaml").read_text()
    assert text.count("monitor: val/bleu") >= 1
    (tmp_path / "blue.yaml").write_text(text.replace("monitor: val/bleu", "monitor: val/blue"))
    base = ["--data.data_dir", str(multi30k_dir), "--trainer.max_steps", "2"]
    code, _, err = run_main(monkeypatch, capsys, "fit", "--config", "blue.yaml", *base)
    assert code == 1 and err[-1].startswith(
        "seq2seq: error: ModelCheckpoint monitors 'val/blue' (did you mean val/bleu?), which "
        "the validation does not log; it logs val/<name> for loss, nll, ppl, bleu, chrf, ter"
    ), err
    early = ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor"]
    tiny = ["fit", "--config", str(CONFIGS / "tiny.yaml")]
    code, _, err = run_main(monkeypatch, capsys, *tiny, *base, *early, "val/chrfpp")
    assert code == 1 and "EarlyStopping monitors 'val/chrfpp', which the validation does not " \
        "log; it logs val/<name> for loss, nll, ppl, bleu, chrf, ter (model.metrics; add " \
        "chrfpp)" in err[-1], err  # fmt: skip
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "data").exists()

    from seq2seq.cli.callback_args import check_callback_monitors

    config = {"trainer": {"callbacks": [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
         "init_args": {"monitor": "train/loss"}},
    ]}}  # fmt: skip
    check_callback_monitors(config)  # not a validation key: Lightning's to check

    ema = ["--trainer.callbacks+=seq2seq.callbacks.EMA", "--trainer.callbacks.decay", "0.5"]
    readme = ["fit", "--config", str(CONFIGS / "multi30k_de_en.yaml")]
    code, _, err = run_main(monkeypatch, capsys, *readme, *base, *ema)
    assert code == 1 and err[-1].startswith(
        "seq2seq: error: trainer.callbacks holds seq2seq.callbacks.EMA twice (a config with "
        "one, and --trainer.callbacks+=seq2seq.callbacks.EMA adding another, say), and a run "
        "keeps one: change the settings of the config's in a copy of the config instead"
    ), err
    code, _, err = run_main(monkeypatch, capsys, *readme, *base, "--print_config")
    assert code == 0, err  # one EMA: accepted


def test_a_direction_given_to_a_fit_of_several_pairs_is_named_as_unread(capsys):
    """fit trains every pair of data.pairs: --data.src_lang/--data.tgt_lang on its command line
    get a warning; the values of a config file (every config has them) do not."""
    from seq2seq.cli.app import _warn_unread_direction

    data = {"pairs": ["de-en", "fr-en"], "src_lang": "fr", "tgt_lang": "en"}
    _warn_unread_direction(data, ["fit", "--data.src_lang", "fr", "--data.tgt_lang=en"])
    assert capsys.readouterr().err == (
        "seq2seq: warning: --data.src_lang and --data.tgt_lang are not read by fit with several "
        "data.pairs: it trains every pair (de-en, fr-en); to train one direction, list it alone "
        "in --data.pairs\n"
    )
    _warn_unread_direction(data, ["fit", "--data.tgt_lang", "en"])
    assert capsys.readouterr().err.startswith("seq2seq: warning: --data.tgt_lang is not read by")
    for argv, pairs in ((["fit", "--config", "c.yaml"], data["pairs"]),
                        (["fit", "--data.src_lang", "fr"], ["fr-en"])):  # fmt: skip
        _warn_unread_direction({**data, "pairs": pairs}, argv)
        assert capsys.readouterr().err == ""


def test_translate_scores_flag(tiny_run, monkeypatch, capsys):
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    source = "Ein Hund läuft.\n\nEine Frau singt.\n".encode()
    runs = {}
    for name, extra in [
        ("plain", []),
        ("scores", ["--scores"]),
        ("nbest", ["--n_best", "2"]),
        ("nbest_scores", ["--n_best", "2", "--scores"]),
        ("scores_true", ["--scores", "true"]),
        ("scores_false", ["--scores", "false"]),
    ]:
        code, out, err = _translate_main(
            monkeypatch, capsys, source, "--ckpt_path", ckpt, "--beam_size", "2", *extra
        )
        assert code == 0, (extra, err)
        runs[name] = out.splitlines()
    # Default: the text alone; --scores: score<TAB>text for the same text, one line per input.
    assert len(runs["plain"]) == 3 and "\t" not in "".join(runs["plain"])
    assert len(runs["scores"]) == 3
    assert runs["scores_true"] == runs["scores"] and runs["scores_false"] == runs["plain"]
    rows = [line.split("\t") for line in runs["scores"]]
    assert [text for _, text in rows] == runs["plain"]
    assert rows[1] == ["0.0000", ""]  # an empty line: an empty translation, scored 0
    # The score is that of the best of the n-best rows.
    nbest = [line.split("\t") for line in runs["nbest"]]
    assert rows[0][0] == nbest[0][1] and float(rows[0][0]) < 0
    # --n_best above 1 keeps its index<TAB>score<TAB>text rows, with or without --scores.
    assert runs["nbest_scores"] == runs["nbest"]
    assert [row[0] for row in nbest] == ["0", "0", "1", "1", "2", "2"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--dir", ".", "--last", "0"], "--last must be >= 1, got 0"),
        (["--inputs", "a.ckpt", "--last", "0"], "give either --inputs or --dir with --last"),
    ],
)
def test_average_refuses_bad_counts(monkeypatch, capsys, tmp_path, argv, expected):
    monkeypatch.chdir(tmp_path)
    code, out = _exit_of_main(monkeypatch, capsys, "average", *argv, "--output", "avg.ckpt")
    assert code == 2 and expected in out.err


class InterruptAtStep(L.Callback):
    """Raises KeyboardInterrupt (as Ctrl-C would) before training batch ``step`` (test helper)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


def test_ctrl_c_during_fit_saves_last_checkpoint_and_exits_130(
    tmp_path, multi30k_dir, tiny_cache, monkeypatch, capsys
):
    from seq2seq.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        "sys.argv",
        [
            "seq2seq", "fit",
            "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--data.cache_dir", str(tiny_cache),
            "--trainer.callbacks+", "test_cli.InterruptAtStep",
            "--trainer.callbacks.step", "3",
        ],
    )  # fmt: skip
    sigint = signal.getsignal(signal.SIGINT)  # Lightning ignores SIGINT while shutting down
    try:
        code = main()
    finally:
        signal.signal(signal.SIGINT, sigint)
    err = capsys.readouterr().err
    assert code == 130, err[-2000:]
    assert "seq2seq: interrupted" in err
    assert load_checkpoint(tmp_path / "checkpoints/tiny/last.ckpt")["global_step"] == 3


def test_evaluation_takes_max_positions_from_the_checkpoint(
    tiny_run, multi30k_dir, monkeypatch, capsys
):
    """data.max_positions sets the model's max_positions; test/validate/predict build the
    checkpoint's model, so they take the checkpoint's value (with the other architecture
    settings, named in the warning) instead of failing on the config's."""
    from seq2seq.cli import main

    monkeypatch.chdir(tiny_run)
    trained = load_checkpoint(tiny_run / "checkpoints/tiny/last.ckpt")["hyper_parameters"]
    other = trained["max_positions"] + 8
    monkeypatch.setattr(
        "sys.argv",
        [
            "seq2seq", "test",
            "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--data.max_positions", str(other),
            "--trainer.limit_test_batches", "1",
            "--ckpt_path", "last",
        ],
    )  # fmt: skip
    assert main() == 0
    warnings_ = [
        line
        for line in capsys.readouterr().err.splitlines()
        if "other model settings than the config" in line
    ]
    assert len(warnings_) == 1, warnings_
    assert f"data.max_positions {trained['max_positions']} (config {other})" in warnings_[0]


def test_last_checkpoint_holds_the_final_step_when_max_steps_ends_between_validations(
    tmp_path, multi30k_dir, tiny_cache, monkeypatch
):
    """Training that stops at max_steps after its last validation still writes those steps to
    last.ckpt (LastCheckpoint.on_train_end), so resuming or testing `last` does not go back."""
    monkeypatch.chdir(tmp_path)
    argv = [
        "fit",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir),
        "--data.cache_dir", str(tiny_cache),
        "--trainer.max_steps", "7",
        "--trainer.val_check_interval", "5",
        "--trainer.limit_val_batches", "1",
    ]  # fmt: skip
    cli = cli_main(argv)
    assert cli.trainer.global_step == 7
    last = load_checkpoint(tmp_path / "checkpoints/tiny/last.ckpt")
    assert last["global_step"] == 7
    assert last["loops"]["fit_loop"]["epoch_progress"]["total"]["completed"] == 0  # mid-epoch
    assert sorted(p.name for p in (tmp_path / "checkpoints/tiny").iterdir()) == [
        "epoch=0-step=5.ckpt",
        "last.ckpt",
    ]


def test_fast_dev_run_writes_no_checkpoint_or_hypotheses(
    tmp_path, multi30k_dir, tiny_cache, monkeypatch
):
    """A smoke run (--trainer.fast_dev_run) in a folder that holds a real run leaves its
    last.ckpt alone (so `best` and `last` still resolve) and writes no hypothesis files."""
    monkeypatch.chdir(tmp_path)
    base = ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir)]
    base += ["--data.cache_dir", str(tiny_cache)]
    cli_main([*base, "--trainer.max_steps", "5", "--trainer.val_check_interval", "5"])
    last = tmp_path / "checkpoints/tiny/last.ckpt"
    before = last.read_bytes()
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    cli_main([*base, "--trainer.fast_dev_run", "true"])
    assert last.read_bytes() == before
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()) == files
    assert load_checkpoint(resolve_ckpt_path("best", [tmp_path / "checkpoints/tiny"]))


def test_best_of_a_copied_run_folder_is_its_own_file(tiny_run, tmp_path):
    """last.ckpt records the best checkpoint's absolute path; --ckpt_path best takes the file of
    that name in the folder searched, never the one of the folder the run was copied from."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_run / "checkpoints/tiny", copy)
    best = resolve_ckpt_path("best", [copy])
    assert best.parent == copy and best.is_file() and best.name != "last.ckpt"
    best.unlink()
    with pytest.raises(
        FileNotFoundError, match=f"names {best.name} as the best checkpoint, not in"
    ):
        resolve_ckpt_path("best", [copy])
    assert (tiny_run / "checkpoints/tiny" / best.name).is_file()  # the original is still there


def test_a_resume_in_a_copied_run_folder_keeps_the_scores_of_its_checkpoints(
    tiny_run, multi30k_dir, in_tmp
):
    """Resumed in a copy of its checkpoint folder, a run keeps ModelCheckpoint's ranking (the
    files of the copy, their scores): Lightning would drop it for the folder it recorded, and
    the next validation would become best whatever its score."""
    from seq2seq.callbacks.last_checkpoint import state_in_folder

    original = tiny_run / "checkpoints/tiny"
    shutil.copytree(original, in_tmp / "copy")
    saved = load_checkpoint(original / "last.ckpt")
    (key,) = [k for k in saved["callbacks"] if k.startswith("ModelCheckpoint")]
    state = saved["callbacks"][key]
    assert state["best_model_score"] is not None and state["best_k_models"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = cli_main([
            "fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir),
            "--data.cache_dir", str(tiny_run / "data/cache"), "--checkpoint_dir", "copy",
            "--ckpt_path", "last", "--trainer.max_steps", str(saved["global_step"] + 1),
            "--trainer.limit_val_batches", "0",
        ])  # fmt: skip
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    callback = cli.trainer.checkpoint_callback
    assert float(callback.best_model_score) == float(state["best_model_score"])
    copy = os.path.realpath("copy")
    assert {Path(p).parent for p in callback.best_k_models} == {Path(copy)}
    assert Path(callback.best_model_path) == Path(copy) / Path(state["best_model_path"]).name
    assert state_in_folder(state, state["dirpath"]) is state  # its own folder: as it is
    (in_tmp / "copy" / Path(state["best_model_path"]).name).unlink()
    assert state_in_folder(state, copy) is state  # a ranked file missing: as it is


def test_best_of_a_run_stopped_before_its_first_validation_points_to_last(tiny_run, tmp_path):
    """FileNotFoundError: '--ckpt_path best: .../last.ckpt records no best checkpoint (the run
    stopped before its first validation, ...); use --ckpt_path last, ...'."""
    checkpoint = load_checkpoint(tiny_run / "checkpoints/tiny/last.ckpt")
    for key, state in checkpoint["callbacks"].items():
        if key.startswith("ModelCheckpoint"):
            state["best_model_path"] = ""
    (tmp_path / "run").mkdir()
    torch.save(checkpoint, tmp_path / "run" / "last.ckpt")
    with pytest.raises(FileNotFoundError, match=r"last\.ckpt records no best checkpoint .* use "):
        resolve_ckpt_path("best", [tmp_path / "run"])
    assert resolve_ckpt_path("last", [tmp_path / "run"]) == tmp_path / "run" / "last.ckpt"


def test_best_or_last_in_a_mistyped_folder_names_the_folder_alike(tmp_path, monkeypatch):
    """A checkpoint folder that does not exist is said to, with the folders beside it spelt
    alike; an existing one without checkpoints is named alone."""
    (tmp_path / "checkpoints" / "en_de").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    typo, empty = tmp_path / "checkpoints" / "en_dee", tmp_path / "empty"
    with pytest.raises(FileNotFoundError) as error:
        resolve_ckpt_path("best", [typo, empty])
    assert str(error.value) == (
        f"--ckpt_path best: no best checkpoint found in {typo} (no such folder; did you mean "
        f"{tmp_path / 'checkpoints' / 'en_de'}?), {empty}; run `seq2seq fit` with the same "
        "config first, or pass the path of a .ckpt file"
    )
    # A relative folder (a config's dirpath) is read from where the command runs.
    monkeypatch.chdir(empty)
    with pytest.raises(
        FileNotFoundError,
        match=rf"checkpoints/en_de \(no such folder under {empty}, where the command runs\)",
    ):
        resolve_ckpt_path("best", [Path("checkpoints/en_de")])


def test_fit_prints_no_lightning_advertisement_or_internal_deprecation(
    tmp_path, multi30k_dir, monkeypatch, caplog
):
    """No litlogger "💡 Tip", no PyTorch deprecation raised inside Lightning, no
    "Checkpoint directory ... is not empty" when resuming into the run's own folder, and no
    ModelCheckpoint "could not find the monitored key" when a run ends before its first
    validation (a line of seq2seq's says so)."""
    monkeypatch.chdir(tmp_path)
    base = ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli_main([*base, "--trainer.max_steps", "2"])
        cli_main([*base, "--trainer.max_steps", "3", "--ckpt_path", "last"])
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "LeafSpec" in m or "is not empty" in m]
    assert not [m for m in messages if "could not find the monitored key" in m]
    assert not [r for r in caplog.records if "Tip" in r.getMessage()]
    # Both runs stop (max_steps) before the first validation (step 10): said in the run's terms.
    ended = [
        r.getMessage() for r in caplog.records if "before its first validation" in r.getMessage()
    ]
    assert len(ended) == 2, ended
    assert ended[1].startswith("training ended at step 3 before its first validation: no ")
    assert "use --ckpt_path last" in ended[1]


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_evaluation_without_a_checkpoint_is_refused(command, in_tmp, monkeypatch, capsys):
    """validate/test/predict without --ckpt_path would score (or translate with) the freshly
    initialised model of the config: refused as an argument error before any data is read."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    argv = [command, "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", "nodata"]
    if command == "predict":
        argv += ["--data.predict_file", "in.de", "--prediction_writer.output_path", "out.en"]
    code, out, err = run_main(monkeypatch, capsys, *argv)
    assert code == 2 and out == ""
    assert len(err) == 2, err
    assert err[0].startswith(f"seq2seq: error: {command} needs --ckpt_path best, last or FILE")
    assert "--ckpt_path untrained" in err[0]
    assert err[1] == f"For the full list of options run: seq2seq {command} --help"
    assert list(in_tmp.iterdir()) == []  # nothing read, downloaded or created
    # The option's help says so.
    code, out, _ = run_main(monkeypatch, capsys, command, "--help")
    assert code == 0
    help_text = " ".join(out.split())
    assert "--ckpt_path untrained" in help_text and "Required" in help_text


def test_untrained_model_is_scored_only_when_asked_for(tiny_run, multi30k_dir, monkeypatch):
    """--ckpt_path untrained: the config's model with fresh weights, recorded as such in the
    run's config.yaml (a smoke test of the evaluation, not a result)."""
    monkeypatch.chdir(tiny_run)
    cli = cli_main(
        [
            "validate",
            "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--ckpt_path", "untrained",
            "--trainer.limit_val_batches", "1",
        ]
    )  # fmt: skip
    assert "val/bleu" in cli.trainer.callback_metrics
    assert cli.trainer.ckpt_path is None
    saved = yaml.safe_load((Path(cli.trainer.log_dir) / "config.yaml").read_text("utf-8"))
    assert saved["ckpt_path"] == "untrained"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
@pytest.mark.parametrize("accelerator", ["gpu", "mps"], ids=["accelerator=gpu", "accelerator=mps"])
def test_an_accelerator_the_machine_lacks_is_one_line(in_tmp, accelerator, monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    code, _, err = run_main(
        monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"),
        "--trainer.accelerator", accelerator,
    )  # fmt: skip
    assert code == 1
    assert err[-1] == (
        f"seq2seq: error: --trainer.accelerator {accelerator}: this machine has no such "
        "accelerator that PyTorch can use; train on the CPU with --trainer "
        "configs/trainer/cpu.yaml (or --trainer.accelerator cpu --trainer.precision 32-true) "
        "(SEQ2SEQ_TRACEBACK=1 shows where)"
    ), err
    assert not any(in_tmp.iterdir())


def test_all_devices_on_the_cpu_is_one_line(in_tmp, monkeypatch, capsys):
    """configs/trainer/ddp.yaml asks for devices -1 (every GPU); with the CPU accelerator
    Lightning raised a TypeError with its traceback."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    code, _, err = run_main(
        monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"),
        "--trainer", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.accelerator", "cpu",
    )  # fmt: skip
    assert code == 1
    assert err[-1] == (
        "seq2seq: error: --trainer.devices -1 with --trainer.accelerator cpu: on the CPU give "
        "the number of processes, e.g. --trainer.devices 2 (SEQ2SEQ_TRACEBACK=1 shows where)"
    ), err


@pytest.mark.parametrize(
    ("notice", "silenced", "shown"),
    [
        # Under DDP Lightning advises sync_dist=True for every epoch-level value; the held-out
        # scores are summed over the processes by the module already (other values keep it).
        (
            "It is recommended to use `self.log({!r}, ..., sync_dist=True)` when logging on "
            "epoch level in distributed setting to accumulate the metric across devices.",
            ["val/loss", "test/bleu"],
            "train/loss",
        ),
        # The model summary's 32-bit size is right for a mixed precision's float32 weights.
        (
            "Precision {} is not supported by the model summary.  Estimated model size in MB "
            "will not be accurate. Using 32 bits instead.",
            ["bf16-mixed", "16-mixed"],
            "transformer-engine",
        ),
    ],
    ids=["sync_dist", "model_summary"],
)
def test_lightning_notices_that_do_not_apply_are_silenced(notice, silenced, shown):
    """``silence_lightning_notices`` drops these notices and keeps the same notice for others."""
    from seq2seq.cli.entry import silence_lightning_notices

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence_lightning_notices()
        for name in [*silenced, shown]:
            warnings.warn(notice.format(name), stacklevel=1)
    assert [str(w.message) for w in caught] == [notice.format(shown)]


def test_fit_ends_naming_its_best_and_last_checkpoints(multi30k_dir, tiny_cache, in_tmp, capsys):
    cli_main(
        [
            "fit", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(tiny_cache),
            "--checkpoint_dir", "run", "--trainer.max_steps", "4",
            "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
            "--trainer.logger", "false",
        ]
    )  # fmt: skip
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("checkpoints:")]
    best = re.fullmatch(
        r"checkpoints: run: best (\S+\.ckpt) \(val/bleu [\d.]+\), "
        r"last\.ckpt \(step 4\)",
        line,
    )
    assert best and (in_tmp / "run" / best[1]).is_file(), line


def test_a_score_on_part_of_a_set_says_so(tiny_run, multi30k_dir, monkeypatch, capsys):
    """tiny.yaml tests 2 batches (limit_test_batches 2): the printed score says how many of the
    set's sentences it covers."""
    monkeypatch.chdir(tiny_run)
    cli_main(
        [
            "test",
            "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--ckpt_path", "last",
            "--model.decoding.beam_size", "1",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    scored = [line for line in out.splitlines() if "scored on" in line]
    assert scored and scored[0].strip().endswith(
        "of the 1000 sentences (--trainer.limit_test_batches): not the whole set's score"
    ), out


def test_init_from_starts_a_new_run_from_a_checkpoints_weights(tiny_run, multi30k_dir, in_tmp):
    """fit --init_from: the checkpoint's model settings, SentencePiece model and weights (here
    kept unchanged by a zero learning rate), a fresh optimizer and step count; no SentencePiece
    model is trained. Not with a --ckpt_path of another run, nor for other commands."""
    source = tiny_run / "checkpoints/tiny/last.ckpt"
    saved = load_checkpoint(source)
    assert saved["global_step"] > 1
    cli = cli_main(
        [
            "fit", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir), "--data.cache_dir", "cache",
            "--init_from", str(source), "--checkpoint_dir", "finetuned",
            "--model.d_model", "48",  # the checkpoint's settings win (with a warning)
            "--model.optimizer.init_args.lr", "0.0", "--trainer.max_steps", "1",
            "--trainer.limit_val_batches", "0",
        ]
    )  # fmt: skip
    assert cli.trainer.global_step == 1
    state = cli.model.state_dict()
    for key, value in saved["state_dict"].items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=key)
    assert cli.datamodule.tokenizer.to_bytes() == cli.model.tokenizer.to_bytes()
    assert not list((in_tmp / "cache").glob("*.model"))  # the checkpoint's, none trained
    written = load_checkpoint(in_tmp / "finetuned/last.ckpt")
    assert written["global_step"] == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fit", "--ckpt_path", "x.ckpt"], "give either --ckpt_path .* or --init_from"),
        (["test", "--ckpt_path", "x.ckpt"], "--init_from is for fit"),
    ],
)
def test_init_from_is_refused_with_a_resume_or_outside_fit(
    tiny_run, in_tmp, monkeypatch, capsys, argv, message
):
    source = str(tiny_run / "checkpoints/tiny/last.ckpt")
    config = ["--config", str(CONFIGS / "tiny.yaml"), "--init_from", source]
    code, _, err = run_main(monkeypatch, capsys, argv[0], *config, *argv[1:])
    assert code == 2
    assert re.search(message, err[0]), err


@pytest.mark.parametrize("alias", ["best", "last"])
def test_init_from_an_alias_asks_for_the_file(in_tmp, monkeypatch, capsys, alias):
    """best and last name the new run's own (empty) checkpoint folder: one line saying so."""
    config = ["--config", str(CONFIGS / "tiny.yaml"), "--init_from", alias]
    code, out, err = run_main(monkeypatch, capsys, "fit", *config)
    assert code == 1 and out == ""
    assert len(err) == 1 and err[0].startswith(f"seq2seq: error: --init_from {alias}: "), err
    assert "needs the file of the checkpoint" in err[0]


def test_resuming_a_checkpoint_behind_its_folders_last_is_warned_about(tiny_run, capsys):
    """fit --ckpt_path with a checkpoint older than its folder's last.ckpt (best, say) writes
    over the later checkpoints: one warning line names both steps and --init_from."""
    from seq2seq.cli.checkpoint_args import warn_resuming_behind_last

    folder = tiny_run / "checkpoints/tiny"
    steps = {
        path: load_checkpoint(path, mmap=True)["global_step"]
        for path in folder.glob("*.ckpt")
        if path.name != "last.ckpt"
    }
    older = min(steps, key=steps.get)
    last_step = load_checkpoint(folder / "last.ckpt", mmap=True)["global_step"]
    assert steps[older] < last_step
    warn_resuming_behind_last(older, steps[older])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("seq2seq: warning: --ckpt_path ")
    assert f"is at step {steps[older]}, behind {folder / 'last.ckpt'} (step {last_step})" in err[0]
    assert "--init_from" in err[0]
    warn_resuming_behind_last(folder / "last.ckpt", last_step)
    assert capsys.readouterr().err == ""


def test_cpu_bfloat16_instructions_are_read_from_cpuinfo(tmp_path):
    from seq2seq.machine import cpu_has_bfloat16_instructions

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512bw avx512_vnni\n")
    assert cpu_has_bfloat16_instructions(cpuinfo) is False
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    assert cpu_has_bfloat16_instructions(cpuinfo) is True
    cpuinfo.write_text("flags\t\t: fpu amx_tile amx_bf16 amx_int8\n")
    assert cpu_has_bfloat16_instructions(cpuinfo) is True
    assert cpu_has_bfloat16_instructions(tmp_path / "missing") is None


@pytest.mark.parametrize(("has", "warned"), [(False, True), (True, False), (None, False)])
def test_bfloat16_on_a_cpu_without_its_instructions_is_warned_about(
    tiny_cache, multi30k_dir, tmp_path, monkeypatch, capsys, has, warned
):
    """bf16-mixed where the CPU emulates bfloat16 (no AVX512-BF16 or AMX): one warning line;
    none where it has them or where /proc/cpuinfo cannot tell."""
    from seq2seq import machine

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(machine, "cpu_has_bfloat16_instructions", lambda: has)
    code, _, err = run_main(
        monkeypatch, capsys, "validate", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(tiny_cache),
        "--ckpt_path", "untrained", "--trainer.limit_val_batches", "1",
        "--trainer.precision", "bf16-mixed",
    )  # fmt: skip
    assert code == 0, err
    lines = [line for line in err if "bfloat16 instructions" in line]
    expected = (
        "seq2seq: warning: --trainer.precision bf16-mixed on a CPU without bfloat16 "
        "instructions (no avx512_bf16 or amx_bf16 in /proc/cpuinfo): they are emulated and run "
        "several times slower than --trainer.precision 32-true"
    )
    assert lines == ([expected] if warned else []), err


def test_batch_counts_parse_as_integers_whatever_order_typing_cached():
    """``--trainer.limit_test_batches 1`` is one batch, ``1.0`` all of them, also where the
    annotation's union lists float first (typing caches unions by equality, so which order
    Lightning's annotation gets depends on what was imported before it)."""
    from lightning.pytorch.cli import LightningArgumentParser

    from seq2seq.cli.parser import batch_counts_parse_as_integers

    parser = LightningArgumentParser(exit_on_error=False)
    float_first = typing.Union[float, int, None]  # noqa: UP007 (the order is the point)
    parser.add_argument("--trainer.limit_test_batches", type=float_first, default=None)
    parser.add_argument("--trainer.overfit_batches", type=typing.Union[float, int], default=0.0)  # noqa: UP007
    batch_counts_parse_as_integers(parser)
    for given, expected in [("1", 1), ("1.0", 1.0), ("3", 3), ("0.25", 0.25)]:
        for name in ("limit_test_batches", "overfit_batches"):
            value = getattr(parser.parse_args([f"--trainer.{name}", given]).trainer, name)
            assert value == expected and type(value) is type(expected), (name, given, value)


def test_a_resumed_fit_continues_its_tensorboard_folder(tiny_cache, multi30k_dir, in_tmp):
    """fit --ckpt_path last logs into the version folder of the run it resumes, its steps
    continuing there (fairseq's TensorBoard folder continues too), not into version_1; the
    run's config.yaml stays, the resume's goes beside it, and so does that of a test into the
    folder (without a logger)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    argv = [
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir),
        "--data.cache_dir", str(tiny_cache),
    ]  # fmt: skip
    cli_main([*argv, "--trainer.max_steps", "10"])
    cli_main([*argv, "--trainer.max_steps", "20", "--ckpt_path", "last"])
    folder = in_tmp / "lightning_logs" / "tiny"
    assert sorted(p.name for p in folder.iterdir()) == ["version_0"]
    events = EventAccumulator(str(folder / "version_0"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [4, 9, 14, 19]
    assert [e.step for e in events.Scalars("val/bleu")] == [9, 19]
    from seq2seq.checkpoint.format import CHECKPOINT_KEY

    log = load_checkpoint(in_tmp / "checkpoints/tiny/last.ckpt")[CHECKPOINT_KEY]["log"]
    assert log == {"name": "tiny", "version": 0,
                   "checkpoint_dir": os.path.realpath(in_tmp / "checkpoints/tiny")}  # fmt: skip
    run = folder / "version_0"
    for _ in range(2):  # the second test's config beside the first's
        cli_main(["test", *argv[1:], "--ckpt_path", "last", "--trainer.logger", "false",
                  "--trainer.default_root_dir", str(run)])  # fmt: skip
    saved = {
        path.name: yaml.safe_load(path.read_text("utf-8"))
        for path in sorted(run.glob("config*.yaml"))
    }
    assert list(saved) == [
        "config.resumed-step10.yaml", "config.test-2.yaml", "config.test.yaml", "config.yaml"
    ]  # fmt: skip
    first_line = (run / "config.resumed-step10.yaml").read_text("utf-8").splitlines()[0]
    assert first_line.startswith("# the settings of fit --ckpt_path, resumed at step 10;")
    assert saved["config.yaml"]["trainer"]["max_steps"] == 10
    assert saved["config.resumed-step10.yaml"]["trainer"]["max_steps"] == 20
    assert str(saved["config.test.yaml"]["ckpt_path"]).endswith("last.ckpt")


def test_a_resume_under_another_logger_name_says_how_to_continue_the_runs_folder(capsys, tmp_path):
    """A resume without the run's --trainer.logger.init_args.name logs into a new version of
    the config's name: one warning names the run's folder and the flag that continues it."""
    from jsonargparse import Namespace

    from seq2seq.checkpoint.format import CHECKPOINT_KEY
    from seq2seq.cli.log_version import continue_log_version

    def config(name):
        logger = Namespace(
            class_path="lightning.pytorch.loggers.TensorBoardLogger",
            init_args=Namespace(save_dir="lightning_logs", name=name, version=None),
        )
        return Namespace(trainer=Namespace(logger=logger))

    checkpoint = {CHECKPOINT_KEY: {"log": {"name": "rt2", "version": 0}}}
    same = config("rt2")
    continue_log_version(same, checkpoint)
    assert same.trainer.logger.init_args.version == 0
    assert capsys.readouterr().err == ""
    other = config("multi30k_de_en")
    continue_log_version(other, checkpoint)
    assert other.trainer.logger.init_args.version is None
    assert capsys.readouterr().err == (
        "seq2seq: warning: the run being resumed logged to TensorBoard as rt2/version_0; this "
        "one logs as multi30k_de_en, in a new version: give --trainer.logger.init_args.name "
        "rt2 to continue the run's folder\n"
    )
    # resumed from a copy of the run's checkpoint folder: a new version, with a note; from the
    # folder itself, or from one moved away (its recorded folder gone), the run's version
    original, copy = tmp_path / "run", tmp_path / "run_copy"
    original.mkdir()
    log = {"name": "rt2", "version": 0, "checkpoint_dir": os.path.realpath(original)}
    checkpoint = {CHECKPOINT_KEY: {"log": log}}
    copied = config("rt2")
    continue_log_version(copied, checkpoint, copy / "last.ckpt")
    assert copied.trainer.logger.init_args.version is None
    assert capsys.readouterr().err == (
        f"seq2seq: note: {copy / 'last.ckpt'} is a copy of a checkpoint of "
        f"{os.path.realpath(original)}, whose run logs to TensorBoard as rt2/version_0: this "
        "run logs as rt2, in a new version\n"
    )
    for folder in (original, tmp_path / "moved"):
        if folder != original:
            log["checkpoint_dir"] = os.path.realpath(tmp_path / "gone")
        resumed = config("rt2")
        continue_log_version(resumed, checkpoint, folder / "last.ckpt")
        assert resumed.trainer.logger.init_args.version == 0
    assert capsys.readouterr().err == ""


def test_testing_another_folders_checkpoint_has_no_dirpath_notice(
    tiny_run, multi30k_dir, in_tmp, monkeypatch, capsys
):
    """ModelCheckpoint's "The dirpath has changed" concerns resuming; test writes no
    checkpoint, so it is not shown there."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_main(
            monkeypatch, capsys, "test", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(in_tmp / "cache"),
            "--ckpt_path", str(tiny_run / "checkpoints/tiny/last.ckpt"),
            "--trainer.limit_test_batches", "1",
        )  # fmt: skip
    assert code == 0, err
    shown = [*err, *(str(w.message) for w in caught)]
    assert not [line for line in shown if "dirpath has changed" in line], shown


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--temperature", "0"], "--temperature must be a finite number > 0, got 0.0"),
        (["--temperature", "inf"], "--temperature must be a finite number > 0, got inf"),
        (["--sampling_topp", "0"], r"--sampling_topp must lie in (0, 1] (1 = off), got 0.0"),
        (["--sampling_topp", "1.2"], r"--sampling_topp must lie in (0, 1] (1 = off), got 1.2"),
        (["--sampling_topk", "-1"], "--sampling_topk must be >= 0, got -1"),
        (["--n_samples", "0"], "--n_samples must be >= 1, got 0"),
        (["--no_repeat_ngram_size", "-2"], "--no_repeat_ngram_size must be >= 0, got -2"),
        (
            ["--sampling", "--beam_size", "4"],
            "--beam_size 4 with --sampling: sampling draws, it does not search; leave "
            "--beam_size out (or give 1)",
        ),
        (["--seed", "3", "--beam_size", "2"], "--beam_size 2 with --seed: sampling draws"),
        (
            ["--sampling_seed", "3", "--beam_size", "2"],
            "--beam_size 2 with --sampling_seed: sampling draws",
        ),
        (
            ["--n_samples", "2", "--n_best", "2"],
            "--n_best 2 with sampling: give --n_samples 2 for that many samples per sentence",
        ),
        (["--seed", "3", "--sampling_seed", "3"], "give --seed or --sampling_seed, not both"),
        (["--repetition_penalty", "0"], "--repetition_penalty must be a finite number > 0"),
        (["--prefix_file", "missing.txt"], "--prefix_file missing.txt: not found"),
        (["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    ],
)
def test_translate_refuses_bad_sampling_prefix_and_ngram_options(
    in_tmp, monkeypatch, capsys, extra, expected
):
    code, out, err = _translate_main(
        monkeypatch, capsys, b"Ein Hund.\n", "--ckpt_path", "m.ckpt", *extra
    )
    assert code == 2 and out == ""
    assert err[-1] == f"seq2seq translate: error: {expected}" or expected in err[-1], err
    assert err[-1].startswith("seq2seq translate: error: ")


def test_translate_samples_and_forces_prefixes_end_to_end(tiny_run, tmp_path, monkeypatch, capsys):
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    lines = ["Ein Hund läuft.", "", "Eine Frau singt.", "Zwei Männer spielen Fußball."]
    source = tmp_path / "in.de"
    source.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")

    def run(*extra, stdin=b""):
        code, out, err = _translate_main(monkeypatch, capsys, stdin, "--ckpt_path", ckpt, *extra)
        assert code == 0, (extra, err)
        return out.splitlines()

    sampled = ["--n_samples", "3", "--temperature", "1.5", "--input", str(source)]
    first = run(*sampled, "--seed", "1")
    rows = [line.split("\t") for line in first]
    assert [row[0] for row in rows] == [str(i) for i in range(4) for _ in range(3)]
    assert rows[3:6] == [["1", "0.0000", ""]] * 3  # the empty line
    assert all(float(row[1]) < 0 for row in rows[:3])
    assert run(*sampled, "--seed", "1") == first  # reproducible
    assert run(*sampled, "--seed", "2") != first
    # a line's samples are the same alone as inside the file
    alone = run(
        "--n_samples", "3", "--temperature", "1.5", "--seed", "1", stdin=b"Eine Frau singt.\n"
    )
    assert [line.split("\t")[1:] for line in alone] == [row[1:] for row in rows[6:9]]
    # one sample per line: plain lines, as without sampling
    assert len(run("--sampling", "--input", str(source))) == 4
    # prefixes: one per input line, each translation starts with its own
    prefixes = tmp_path / "prefix.en"
    prefixes.write_text("A dog\n\n\nTwo men\n", encoding="utf-8")
    forced = run("--beam_size", "1", "--prefix_file", str(prefixes), "--input", str(source))
    assert forced[0].startswith("A dog") and forced[3].startswith("Two men")
    assert forced[1] == ""
    plain = run("--beam_size", "1", "--input", str(source))
    assert forced[2] == plain[2] and not plain[0].startswith("A dog")
    assert len(run("--no_repeat_ngram_size", "2", "--input", str(source))) == 4
    short = tmp_path / "short.en"
    short.write_text("A dog\n", encoding="utf-8")
    code, out, err = _translate_main(
        monkeypatch,
        capsys,
        b"",
        "--ckpt_path",
        ckpt,
        "--input",
        str(source),
        "--prefix_file",
        str(short),
    )
    assert code == 2 and out == ""
    assert err[-1] == (
        f"seq2seq translate: error: --prefix_file {short} has 1 line but the input {source} "
        "has 4; give one prefix per input line (an empty line for none)"
    )


def test_translate_reads_translates_and_writes_in_parts(tiny_run, tmp_path, monkeypatch, capsys):
    """``--buffer_size N``: the input translated N lines at a time gives the output of all of
    it at once (n-best indices and prefixes counted over the whole input, cut lines named by
    their line in it); a prefix file of another length than stdin is refused as it is read."""
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    lines = ["Ein Hund läuft.", "", "Eine Frau singt.", "Zwei Männer spielen Fußball.", "Ja."]
    lines.append(" ".join(["Ein sehr langer Satz"] * 20))  # over max_positions: cut
    text = "".join(f"{line}\n" for line in lines).encode("utf-8")
    prefixes = tmp_path / "prefix.en"
    prefixes.write_text("A dog\n\n\nTwo men\n\nA\n", encoding="utf-8")
    options = [
        [],
        ["--beam_size", "2", "--n_best", "2"],
        ["--beam_size", "1", "--prefix_file", str(prefixes)],
        ["--n_samples", "2", "--temperature", "1.5", "--seed", "3"],
    ]
    for extra in options:
        outputs = []
        for buffer in ([], ["--buffer_size", "2"]):
            code, out, err = _translate_main(
                monkeypatch, capsys, text, "--ckpt_path", ckpt, *extra, *buffer
            )
            assert code == 0, (extra, buffer, err)
            assert any("input line 6 has " in line for line in err), err
            outputs.append(out)
        assert outputs[0] == outputs[1], extra
        assert outputs[0].count("\n") == len(lines) * (2 if "2" in extra else 1)
    nbest = [line.split("\t")[0] for line in outputs[0].splitlines()]
    assert nbest == [str(i) for i in range(len(lines)) for _ in range(2)]
    for written, count in (
        (["A dog"] * 2, "2 lines but the input <stdin> has more than 2"),
        (["A dog"] * 7, "more than 6 lines but the input <stdin> has 6"),
    ):
        prefixes.write_text("".join(f"{line}\n" for line in written), encoding="utf-8")
        code, out, err = _translate_main(
            monkeypatch,
            capsys,
            text,
            "--ckpt_path",
            ckpt,
            "--prefix_file",
            str(prefixes),
            "--buffer_size",
            "2",
        )
        assert code == 2, err
        assert err[-1] == (
            f"seq2seq translate: error: --prefix_file {prefixes} has {count}; give one prefix "
            "per input line (an empty line for none)"
        )  # fmt: skip


def test_translate_into_a_pipe_its_reader_leaves_ends_quietly(tiny_run, tmp_path):
    """``translate --buffer_size 1 ... | head -1``: once the reader has gone, translate stops
    with status 0 and no message, as with one part."""
    ckpt = tiny_run / "checkpoints/tiny/last.ckpt"
    source = tmp_path / "in.de"
    source.write_text("Ein Hund.\n" * 2000, encoding="utf-8")
    for buffer in ("1", "10000"):
        command = (
            f"{sys.executable} -m seq2seq.cli translate --ckpt_path {ckpt} --beam_size 1 "
            f"--input {source} --buffer_size {buffer} | head -1; exit ${{PIPESTATUS[0]}}"
        )
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stderr == "", (buffer, done.stderr[-2000:])
        assert len(done.stdout.splitlines()) == 1


def test_a_stop_mid_epoch_writes_no_checkpoint_named_with_an_older_score(
    tmp_path, multi30k_dir, tiny_cache, monkeypatch
):
    """Validation once per epoch and ``max_steps`` reached mid-epoch: the folder's scored
    checkpoints are those of validations only (Lightning's ``ModelCheckpoint`` saves at a
    training epoch's end by default there, with the last validation's score in a new step's
    name); the stop's state is in ``last.ckpt``."""
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["trainer"].update(val_check_interval=1.0, limit_train_batches=6, max_steps=9)
    config["trainer"]["callbacks"][0]["init_args"]["save_top_k"] = 3  # any score is kept
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    cli_main(
        [
            "fit", "--config", str(path), "--data.data_dir", str(multi30k_dir),
            "--data.cache_dir", str(tiny_cache),
        ]
    )  # fmt: skip
    names = sorted(p.name for p in (tmp_path / "checkpoints" / "tiny").iterdir())
    scored = [name for name in names if name != "last.ckpt"]
    assert "last.ckpt" in names
    assert scored and all("step=6" in name for name in scored), names
    assert load_checkpoint(tmp_path / "checkpoints" / "tiny" / "last.ckpt")["global_step"] == 9
