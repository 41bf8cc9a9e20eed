"""``seq2seq average`` and ``seq2seq translate`` edge cases, the ``SEQ2SEQ_TRACEBACK`` switch
and the ``Translator`` API's argument check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import run_main

from seq2seq.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]


def _training_checkpoint(path: Path, value: float, mtime: float) -> Path:
    """A small checkpoint shaped like one of ``seq2seq fit`` (weights and training state)."""
    checkpoint = {
        "state_dict": {"w": torch.full((3,), value), "steps": torch.tensor([7])},
        "optimizer_states": [{"state": {}}],
        "loops": {},
        "global_step": int(value),
    }
    torch.save(checkpoint, path)
    os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def run_dir(tmp_path, monkeypatch) -> Path:
    """A checkpoint folder: four scored checkpoints (w = 1, 2, 3, 4, oldest first) and
    last.ckpt (w = 100, newest); the test runs in ``tmp_path``."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "ckpts"
    folder.mkdir()
    for i in range(1, 5):
        _training_checkpoint(folder / f"epoch={i}.ckpt", float(i), 1_000_000 + i)
    _training_checkpoint(folder / "last.ckpt", 100.0, 1_000_010)
    return folder


def test_average_refuses_an_output_that_is_an_input(run_dir, monkeypatch, capsys):
    first = run_dir / "epoch=1.ckpt"
    before = first.read_bytes()
    link = run_dir.parent / "link.ckpt"
    link.symlink_to(first)
    for inputs, output in [
        ([str(first), str(first)], str(first)),
        (["ckpts/epoch=2.ckpt", str(first)], "ckpts/../ckpts/epoch=1.ckpt"),  # another spelling
        ([str(link)], str(first)),  # the same file through a link
    ]:
        code, out, err = run_main(
            monkeypatch, capsys, "average", "--inputs", *inputs, "--output", output
        )
        assert code == 2 and out == "", (inputs, output)
        assert err[0].startswith("usage: seq2seq average")
        assert "is one of the --inputs" in err[-1] and "give another file name" in err[-1]
    assert first.read_bytes() == before
    assert "optimizer_states" in load_checkpoint(first)


def test_average_dir_skips_its_output_and_averaged_checkpoints(run_dir, monkeypatch, capsys):
    argv = ["average", "--dir", str(run_dir), "--last", "3"]
    output = run_dir / "avg.ckpt"
    newest = [str(run_dir / f"epoch={i}.ckpt") for i in (2, 3, 4)]
    # Run twice with the same --output, then into another file beside it: each time the
    # three newest training checkpoints, never avg.ckpt (the output, or an averaged one).
    for target in (output, output, run_dir / "avg2.ckpt"):
        code, out, err = run_main(monkeypatch, capsys, *argv, "--output", str(target))
        assert code == 0, err
        assert out.startswith(f"averaged 3 checkpoints into {target}: ")
        averaged = load_checkpoint(target)
        assert averaged["averaged_from"] == newest
        torch.testing.assert_close(averaged["state_dict"]["w"], torch.full((3,), 3.0))
        assert "optimizer_states" not in averaged
    # Too few left once last.ckpt and the averaged files are set aside: the error names them.
    code, out, err = run_main(monkeypatch, capsys, *argv[:-1], "5", "--output", "other.ckpt")
    assert code == 2 and out == ""
    assert "holds 4 checkpoint file(s) to average" in err[-1]
    assert "(avg2.ckpt, avg.ckpt)" in err[-1] or "(avg.ckpt, avg2.ckpt)" in err[-1]


def test_average_help_says_what_dir_leaves_out(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "average", "--help")
    assert code == 0
    assert "averaged checkpoints excluded" in " ".join(out.split())


def test_average_of_one_checkpoint_says_checkpoint(run_dir, monkeypatch, capsys):
    code, out, err = run_main(
        monkeypatch, capsys, "average", "--inputs", "ckpts/epoch=1.ckpt", "--output", "one.ckpt"
    )
    assert code == 0, err
    assert out == "averaged 1 checkpoint into one.ckpt: ckpts/epoch=1.ckpt\n"


def test_translator_refuses_a_single_string(tiny_run):
    from seq2seq.translator import Translator

    translator = Translator.from_checkpoint(tiny_run / "checkpoints/tiny/last.ckpt", device="cpu")
    text = "Ein Mann fährt Fahrrad."
    for call in (translator.translate, translator.encode):
        with pytest.raises(TypeError, match=r"list of sentences.*translate\(\[text\]\)"):
            call(text)
    assert len(translator.translate([text], beam_size=1)) == 1
    assert len(translator.translate((text, text), beam_size=1)) == 2


@pytest.mark.parametrize("value", ["", "0", "false", "False", "no", "OFF", " off "])
def test_traceback_switch_off_values_keep_errors_to_one_line(value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEQ2SEQ_TRACEBACK", value)
    code, _, err = run_main(monkeypatch, capsys, "translate", "--ckpt_path", "nope.ckpt")
    assert code == 1
    assert err == [
        "seq2seq: error: checkpoint not found: nope.ckpt (SEQ2SEQ_TRACEBACK=1 shows where)"
    ]


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "2"])
def test_traceback_switch_on_values_raise(value, tmp_path, monkeypatch, capsys):
    from seq2seq.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEQ2SEQ_TRACEBACK", value)
    monkeypatch.setattr("sys.argv", ["seq2seq", "translate", "--ckpt_path", "nope.ckpt"])
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        main()


def test_traceback_switch_off_keeps_argument_errors_brief(monkeypatch, capsys):
    monkeypatch.setenv("SEQ2SEQ_TRACEBACK", "0")
    config = str(REPO / "configs" / "tiny.yaml")
    code, _, err = run_main(monkeypatch, capsys, "fit", "--config", config, "--model.d_modle", "6")
    assert code == 2
    assert err[-1].startswith("For the full list of options run: seq2seq fit --help"), err
    assert "usage:" not in "\n".join(err), err


@pytest.mark.parametrize("alias", ["best", "last"])
def test_translate_with_an_alias_says_it_needs_a_file(alias, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, "translate", "--ckpt_path", alias)
    assert code == 1 and out == ""
    assert len(err) == 1, err
    assert err[0].startswith(f"seq2seq: error: checkpoint not found: {alias}; ")
    assert "--config in seq2seq fit/validate/test/predict" in err[0]
    assert "checkpoints/multi30k_de_en/last.ckpt" in err[0]


def test_translate_with_a_file_named_like_an_alias_reads_it(tmp_path, monkeypatch, capsys):
    """A file called ``best`` in the working folder is a checkpoint path, not an alias."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "best").write_text("not a checkpoint\n")
    code, _, err = run_main(monkeypatch, capsys, "translate", "--ckpt_path", "best")
    assert code == 1 and "best is not a PyTorch checkpoint" in err[0]


def test_cpu_trainer_piece_names_the_cpus_where_bf16_pays_off():
    """configs/trainer/cpu.yaml and README agree: AVX512-BF16 or AMX."""
    comment = " ".join(
        line.lstrip("# ")
        for line in (REPO / "configs/trainer/cpu.yaml").read_text().splitlines()
        if line.startswith("#")
    )
    readme = (REPO / "README.md").read_text()
    for name in ("AVX512-BF16", "AMX"):
        assert name in readme and name in comment, name
    assert "only with AMX" not in comment
