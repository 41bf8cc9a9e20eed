"""``seq2seq translate``'s usage errors: an input file given to --ckpt_path, LightningCLI's
dotted decoding options."""

from __future__ import annotations

import pytest
import torch
from conftest import run_main

from seq2seq.nn import DecodingConfig


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a checkpoint is loaded: these errors come before."""

    def load(*args, **kwargs):
        raise AssertionError("a checkpoint was loaded")

    monkeypatch.setattr("seq2seq.translator.Translator.from_checkpoint", load)
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)


def test_an_input_file_after_the_checkpoint_asks_for_input(tmp_path, monkeypatch, capsys):
    """``--ckpt_path main.ckpt in.de`` (forgot --input): one line naming the text file."""
    ckpt, text = tmp_path / "main.ckpt", tmp_path / "in.de"
    torch.save({"state_dict": {}}, ckpt)
    text.write_text("Ein Hund läuft.\nZwei Männer.\n", encoding="utf-8")
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    code, out, err = run_main(monkeypatch, capsys, "translate", "--ckpt_path", str(ckpt), str(text))
    assert (code, out) == (2, "")
    assert err == [
        f"seq2seq translate: error: --ckpt_path {text} is a text file, not a checkpoint; "
        f"to translate it, give --input {text}"
    ]


def test_a_text_file_in_the_ensemble_beside_an_input_names_the_input(
    tmp_path, monkeypatch, capsys, no_loading
):
    ckpt, text, source = tmp_path / "main.ckpt", tmp_path / "notes.txt", tmp_path / "in.de"
    torch.save({}, ckpt)
    text.write_text("notes\n", encoding="utf-8")
    source.write_text("Ein Hund.\n", encoding="utf-8")
    argv = ["translate", "--ckpt_path", str(ckpt), str(text), "--input", str(source)]
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 2
    assert err == [
        f"seq2seq translate: error: --ckpt_path {text} is a text file, not a checkpoint; "
        f"--input {source} is the text to translate"
    ]


def test_checkpoints_and_folders_are_not_taken_for_text(tmp_path, monkeypatch, capsys):
    """A zip or legacy pickle checkpoint and a folder (a CTranslate2 export) after the first
    entry pass the check; they reach the ensemble's own checks and the loader."""
    from seq2seq.commands.translating import _is_text_file

    legacy, current, folder = tmp_path / "legacy.ckpt", tmp_path / "new.ckpt", tmp_path / "ct2"
    torch.save({"a": torch.zeros(2)}, legacy, _use_new_zipfile_serialization=False)
    torch.save({"a": torch.zeros(2)}, current)
    folder.mkdir()
    (folder / "config.json").write_text("{}\n", encoding="utf-8")
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    for path in (legacy, current, folder, empty, tmp_path / "missing.ckpt"):
        assert not _is_text_file(path), path
    text = tmp_path / "in.de"
    text.write_text("a" + "Ü" * 70_000, encoding="utf-8")  # its first 64 KiB end inside a character
    assert _is_text_file(text)
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    argv = ["translate", "--ckpt_path", str(current), str(folder)]
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 2 and "is a folder (an exported CTranslate2 model?)" in err[-1], err


def test_a_single_text_file_keeps_the_loaders_message(tmp_path, monkeypatch, capsys):
    notes = tmp_path / "README.md"
    notes.write_text("# not a checkpoint\n", encoding="utf-8")
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    code, _, err = run_main(monkeypatch, capsys, "translate", "--ckpt_path", str(notes))
    assert code == 1 and "README.md is not a PyTorch checkpoint" in err[0], err


@pytest.mark.parametrize(
    ("given", "flag"),
    [
        ("--model.decoding.beam_size", "--beam_size"),
        ("--model.decoding.length_penalty", "--length_penalty"),
        ("--model.decoding.sampling_topp", "--sampling_topp"),
        ("--model.decoding.no_repeat_ngram_size=3", "--no_repeat_ngram_size"),
        ("--model.decoding.max-len-b", "--max_len_b"),
        ("--model.beam_size", "--beam_size"),
        ("--model.temperature", "--temperature"),
    ],
)
def test_lightning_decoding_options_point_to_translates_flags(
    monkeypatch, capsys, no_loading, given, flag
):
    """``seq2seq test``'s ``--model.decoding.X`` is ``--X`` here (the reverse of test's hint)."""
    assert flag.removeprefix("--") in DecodingConfig.field_names()
    code, out, err = run_main(monkeypatch, capsys, "translate", "--ckpt_path", "m.ckpt", given, "2")
    name = given.split("=", 1)[0]
    assert (code, out) == (2, "")
    assert err == [f"seq2seq translate: error: unrecognized option {name} (did you mean {flag}?)"]


def test_a_dotted_option_before_the_missing_ckpt_path_gets_the_hint(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "translate", "--model.decoding.beam_size", "2")
    assert code == 2
    assert err == [
        "seq2seq translate: error: the following arguments are required: --ckpt_path; "
        "--model.decoding.beam_size is not an option of this command (did you mean --beam_size?)"
    ]


def test_a_dotted_option_that_is_no_flag_gets_no_hint(monkeypatch, capsys):
    code, _, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", "m.ckpt", "--model.d_model", "8"
    )
    assert code == 2
    assert err == ["seq2seq translate: error: unrecognized option --model.d_model"]


def test_best_and_last_are_found_in_the_checkpoint_dir(tiny_run, monkeypatch, capsys):
    """``--ckpt_path best --checkpoint_dir DIR`` translates with the checkpoint the run's
    ModelCheckpoint recorded (as ``seq2seq test --ckpt_path best``), named on stderr; export
    finds it alike."""
    from seq2seq.checkpoint import resolve_ckpt_path

    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tiny_run)
    source = tiny_run / "in.de"
    source.write_text("Ein Hund läuft.\n", encoding="utf-8")
    folder = "checkpoints/tiny"
    best = resolve_ckpt_path("best", [folder])
    assert best.name != "last.ckpt"
    translations = {}
    for ckpt, extra in ((str(best), []), ("best", ["--checkpoint_dir", folder])):
        argv = ["translate", "--ckpt_path", ckpt, *extra, "--input", str(source)]
        code, out, err = run_main(monkeypatch, capsys, *argv)
        assert code == 0, err
        translations[ckpt] = out
    assert err[0] == f"seq2seq: --ckpt_path best: {best}"
    assert translations["best"] == translations[str(best)] and translations["best"].strip()
    pytest.importorskip("ctranslate2")
    argv = ["export", "--ckpt_path", "best", "--checkpoint_dir", folder, "--output", "ct2"]
    code, out, err = run_main(monkeypatch, capsys, *argv, "--format", "ctranslate2")
    assert code == 0 and err[0] == f"seq2seq: --ckpt_path best: {best}", err
    assert f"{best} to ct2 (ctranslate2)" in out
