"""The checkpoint format module: a leaf, one "which settings differ" function, no cycle."""

import ast
import subprocess
import sys
from pathlib import Path

import torch

from seq2seq.checkpoint import format as fmt

PACKAGE = Path(__file__).resolve().parents[1] / "seq2seq"


def _imports(path: Path) -> set[str]:
    """Every module a file imports (at any depth, lazy imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_format_module_imports_nothing_of_ours():
    assert not {n for n in _imports(PACKAGE / "checkpoint" / "format.py") if "seq2seq" in n}


def test_checkpoint_code_does_not_import_the_module_back():
    """seq2seq.module imports seq2seq.checkpoint; nothing there imports seq2seq.module (the
    former cycle), the translator or the command line."""
    for path in (PACKAGE / "checkpoint").glob("*.py"):
        ours = {n for n in _imports(path) if n.startswith("seq2seq")}
        assert not ours & {"seq2seq.module", "seq2seq.translator", "seq2seq.cli"}, path


def test_loading_checkpoints_imports_no_lightning():
    code = (
        "import sys; import seq2seq.checkpoint as c; c.load_checkpoint; c.average_checkpoints; "
        "print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert "lightning" not in eval(out.stdout)


def test_training_names_stay_importable_from_the_package():
    from seq2seq.checkpoint import AtomicCheckpointIO, capture_rng_state, restore_rng_state
    from seq2seq.checkpoint.training import AtomicCheckpointIO as direct

    assert AtomicCheckpointIO is direct
    state = capture_rng_state()
    first = torch.rand(3)
    restore_rng_state(state)
    assert torch.equal(torch.rand(3), first)


def test_differing_settings_leave_out_dropout_and_settings_one_side_lacks():
    saved = {"d_model": 256, "n_heads": 4, "dropout": 0.1, "activation": "relu"}
    wanted = {"d_model": 64, "n_heads": 4, "dropout": 0.3, "norm_first": False}
    assert fmt.differing_settings(saved, wanted) == [("d_model", 256, 64)]
    assert fmt.differing_settings(saved, saved) == []
    assert fmt.NON_STRUCTURAL == {"dropout", "attention_dropout", "activation_dropout"}


def test_tokenizer_blob_round_trip_and_language_pair():
    data = b"\x00serialized model\xff"
    checkpoint = {fmt.CHECKPOINT_KEY: {"tokenizer": fmt.tokenizer_tensor(data)}}
    assert fmt.tokenizer_blob(checkpoint) == data
    assert fmt.tokenizer_blob({}) is None and fmt.model_config({}) == {}
    pair = {"datamodule_hyper_parameters": {"src_lang": "de", "tgt_lang": "en"}}
    assert fmt.language_pair(pair) == ("de", "en")
    assert fmt.language_pair({}) is None
