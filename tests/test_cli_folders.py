"""A ``seq2seq`` command removes the folders it created and left empty (after an error too),
and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_main

from seq2seq.data.datamodule import TranslationDataModule

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _folders(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir())


def test_failing_fit_removes_the_empty_folders_it_created(in_tmp, monkeypatch, capsys):
    """fit creates its log and checkpoint folders (and default_root_dir) before reading data;
    when it then fails (here: no corpus), they are removed again."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    argv = [
        "fit",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", "nodata",
        "--data.download", "false",
        "--trainer.default_root_dir", "runs/tiny",
    ]  # fmt: skip
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 1 and "nodata" in err[-1], err
    assert _folders(in_tmp) == []
    # The same with the traceback shown (the error propagates from main).
    monkeypatch.setenv("SEQ2SEQ_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="nodata"):
        run_main(monkeypatch, capsys, *argv[:-2])
    assert _folders(in_tmp) == []


def test_failing_command_keeps_folders_that_existed_or_hold_files(in_tmp, monkeypatch, capsys):
    """Folders that existed before the command (empty or not) and folders the command created
    that hold a file are kept; only the command's own empty folders go."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    (in_tmp / "lightning_logs").mkdir()  # existed before, empty
    (in_tmp / "checkpoints").mkdir()
    (in_tmp / "checkpoints" / "notes.txt").write_text("keep\n", encoding="utf-8")

    def fail(self):  # runs after fit created its folders; leaves a file in one of them
        Path("checkpoints/tiny/file.txt").write_text("written\n", encoding="utf-8")
        raise OSError("cannot read the corpus")

    monkeypatch.setattr(TranslationDataModule, "prepare_data", fail)
    argv = [
        "fit",
        "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", "nodata",
        "--trainer.default_root_dir", "runs/tiny",
    ]  # fmt: skip
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 1 and "cannot read the corpus" in err[-1], err
    assert _folders(in_tmp) == ["checkpoints", "checkpoints/tiny", "lightning_logs"]
    assert (in_tmp / "checkpoints/notes.txt").is_file()
    assert (in_tmp / "checkpoints/tiny/file.txt").is_file()


@pytest.mark.slow  # three fit processes: ~16 s; CI runs the slow tier too
def test_fit_that_trains_nothing_leaves_no_empty_checkpoint_folder(in_tmp, multi30k_dir):
    """A successful command removes the folders it created that it left empty too: fit with
    max_steps 0 writes no checkpoint, and its checkpoint folder goes."""
    from seq2seq.cli import cli_main

    cli = cli_main(
        [
            "fit",
            "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--trainer.max_steps", "0",
        ]
    )  # fmt: skip
    assert cli.trainer.global_step == 0
    assert not (in_tmp / "checkpoints").exists()
    assert (in_tmp / "data/cache").is_dir()  # folders holding files stay
