"""Shared fixtures: the Multi30k corpus and one tiny trained run reused across tests."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def _multi30k_dir() -> Path:
    env = os.environ.get("SEQ2SEQ_MULTI30K")
    if env:
        return Path(env)
    return REPO.parent / "shared" / "data" / "multi30k"


MULTI30K = _multi30k_dir()


def _multi30k_hint() -> str:
    """Says where Multi30k was looked for and how to point the tests at it."""
    env = os.environ.get("SEQ2SEQ_MULTI30K")
    where = (
        f"SEQ2SEQ_MULTI30K={env}"
        if env
        else "SEQ2SEQ_MULTI30K is unset, so the tests look in ../shared/data/multi30k beside "
        "the checkout"
    )
    return (
        f"Multi30k not found: {MULTI30K / 'train.de.gz'} does not exist ({where}); set "
        "SEQ2SEQ_MULTI30K to the folder holding the Multi30k files (train.de.gz, val.en.gz, ...)"
    )


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def _needs_multi30k(item) -> bool:
    """Whether a collected test reads Multi30k: it uses the ``multi30k_dir`` fixture (directly
    or through another fixture such as ``tiny_run``), or its module imports ``MULTI30K``.
    Tests marked to be skipped do not count."""
    if item.get_closest_marker("skip") is not None:
        return False
    module = getattr(item, "module", None)
    return "multi30k_dir" in getattr(item, "fixturenames", ()) or hasattr(module, "MULTI30K")


def pytest_collection_finish(session):
    """Stops the run before any test when a selected test needs Multi30k and it is missing,
    with one message saying where it was looked for and how to point the tests at it
    (instead of a ``FileNotFoundError`` from every test that reads it).

    Raises:
        pytest.exit: with exit status 4 (``ExitCode.USAGE_ERROR``) in that case; never with
            ``--collect-only``.
    """
    if session.config.option.collectonly or (MULTI30K / "train.de.gz").is_file():
        return
    needing = [item.nodeid for item in session.items if _needs_multi30k(item)]
    if needing:
        pytest.exit(
            f"{_multi30k_hint()}. {len(needing)} selected test(s) use it, e.g. {needing[0]}.",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def quiet_cpu_trainer(root: Path, **kwargs):
    """A two-epoch CPU ``Trainer`` without logger, progress bar, summary or validation, whose
    batches come from the data module's own samplers (as the configs run)."""
    import lightning as L

    return L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
        default_root_dir=root,
        **kwargs,
    )


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """Folder with Multi30k task-1 raw files (``train.de.gz`` ...)."""
    if not (MULTI30K / "train.de.gz").is_file():
        pytest.fail(_multi30k_hint())
    return MULTI30K


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, multi30k_dir) -> Path:
    """Run ``seq2seq fit`` with configs/tiny.yaml once; returns the run's working folder.

    The folder holds ``checkpoints/tiny/last.ckpt``, ``lightning_logs/tiny/version_0`` and
    ``data/cache`` (the SentencePiece model).
    """
    from seq2seq.cli import cli_main

    workdir = tmp_path_factory.mktemp("tiny_run")
    previous = Path.cwd()
    os.chdir(workdir)
    try:
        cli_main(
            ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir)]
        )
    finally:
        os.chdir(previous)
    return workdir


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    """LightningCLI reads sys.argv; keep pytest's own arguments out of it."""
    monkeypatch.setattr("sys.argv", ["seq2seq"])


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run the test inside an empty temporary folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_main(monkeypatch, capsys, *argv: str, stdin: bytes | None = None):
    """``seq2seq ARGV`` (the console script's ``main``) in this process, optionally reading
    ``stdin``: (exit status, stdout, stderr lines)."""
    from seq2seq.cli import main

    monkeypatch.setattr("sys.argv", ["seq2seq", *argv])
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    try:
        code = main()
    except SystemExit as exit_info:
        code = exit_info.code
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


def other_batching_warning(name: str, value, saved) -> str:
    """Regular expression of the data module's warning on resuming mid-epoch with
    ``--data.NAME=VALUE`` where the checkpoint has ``SAVED`` (``None`` written ``null``)."""
    saved = "null" if saved is None else saved
    return (
        rf"^Resuming with --data\.{name}={value}, but the checkpoint was written with "
        rf"--data\.{name}={saved}: training continues with other batches than the "
        r"interrupted run would have had \(in the epoch under way, [^\n]*\)\.$"
    )


def refuse_new_files(monkeypatch, folder_name: str) -> None:
    """Make every folder named ``folder_name`` refuse new files, as a read-only folder does
    (permission bits do not stop root, who runs the tests in some environments): the trial
    and temporary files of :mod:`seq2seq.files` fail there with ``EACCES``."""
    import tempfile

    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).name == folder_name:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
