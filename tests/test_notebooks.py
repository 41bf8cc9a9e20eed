"""The notebooks are stored without outputs and run from top to bottom on tiny settings."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["attention.ipynb", "quickstart.ipynb"]


def _execute(name: str, workdir: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    # Kernels talk over Unix sockets in a folder of their own: TCP ports are chosen free, closed
    # and bound again by the kernel, and another xdist worker's kernel can take one in between.
    # mkdtemp, not tmp_path, keeps the socket paths under the 107-byte limit of AF_UNIX.
    sockets = tempfile.mkdtemp(prefix="kernel-")
    try:
        kernel = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=f"{sockets}/k")
        client = NotebookClient(
            notebook, km=kernel, timeout=300, resources={"metadata": {"path": str(workdir)}}
        )
        client.execute()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    return notebook


def _outputs(notebook: nbformat.NotebookNode) -> list[dict]:
    return [output for cell in notebook.cells for output in cell.get("outputs", [])]


def _text(notebook: nbformat.NotebookNode) -> str:
    parts = []
    for output in _outputs(notebook):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.parametrize("name", NAMES)
def test_stored_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


def test_attention_notebook(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("SEQ2SEQ_CKPT", str(tiny_run / "checkpoints" / "tiny" / "last.ckpt"))
    notebook = _execute("attention.ipynb", tmp_path)
    images = [output for output in _outputs(notebook) if "image/png" in output.get("data", {})]
    assert len(images) == 4  # cross, encoder self, decoder self attention; positions
    assert "decoder.0.cross" in _text(notebook)


def test_attention_notebook_with_rotary_positions(tiny_run, multi30k_dir, tmp_path, monkeypatch):
    """A rotary model has no position table: the notebook says so instead of failing."""
    from seq2seq.cli import cli_main

    monkeypatch.chdir(tmp_path)
    cli_main(
        [
            "fit",
            "--config", str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--data.cache_dir", str(tiny_run / "data" / "cache"),
            "--model.positional", "rotary",
            "--trainer.max_steps", "2",
            "--trainer.val_check_interval", "2",
            "--trainer.limit_val_batches", "1",
        ]
    )  # fmt: skip
    monkeypatch.setenv("SEQ2SEQ_CKPT", str(tmp_path / "checkpoints" / "tiny" / "last.ckpt"))
    notebook = _execute("attention.ipynb", tmp_path)
    images = [output for output in _outputs(notebook) if "image/png" in output.get("data", {})]
    assert len(images) == 3  # attention maps only
    assert "rotary positions: no position table to show" in _text(notebook)


def test_quickstart_notebook(tiny_run, multi30k_dir, tmp_path, monkeypatch):
    # The notebook caches under ../data/cache; reuse the tiny run's SentencePiece model and
    # tokenised corpus (same settings), so the test does not train SentencePiece again.
    shutil.copytree(tiny_run / "data" / "cache", tmp_path / "data" / "cache")
    workdir = tmp_path / "notebooks"
    workdir.mkdir()
    monkeypatch.setenv("SEQ2SEQ_MULTI30K", str(multi30k_dir))
    monkeypatch.setenv("SEQ2SEQ_QUICKSTART_STEPS", "10")
    monkeypatch.setenv("SEQ2SEQ_QUICKSTART_SENTENCES", "10")
    notebook = _execute("quickstart.ipynb", workdir)
    text = _text(notebook)
    assert "10 steps, training loss" in text
    assert "BLEU = " in text and "chrF2 = " in text
    assert (workdir / "lightning_logs" / "quickstart" / "quickstart.ckpt").is_file()
