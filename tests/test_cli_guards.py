"""Guards of the command line: ``test`` without test splits, two ``fit`` runs on one
checkpoint folder, a new ``fit`` over an earlier run's checkpoints, and evaluation with a
checkpoint whose model settings differ from the config's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import run_main

from seq2seq.checkpoint import load_checkpoint

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

_HOLD_LOCK = """
import os, sys
import filelock
lock = filelock.FileLock(sys.argv[1], timeout=0)
lock.acquire()
with open(sys.argv[1] + ".pid", "w") as pid:
    pid.write(f"{os.getpid()}\\n")
print("locked", flush=True)
sys.stdin.read()
"""


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_test_without_test_splits_is_one_line(tiny_run, in_tmp, multi30k_dir, monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "test",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir),
        "--data.test_splits", "[]",
        "--ckpt_path", str(tiny_run / "checkpoints/tiny/last.ckpt"),
    )  # fmt: skip
    assert code == 1, err
    assert err[-1] == (
        "seq2seq: error: test has nothing to score: --data.test_splits is empty; name the test "
        "split(s), e.g. --data.test_splits '[test]' (SEQ2SEQ_TRACEBACK=1 shows where)"
    )
    assert not any("Traceback" in line for line in err), err


def test_fit_names_a_missing_test_split_before_training(in_tmp, multi30k_dir, monkeypatch, capsys):
    """A typo in --data.test_splits stops fit at once, in the line test gives for it, before
    SentencePiece is trained: no cache, no checkpoint, no log folder."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    argv = _fit_argv(multi30k_dir, "--data.cache_dir", "cache", "--checkpoint_dir", "ckpts")
    code, _, err = run_main(
        monkeypatch, capsys, *argv, "--data.test_splits", "[test_2016_flickr, test_2018_flikr]"
    )
    assert code == 1, err
    assert err[-1].startswith(
        f"seq2seq: error: No de-en data for split 'test_2018_flikr' in {multi30k_dir}; looked "
        f"for: {multi30k_dir / 'test_2018_flikr.de'}, "
    ), err
    assert not any("Traceback" in line or "SentencePiece" in line for line in err), err
    assert sorted(p.name for p in in_tmp.iterdir()) == []

    code, _, test_err = run_main(
        monkeypatch, capsys, "test", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir), "--data.test_splits", "[test_2018_flikr]",
        "--ckpt_path", "untrained", "--data.cache_dir", "cache",
    )  # fmt: skip
    assert code == 1 and test_err[-1] == err[-1], test_err


def test_resume_advice_names_the_checkpoint_dir_of_the_run(
    in_tmp, multi30k_dir, tiny_cache, monkeypatch, capsys, caplog
):
    """A run given --checkpoint_dir is resumed with it: the messages that say how to resume
    (ended before its first validation, no best checkpoint yet, a new run over it) name it."""
    import logging

    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    caplog.set_level(logging.INFO)
    flags = "--ckpt_path last --checkpoint_dir ckpts/fr_en"
    argv = _fit_argv(multi30k_dir, "--checkpoint_dir", "ckpts/fr_en", cache=tiny_cache)
    argv += ["--data.test_splits", "[]"]
    code, _, err = run_main(monkeypatch, capsys, *argv, "--trainer.max_steps", "1")
    assert code == 0, err
    ended = [
        r.getMessage() for r in caplog.records if "before its first validation" in r.getMessage()
    ]
    assert len(ended) == 1, ended
    assert ended[0].endswith(f"ckpts/fr_en/last.ckpt: use {flags} added to the run's command")

    code, _, err = run_main(
        monkeypatch, capsys, "test", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir), "--checkpoint_dir", "ckpts/fr_en",
        "--ckpt_path", "best",
    )  # fmt: skip
    assert code == 1, err
    assert err[-1] == (
        "seq2seq: error: --ckpt_path best: ckpts/fr_en/last.ckpt records no best checkpoint (the "
        "run stopped before its first validation, or its ModelCheckpoint keeps none); use "
        f"{flags}, or resume the run (seq2seq fit {flags}) until it validates "
        "(SEQ2SEQ_TRACEBACK=1 shows where)"
    ), err

    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 1, err
    assert f"a new run there would replace its last.ckpt: resume it with {flags}, " in err[-1]


def _own_corpus_recipe() -> list[list[str]]:
    """The commands of the README's recipe for a corpus of one's own."""
    import shlex

    readme = (CONFIGS.parent / "README.md").read_text(encoding="utf-8")
    recipe = readme.split("For a corpus of your own", 1)[1]
    block = recipe.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line]


def test_readme_recipe_for_a_corpus_of_ones_own(in_tmp, multi30k_dir, monkeypatch, capsys):
    """The recipe trains fr->en into a checkpoint folder and a log folder of its own, on the
    languages, splits and several test sets it names (here with configs/tiny.yaml)."""
    import gzip

    fit, test = _own_corpus_recipe()
    assert fit[:2] == ["seq2seq", "fit"] and test[:2] == ["seq2seq", "test"]
    for flag in ("--data.src_lang", "--data.tgt_lang", "--checkpoint_dir"):
        assert flag in fit and flag in test
    assert "--trainer.logger.init_args.name" in fit
    assert fit[fit.index("--data.test_splits") + 1] == "[test_a,test_b]"
    sizes = {"train": 300, "dev": 10, "test_a": 5, "test_b": 5}
    source = {"train": "train", "dev": "val", "test_a": "val", "test_b": "test_2016_flickr"}
    for split, n in sizes.items():
        for lang, name in (("de", "fr"), ("en", "en")):
            with gzip.open(multi30k_dir / f"{source[split]}.{lang}.gz", "rt") as f:
                lines = [next(f) for _ in range(n)]
            (in_tmp / "my_corpus").mkdir(exist_ok=True)
            (in_tmp / "my_corpus" / f"{split}.{name}").write_text("".join(lines))

    def tiny(argv: list[str]) -> list[str]:
        argv = argv[1:]
        argv[argv.index("--config") + 1] = str(CONFIGS / "tiny.yaml")
        return argv

    code, _, err = run_main(monkeypatch, capsys, *tiny(fit), "--trainer.max_steps", "2")
    assert code == 0, err
    assert (in_tmp / "checkpoints/my_fr_en/last.ckpt").is_file()
    assert not (in_tmp / "checkpoints/tiny").exists()
    assert sorted(p.name for p in (in_tmp / "lightning_logs").iterdir()) == ["my_fr_en"]
    checkpoint = load_checkpoint(in_tmp / "checkpoints/my_fr_en/last.ckpt", mmap=True)
    assert checkpoint["datamodule_hyper_parameters"]["src_lang"] == "fr"
    argv = tiny(test)
    argv[argv.index("--ckpt_path") + 1] = "last"  # the 2-step run has no best checkpoint
    code, out, err = run_main(monkeypatch, capsys, *argv)
    assert code == 0, err
    assert "test_a" in out and "test_b" in out


def _fit_argv(multi30k_dir: Path, *extra: str, cache: Path | None = None) -> list[str]:
    """A 2-step tiny fit; with ``cache`` (``tiny_cache``) it trains no SentencePiece model."""
    return [
        "fit",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir),
        "--trainer.max_steps", "2",
        "--trainer.val_check_interval", "2",
        *(["--data.cache_dir", str(cache)] if cache else []),
        *extra,
    ]  # fmt: skip


def test_fit_refuses_a_checkpoint_folder_another_fit_writes_to(
    in_tmp, multi30k_dir, tiny_cache, monkeypatch, capsys
):
    """While another process holds the lock of checkpoints/tiny, fit stops before training
    with one line naming the folder and that process, and leaves the folder's files as they
    were; a smoke run (which writes no checkpoint) still runs. Once the holder has ended (here:
    killed, leaving its lock file behind), fit finds the folder free and, with the holder's
    checkpoints removed, trains and writes its checkpoints there."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    folder = in_tmp / "checkpoints" / "tiny"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"the other run's last.ckpt")
    (folder / "epoch=0-step=10.ckpt").write_bytes(b"the other run's best checkpoint")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(folder / ".seq2seq.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _files(folder)

        code, _, err = run_main(monkeypatch, capsys, *_fit_argv(multi30k_dir, cache=tiny_cache))
        assert code == 1, err
        assert err[-1].startswith(
            f"seq2seq: error: {folder.resolve()} is in use by another seq2seq fit "
            f"(pid {holder.pid})"
        ), err
        assert err[-1].endswith(
            "wait for it to end, or give this run another folder with --checkpoint_dir DIR "
            "(SEQ2SEQ_TRACEBACK=1 shows where)"
        ), err
        assert _files(folder) == before
        assert not (in_tmp / "lightning_logs").exists()  # the folders it made are removed

        code, _, err = run_main(
            monkeypatch,
            capsys,
            *_fit_argv(multi30k_dir, "--trainer.fast_dev_run", "true", cache=tiny_cache),
        )
        assert code == 0, err
        assert _files(folder) == before
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
        holder.stdin.close()

    assert (folder / ".seq2seq.lock.pid").read_text().strip() == str(holder.pid)  # left behind
    code, _, err = run_main(monkeypatch, capsys, *_fit_argv(multi30k_dir, cache=tiny_cache))
    assert code == 1, err  # not in use any more, but it holds the other run's checkpoints
    assert err[-1].startswith("seq2seq: error: checkpoints/tiny already holds"), err
    for name in ("last.ckpt", "epoch=0-step=10.ckpt"):
        (folder / name).unlink()
    code, _, err = run_main(monkeypatch, capsys, *_fit_argv(multi30k_dir, cache=tiny_cache))
    assert code == 0, err
    after = _files(folder)
    assert ".seq2seq.lock" not in after and ".seq2seq.lock.pid" not in after  # removed at end
    assert "last.ckpt" in after


def test_fit_in_a_new_folder_leaves_no_lock_and_no_warning(
    in_tmp, multi30k_dir, tiny_cache, recwarn
):
    """The lock file neither stays behind nor makes Lightning warn of a non-empty folder."""
    from seq2seq.cli import cli_main

    cli_main(_fit_argv(multi30k_dir, cache=tiny_cache))
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]
    names = sorted(p.name for p in (in_tmp / "checkpoints" / "tiny").iterdir())
    assert "last.ckpt" in names and not [n for n in names if n.startswith(".seq2seq.lock")]


def test_a_held_lock_stops_a_second_lock_and_is_released(tmp_path):
    from seq2seq.cli.run_folder import FolderLock

    first = FolderLock(tmp_path)
    first.acquire()
    assert (tmp_path / ".seq2seq.lock.pid").read_text().strip() == str(os.getpid())
    with pytest.raises(OSError, match=rf"{tmp_path} is in use by another seq2seq fit \(pid \d+\)"):
        FolderLock(tmp_path).acquire()
    first.release()
    assert list(tmp_path.iterdir()) == []
    second = FolderLock(tmp_path)
    second.acquire()
    second.release()


def _refusal(folder: str, held: str, clash: str) -> str:
    return (
        f"seq2seq: error: {folder} already holds the checkpoints of an earlier run ({held}); "
        f"{clash}, give the new run another folder with --checkpoint_dir DIR, or remove the "
        f".ckpt files from {folder} (SEQ2SEQ_TRACEBACK=1 shows where)"
    )


def test_a_new_fit_refuses_a_folder_with_an_earlier_runs_checkpoints(
    in_tmp, multi30k_dir, monkeypatch, capsys
):
    """fit without --ckpt_path (or with --ckpt_path last and no last.ckpt) over checkpoints
    stops in one line naming the folder, what it holds and the ways out, before it reads data
    or writes anything: no log folder, no data cache, no lock file."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    folder = in_tmp / "checkpoints" / "tiny"
    folder.mkdir(parents=True)
    torch.save({"global_step": 20}, folder / "last.ckpt")
    torch.save({"global_step": 10}, folder / "epoch=0-step=10.ckpt")
    (folder / "notes.txt").write_text("not a checkpoint")
    before = _files(folder)

    code, _, err = run_main(monkeypatch, capsys, *_fit_argv(multi30k_dir))
    assert code == 1, err
    assert err[-1] == _refusal(
        "checkpoints/tiny",
        "last.ckpt at step 20 and 1 other checkpoint",
        "a new run there would replace its last.ckpt: resume it with --ckpt_path last",
    ), err
    assert _files(folder) == before
    assert [p.name for p in in_tmp.iterdir()] == ["checkpoints"]

    (folder / "last.ckpt").unlink()
    before = _files(folder)
    code, _, err = run_main(monkeypatch, capsys, *_fit_argv(multi30k_dir, "--ckpt_path", "last"))
    assert code == 1, err
    assert err[-1] == _refusal(
        "checkpoints/tiny",
        "1 checkpoint, epoch=0-step=10.ckpt, and no last.ckpt",
        "a new run there would mix its checkpoints with them: resume from one with "
        "--ckpt_path FILE",
    ), err
    assert not [line for line in err if "training from scratch" in line]
    assert _files(folder) == before
    assert [p.name for p in in_tmp.iterdir()] == ["checkpoints"]


@pytest.mark.parametrize("ckpt_path", ["last", "best", "checkpoints/tiny/last.ckpt"])
def test_resuming_into_the_runs_own_folder_is_not_refused(
    ckpt_path, tiny_run, in_tmp, multi30k_dir, monkeypatch, capsys
):
    """fit --ckpt_path last, best or a file trains on in the folder that holds the run."""
    shutil.copytree(tiny_run / "checkpoints", in_tmp / "checkpoints")
    cache = str(tiny_run / "data" / "cache")  # the run's SentencePiece model
    argv = [*_fit_argv(multi30k_dir, "--data.cache_dir", cache, "--ckpt_path", ckpt_path)]
    argv[argv.index("--trainer.max_steps") + 1] = "22"  # the tiny run stopped at 20
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 0, err
    folder = in_tmp / "checkpoints" / "tiny"
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == 22
    assert not (folder / ".seq2seq.lock").exists()


def test_checkpoint_dir_moves_a_run_and_its_best_and_last(
    tiny_run, in_tmp, multi30k_dir, monkeypatch, capsys
):
    """--checkpoint_dir starts a second run beside a folder holding another one, resumes it
    there, and --ckpt_path best / last of the evaluation commands look there too; a config
    without a ModelCheckpoint refuses it in one line."""
    shutil.copytree(tiny_run / "checkpoints", in_tmp / "checkpoints")
    first = _files(in_tmp / "checkpoints" / "tiny")
    cache = ["--data.cache_dir", str(tiny_run / "data" / "cache")]
    argv = [*_fit_argv(multi30k_dir, *cache, "--checkpoint_dir", "runs/second")]
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 0, err
    second = in_tmp / "runs" / "second"
    assert load_checkpoint(second / "last.ckpt")["global_step"] == 2
    assert _files(in_tmp / "checkpoints" / "tiny") == first  # the other run is untouched

    argv[argv.index("--trainer.max_steps") + 1] = "4"
    code, _, err = run_main(monkeypatch, capsys, *argv, "--ckpt_path", "last")
    assert code == 0, err
    assert load_checkpoint(second / "last.ckpt")["global_step"] == 4
    assert _files(in_tmp / "checkpoints" / "tiny") == first

    # Resuming that run's file without --checkpoint_dir would write over the first run.
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    resume = [*_fit_argv(multi30k_dir, *cache, "--ckpt_path", "runs/second/last.ckpt")]
    code, _, err = run_main(monkeypatch, capsys, *resume)
    assert code == 1, err
    assert err[-1] == (
        "seq2seq: error: checkpoints/tiny already holds the checkpoints of another run "
        "(last.ckpt at step 20 and 1 other checkpoint); the run resumed from "
        "runs/second/last.ckpt would replace its last.ckpt: continue it in the checkpoint's "
        "own folder with --checkpoint_dir runs/second or in another one with --checkpoint_dir "
        "DIR, or remove the .ckpt files from checkpoints/tiny (SEQ2SEQ_TRACEBACK=1 shows where)"
    ), err
    assert _files(in_tmp / "checkpoints" / "tiny") == first

    from seq2seq.cli import cli_main

    common = ["--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir)]
    common += [*cache, "--checkpoint_dir", "runs/second"]
    cli = cli_main(["validate", *common, "--ckpt_path", "last"])
    assert Path(cli.config["validate"]["ckpt_path"]).resolve() == second / "last.ckpt"
    cli = cli_main(["validate", *common, "--ckpt_path", "best"])
    assert Path(cli.config["validate"]["ckpt_path"]).resolve().parent == second

    code, _, err = run_main(
        monkeypatch, capsys, *_fit_argv(multi30k_dir, "--trainer.callbacks", "[]",
                                        "--checkpoint_dir", "runs/third")
    )  # fmt: skip
    assert code == 1, err
    assert err[-1] == (
        "seq2seq: error: --checkpoint_dir runs/third: the config has no ModelCheckpoint in "
        "trainer.callbacks whose folder it could set (SEQ2SEQ_TRACEBACK=1 shows where)"
    )
    assert not (in_tmp / "runs" / "third").exists()


def test_resuming_with_another_seed_is_refused_before_any_data_is_prepared(
    tiny_run, in_tmp, multi30k_dir, monkeypatch, capsys
):
    """A saved training position needs its --data.seed: fit --ckpt_path with another one
    stops in one line before SentencePiece is trained or the corpus tokenised."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    shutil.copytree(tiny_run / "checkpoints", in_tmp / "checkpoints")
    ckpt = in_tmp / "checkpoints" / "tiny" / "last.ckpt"
    argv = _fit_argv(multi30k_dir, "--data.cache_dir", "fresh_cache", "--data.seed", "7")
    code, _, err = run_main(monkeypatch, capsys, *argv, "--ckpt_path", "last")
    assert code == 1, err
    assert err[-1] == (
        f"seq2seq: error: {ckpt.relative_to(in_tmp)}: The checkpoint was written with "
        "--data.seed=1, but this run has --data.seed=7: the batches that follow cannot be "
        "reproduced; resume with --data.seed=1. (SEQ2SEQ_TRACEBACK=1 shows where)"
    ), err
    assert sorted(p.name for p in in_tmp.iterdir()) == ["checkpoints"]


def test_resuming_with_another_model_is_refused_before_any_data_is_prepared(
    tiny_run, in_tmp, multi30k_dir, monkeypatch, capsys
):
    """fit --ckpt_path with other model settings than the checkpoint's stops in one line
    naming them, before SentencePiece is trained or the corpus tokenised."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    shutil.copytree(tiny_run / "checkpoints", in_tmp / "checkpoints")
    ckpt = in_tmp / "checkpoints" / "tiny" / "last.ckpt"
    argv = _fit_argv(multi30k_dir, "--data.cache_dir", "fresh_cache", "--model.d_model", "64")
    argv += ["--data.vocab_size", "600", "--model.dropout", "0.3"]  # dropout may change
    code, _, err = run_main(monkeypatch, capsys, *argv, "--ckpt_path", "last")
    assert code == 1, err
    assert err[-1] == (
        f"seq2seq: error: {ckpt.relative_to(in_tmp)} was trained with other model settings "
        "than the config: data.vocab_size 500 (config 600), model.d_model 32 (config 64); "
        "training resumes only with the checkpoint's (give the config it was trained with); "
        "--ckpt_path last took it from checkpoints/tiny, the config's checkpoint folder: a run "
        "started with --checkpoint_dir DIR resumes with --checkpoint_dir DIR "
        "(SEQ2SEQ_TRACEBACK=1 shows where)"
    ), err
    assert not [line for line in err if "warning" in line], err  # no log version continued
    assert sorted(p.name for p in in_tmp.iterdir()) == ["checkpoints"]


def _warnings(err: list[str]) -> list[str]:
    return [line for line in err if line.startswith("seq2seq: warning:")]


def test_evaluation_warns_of_the_model_settings_the_checkpoint_overrides(
    tiny_run, in_tmp, multi30k_dir, monkeypatch, capsys
):
    """test with a checkpoint whose architecture differs from the config's (flags here) warns
    once, naming each setting with both values; the checkpoint's architecture is used, and
    the decoding settings of the flags, which are not warned about."""
    from seq2seq.cli import cli_main

    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    common = ["--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir)]
    decoding = ["--model.decoding.beam_size", "1", "--model.decoding.length_penalty", "0.6"]
    decoding += ["--model.decoding.max_len_b", "3", "--model.val_beam_size", "3"]
    cli = cli_main(
        [
            "test", *common, "--ckpt_path", ckpt, *decoding,
            "--model.d_model", "64", "--model.n_heads", "4", "--model.norm_first", "false",
            "--model.positional", "rotary", "--data.vocab_size", "600",
            "--model.dropout", "0.3",  # no effect outside training
        ]
    )  # fmt: skip
    assert _warnings(capsys.readouterr().err.splitlines()) == [
        f"seq2seq: warning: {ckpt} was trained with other model settings than the config: "
        "data.vocab_size 500 (config 600), model.d_model 32 (config 64), model.n_heads 2 "
        "(config 4), model.norm_first true (config false), model.positional sinusoidal "
        "(config rotary); test uses the checkpoint's"
    ]
    config = cli.model.model_config
    assert (config["d_model"], config["n_heads"], config["vocab_size"]) == (32, 2, 500)
    assert (config["norm_first"], config["positional"]) == (True, "sinusoidal")
    decoded = cli.model.decoding
    assert (decoded.beam_size, decoded.length_penalty, decoded.max_len_b) == (1, 0.6, 3)
    assert cli.model.hparams.decoding == decoded.to_dict()

    cli_main(["validate", *common, "--ckpt_path", ckpt, *decoding])
    assert _warnings(capsys.readouterr().err.splitlines()) == []


def test_ctrl_c_while_the_libraries_are_imported_is_one_line(monkeypatch, capsys):
    """The console script reports a Ctrl-C that lands while seq2seq.cli (PyTorch, Lightning)
    is being imported in one line with exit status 130, not an import traceback."""
    import importlib.abc

    from seq2seq import console

    class CtrlC(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "seq2seq.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "seq2seq.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [CtrlC(), *sys.meta_path])
    assert console.main() == 130
    assert capsys.readouterr().err == "seq2seq: interrupted\n"


def test_warnings_of_seq2seq_are_one_line_each(tiny_run, in_tmp, multi30k_dir, monkeypatch, capsys):
    """A warning of seq2seq's own code reaches the console as one ``seq2seq: warning:`` line
    (no file, line number or source line), and Python's own warning display is restored."""
    shown = warnings.showwarning
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    code, _, err = run_main(
        monkeypatch, capsys, "validate", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(tiny_run / "data/cache"),
        "--ckpt_path", ckpt, "--data.max_tokens", "20",
    )  # fmt: skip
    assert code == 0, err
    budget = [line for line in err if "is below what" in line]
    assert len(budget) == 1, err
    assert budget[0].startswith("seq2seq: warning: --data.max_tokens=20 is below what "), err
    assert budget[0].endswith(
        "Raise --data.eval_max_tokens (unset, it follows max_tokens) to at least "
        f"{budget[0].split('the longest: ')[1].split()[0]} (held-out sentences are never "
        "dropped)."
    )
    assert not [line for line in err if "UserWarning" in line or "datamodule.py" in line], err
    assert warnings.showwarning is shown


def test_the_command_line_reads_the_checkpoint_once(
    tiny_run, in_tmp, multi30k_dir, monkeypatch, capsys
):
    """validate --ckpt_path last: the command line reads the checkpoint file once for its
    checks, model settings, language pair and SentencePiece model (Lightning then loads the
    weights itself)."""
    from seq2seq.cli import checkpoint_args

    reads: list[str] = []
    real = checkpoint_args.load_checkpoint

    def counting(path, **kwargs):
        reads.append(os.path.realpath(path))
        return real(path, **kwargs)

    monkeypatch.setattr(checkpoint_args, "load_checkpoint", counting)
    code, _, err = run_main(
        monkeypatch, capsys, "validate",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir),
        "--data.cache_dir", str(tiny_run / "data/cache"),
        "--checkpoint_dir", str(tiny_run / "checkpoints/tiny"),
        "--ckpt_path", "last", "--trainer.limit_val_batches", "1",
    )  # fmt: skip
    assert code == 0, err
    assert reads == [os.path.realpath(tiny_run / "checkpoints/tiny/last.ckpt")]


def test_one_callback_not_in_a_list_is_read_as_a_list():
    # `--trainer.callbacks=SomeCallback` gives one callback, not a list of them.
    from jsonargparse import Namespace

    from seq2seq.cli.checkpoint_args import checkpoint_dirs

    one = Namespace(
        class_path="lightning.pytorch.callbacks.ModelCheckpoint",
        init_args=Namespace(dirpath="ckpts/run"),
    )
    assert checkpoint_dirs(Namespace(trainer=Namespace(callbacks=one))) == [Path("ckpts/run")]
    other = Namespace(class_path="seq2seq.callbacks.EMA", init_args=Namespace(decay=0.9))
    assert checkpoint_dirs(Namespace(trainer=Namespace(callbacks=other))) == []


def test_fit_of_the_default_sizes_from_fresh_weights_says_so(in_tmp, monkeypatch, capsys):
    """A config that names no model sizes (a fine-tuning config given no --init_from) trains
    the default Transformer from fresh weights: one warning line says so, before any data is
    read; a config naming its sizes gets none."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    sizes = ["--model.d_model", "512", "--model.n_heads", "8", "--model.d_ff", "2048"]
    sizes += ["--model.n_encoder_layers", "6", "--model.n_decoder_layers", "6"]
    missing = ["--data.data_dir", "nothere", "--data.download", "false"]
    code, _, err = run_main(monkeypatch, capsys, *_fit_argv(Path("unused"), *sizes, *missing))
    assert code == 1 and "nothere" in err[-1], err
    assert _warnings(err) == [
        "seq2seq: warning: fit trains a new model of the default sizes (d_model 512, 6 + 6 "
        "layers, d_ff 2048) from fresh weights, as the config names none; to fine-tune a "
        "pretrained model give --init_from CHECKPOINT"
    ]
    code, _, err = run_main(monkeypatch, capsys, *_fit_argv(Path("unused"), *missing))
    assert code == 1 and _warnings(err) == [], err
