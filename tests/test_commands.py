"""``seq2seq average`` and ``seq2seq translate`` edge cases, the ``SEQ2SEQ_TRACEBACK`` switch
and the ``Translator`` API's argument check and n-best lists."""

from __future__ import annotations

import gzip
import itertools
import os
import re
from pathlib import Path

import pytest
import torch
from conftest import refuse_new_files, run_main

from seq2seq.checkpoint import CheckpointError, average_checkpoints, load_checkpoint

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


def test_average_refuses_checkpoints_of_other_initial_weights(tmp_path):
    """Checkpoints whose runs started from other weights (format.ORIGIN) are refused, naming
    both files, before anything is written; one origin, or none recorded, is averaged."""
    paths = {}
    for step, (name, origin) in enumerate(
        [("a", "1111"), ("b", "1111"), ("c", None), ("d", "2222")]
    ):
        path = _training_checkpoint(tmp_path / f"{name}.ckpt", float(step), 1_000_000)
        if origin is not None:
            checkpoint = torch.load(path)
            checkpoint["seq2seq"] = {"origin": origin}
            torch.save(checkpoint, path)
        paths[name] = path
    output = tmp_path / "avg.ckpt"
    with pytest.raises(CheckpointError) as error:
        average_checkpoints([paths["a"], paths["c"], paths["d"]], output)
    message = str(error.value)
    assert message.startswith(f"{paths['d']} and {paths['a']} come from runs of different initial")
    assert "origins 2222 and 1111" in message and not output.exists()
    average_checkpoints([paths["a"], paths["b"], paths["c"]], output)
    assert load_checkpoint(output)["seq2seq"]["origin"] == "1111"
    average_checkpoints([paths["c"], paths["d"]], output)  # c records none: not compared


def test_average_refuses_two_files_of_the_same_weights(run_dir):
    """last.ckpt beside the scored checkpoint of the same step: averaging both would weigh
    those weights double."""
    copy = run_dir / "last.ckpt"
    copy.write_bytes((run_dir / "epoch=4.ckpt").read_bytes())
    inputs = [run_dir / "epoch=3.ckpt", run_dir / "epoch=4.ckpt", copy]
    with pytest.raises(CheckpointError) as error:
        average_checkpoints(inputs, run_dir / "avg.ckpt")
    assert str(error.value) == (
        f"{copy} (step 4) holds the same weights as {run_dir / 'epoch=4.ckpt'} (step 4): "
        "averaging both would weigh them double; leave one out"
    )
    assert not (run_dir / "avg.ckpt").exists()
    # One step later, with an EMA that did not update in between: each file's own step
    checkpoint = torch.load(copy)
    checkpoint.update({"global_step": 5, "ema": {}})
    torch.save(checkpoint, copy)
    with pytest.raises(CheckpointError) as error:
        average_checkpoints(inputs, run_dir / "avg.ckpt")
    assert str(error.value).startswith(
        f"{copy} (step 5) holds the same weights as {run_dir / 'epoch=4.ckpt'} (step 4) (their "
        "EMA weights, which the steps between them did not update): averaging both"
    )


def test_average_keeps_tied_weights_one_tensor(tmp_path):
    """Weights tied under several names (shared embeddings and output projection) are one
    tensor in the average too, and the file holds them once, as the inputs do."""
    paths = []
    for i in range(2):
        tied = torch.full((64, 32), float(i))
        path = _training_checkpoint(tmp_path / f"{i}.ckpt", float(i), 1_000_000)
        checkpoint = torch.load(path)
        checkpoint["state_dict"].update({"embed": tied, "output": tied, "other": tied.clone()})
        torch.save(checkpoint, path)
        paths.append(path)
    output = average_checkpoints(paths, tmp_path / "avg.ckpt")
    state = torch.load(output)["state_dict"]
    assert state["embed"].eq(0.5).all() and state["other"].eq(0.5).all()
    assert (
        state["embed"].untyped_storage().data_ptr() == state["output"].untyped_storage().data_ptr()
    )
    assert (
        state["other"].untyped_storage().data_ptr() != state["embed"].untyped_storage().data_ptr()
    )
    assert output.stat().st_size < 2.5 * 64 * 32 * 4  # two tensors of 8 KiB, not three


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
        assert len(err) == 1, err
        assert "is one of the --inputs" in err[-1] and "give another file name" in err[-1]
    assert first.read_bytes() == before
    assert "optimizer_states" in load_checkpoint(first)


def test_average_replaces_only_its_own_output(run_dir, monkeypatch, capsys):
    """An existing --output is replaced only when seq2seq average wrote it: last.ckpt, a scored
    checkpoint or any other file there is refused and left as it was."""
    notes = run_dir.parent / "notes.txt"
    notes.write_text("not a checkpoint\n")
    inputs = ["--inputs", "ckpts/epoch=1.ckpt", "ckpts/epoch=2.ckpt"]
    for target, what in [
        (run_dir / "last.ckpt", "is a training checkpoint"),
        (run_dir / "epoch=4.ckpt", "is a training checkpoint"),
        (notes, "is not a checkpoint"),
    ]:
        before = target.read_bytes()
        code, out, err = run_main(monkeypatch, capsys, "average", *inputs, "--output", str(target))
        assert code == 2 and out == "", target
        assert f"--output {target} exists and {what}" in err[-1]
        assert "give another file name" in err[-1]
        assert target.read_bytes() == before
    code, _, err = run_main(monkeypatch, capsys, "average", *inputs, "--output", str(run_dir))
    assert code == 2 and "is a folder" in err[-1]
    # An earlier average's output is replaced.
    for _ in range(2):
        code, out, err = run_main(monkeypatch, capsys, "average", *inputs, "--output", "avg.ckpt")
        assert code == 0, err
    torch.testing.assert_close(
        load_checkpoint("avg.ckpt")["state_dict"]["w"], torch.full((3,), 1.5)
    )


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
    assert err[-1].endswith("; --last 4 averages those it holds")


_BLEU_KEY = (
    "ModelCheckpoint{'monitor': 'val/bleu', 'mode': 'max', 'every_n_train_steps': 0, "
    "'every_n_epochs': 1, 'train_time_interval': None}"
)


@pytest.mark.parametrize(
    ("bleus", "warned"),
    [((3.89, 20.5, 24.02), True), ((12.5, 20.5, 24.02), False), ((11.9, 20.5, 24.02), True)],
)
def test_average_dir_warns_when_the_recorded_scores_differ_widely(
    run_dir, monkeypatch, capsys, bleus, warned
):
    """The files taken are named with the val/bleu each recorded; one warning line when the
    worst is below half the best (a first-epoch checkpoint among later ones)."""
    # As ModelCheckpoint records them: every kept file with its score (current_score is the
    # last kept one's, that of another file in last.ckpt).
    paths = [run_dir / f"epoch={i}.ckpt" for i in (2, 3, 4)]
    kept = {str(p): torch.tensor(b) for p, b in zip(paths, bleus, strict=True)}
    for path in paths:
        checkpoint = torch.load(path, weights_only=True)
        checkpoint["callbacks"] = {
            _BLEU_KEY: {
                "monitor": "val/bleu",
                "current_score": torch.tensor(bleus[-1]),
                "best_k_models": {k: v for k, v in kept.items() if k <= str(path)},
            }
        }
        torch.save(checkpoint, path)
    argv = ["average", "--dir", str(run_dir), "--last", "3", "--output", "avg.ckpt"]
    code, out, err = run_main(monkeypatch, capsys, *argv)
    assert code == 0, err
    taken = [
        f"{run_dir / f'epoch={i}.ckpt'} (val/bleu {b:.2f})"
        for i, b in zip((2, 3, 4), bleus, strict=True)
    ]
    assert out == f"averaged 3 checkpoints into avg.ckpt: {', '.join(taken)}\n"
    if not warned:
        assert err == []
        return
    listed = ", ".join(f"epoch={i}.ckpt {b:.2f}" for i, b in zip((2, 3, 4), bleus, strict=True))
    assert err == [
        f"seq2seq: warning: the checkpoints to average differ widely in val/bleu (the worst, "
        f"{bleus[0]:.2f}, is below half the best, 24.02): {listed}; a weak checkpoint drags the "
        "average down, so average fewer (--last N) or name the good ones with --inputs"
    ]


def test_average_help_says_what_dir_leaves_out(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "average", "--help")
    assert code == 0
    assert "averaged checkpoints excluded" in " ".join(out.split())
    assert "the latest training steps, by the global_step each records" in " ".join(out.split())


def test_average_dir_takes_the_latest_training_steps_not_the_newest_files(
    run_dir, monkeypatch, capsys
):
    """After ``cp -r`` or ``touch`` the file times say nothing: --dir --last takes the
    checkpoints of the latest global_step. A link beside its target is taken once; a file that
    records no step counts as older than those that do, however new its time."""
    for i in range(1, 5):  # file times the reverse of the steps
        os.utime(run_dir / f"epoch={i}.ckpt", (2_000_000 - i, 2_000_000 - i))
    argv = ["average", "--dir", str(run_dir), "--output", "avg.ckpt", "--last"]
    code, out, err = run_main(monkeypatch, capsys, *argv, "3")
    assert code == 0, err
    steps = [str(run_dir / f"epoch={i}.ckpt") for i in (2, 3, 4)]
    assert load_checkpoint("avg.ckpt")["averaged_from"] == steps
    assert out == f"averaged 3 checkpoints into avg.ckpt: {', '.join(steps)}\n"
    (run_dir / "best.ckpt").symlink_to(run_dir / "epoch=4.ckpt")
    no_step = torch.load(run_dir / "epoch=1.ckpt", weights_only=True)
    del no_step["global_step"]
    no_step["state_dict"]["w"] = torch.full((3,), 0.5)  # the same weights twice are refused
    torch.save(no_step, run_dir / "no_step.ckpt")
    os.utime(run_dir / "no_step.ckpt", (3_000_000, 3_000_000))
    code, out, err = run_main(monkeypatch, capsys, *argv, "4")
    assert code == 0, err
    steps = [str(run_dir / f"epoch={i}.ckpt") for i in (1, 2, 3, 4)]
    assert load_checkpoint("avg.ckpt")["averaged_from"] == steps
    code, out, err = run_main(monkeypatch, capsys, *argv, "5")
    assert code == 0, err
    assert load_checkpoint("avg.ckpt")["averaged_from"] == [str(run_dir / "no_step.ckpt"), *steps]


def test_average_refuses_an_input_named_twice(run_dir, monkeypatch, capsys):
    """The same file twice in --inputs (by one name, another spelling or a link) would weigh it
    double: refused in one line naming it, before any checkpoint is read."""
    Path("link.ckpt").symlink_to(run_dir / "epoch=1.ckpt")
    first, other = "ckpts/epoch=1.ckpt", "ckpts/../ckpts/epoch=1.ckpt"
    for inputs, message in (
        ([first, "ckpts/epoch=2.ckpt", first], f"--inputs names {first} twice"),
        ([first, other], f"--inputs {first} and {other} are the same file"),
        (
            ["link.ckpt", "ckpts/epoch=2.ckpt", first],
            f"--inputs link.ckpt and {first} are the same file",
        ),
        (["missing.ckpt", "missing.ckpt"], "--inputs names missing.ckpt twice"),
    ):
        code, out, err = run_main(
            monkeypatch, capsys, "average", "--inputs", *inputs, "--output", "avg.ckpt"
        )
        assert code == 2 and out == "", err
        assert err[-1] == (
            f"seq2seq average: error: {message}; give each checkpoint once (averaging a file "
            "twice would weigh it double)"
        ), err
    assert not Path("avg.ckpt").exists()


def test_average_of_one_checkpoint_says_checkpoint(run_dir, monkeypatch, capsys):
    code, out, err = run_main(
        monkeypatch, capsys, "average", "--inputs", "ckpts/epoch=1.ckpt", "--output", "one.ckpt"
    )
    assert code == 0, err
    assert out == "averaged 1 checkpoint into one.ckpt: ckpts/epoch=1.ckpt\n"


@pytest.fixture(scope="module")
def other_tokenizer_blob(multi30k_dir, tmp_path_factory) -> torch.Tensor:
    """A SentencePiece model with as many pieces as the tiny run's (500), trained on English
    lines only, as the uint8 tensor a checkpoint carries."""
    from seq2seq.data.tokenizer import Tokenizer

    with gzip.open(multi30k_dir / "train.en.gz", "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in itertools.islice(f, 3000)]
    path = tmp_path_factory.mktemp("spm_en") / "en.model"
    data = Tokenizer.train(lines, path, vocab_size=500).to_bytes()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _variant(checkpoint: dict, path: Path, **seq2seq_entries) -> Path:
    """``checkpoint`` with some ``checkpoint["seq2seq"]`` entries replaced, saved to ``path``."""
    variant = dict(checkpoint)
    variant["seq2seq"] = {**checkpoint["seq2seq"], **seq2seq_entries}
    torch.save(variant, path)
    return path


def test_average_refuses_checkpoints_with_other_tokenizers_or_settings(
    tiny_run, other_tokenizer_blob, tmp_path, monkeypatch, capsys
):
    """Equal shapes are not enough: a vocabulary of the same size but other pieces, another
    activation or the other direction (one joint SentencePiece model serves both) makes the
    mean of the weights meaningless. The error names both files."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    last = tiny_run / "checkpoints/tiny/last.ckpt"
    checkpoint = load_checkpoint(last)
    assert not torch.equal(checkpoint["seq2seq"]["tokenizer"], other_tokenizer_blob)
    config = checkpoint["seq2seq"]["model_config"]
    other_vocab = _variant(checkpoint, tmp_path / "en_vocab.ckpt", tokenizer=other_tokenizer_blob)
    gelu = _variant(
        checkpoint, tmp_path / "gelu.ckpt", model_config={**config, "activation": "gelu"}
    )
    no_tokenizer = dict(checkpoint)
    no_tokenizer["seq2seq"] = {k: v for k, v in checkpoint["seq2seq"].items() if k != "tokenizer"}
    torch.save(no_tokenizer, tmp_path / "no_spm.ckpt")
    reversed_pair = dict(checkpoint)
    reversed_pair["datamodule_hyper_parameters"] = {
        **checkpoint["datamodule_hyper_parameters"],
        "src_lang": "en",
        "tgt_lang": "de",
    }
    torch.save(reversed_pair, tmp_path / "en_de.ckpt")
    cases = [
        (other_vocab, ["en_vocab.ckpt", "different SentencePiece models", "500 pieces"]),
        (tmp_path / "en_de.ckpt", ["en_de.ckpt", "other directions (en->de and de->en)"]),
        (gelu, ["gelu.ckpt", "other model settings", "activation: 'relu' in", "'gelu' in"]),
        (tmp_path / "no_spm.ckpt", ["no_spm.ckpt carries none"]),
    ]
    for other, expected in cases:
        with pytest.raises(CheckpointError) as info:
            average_checkpoints([last, other], tmp_path / "avg.ckpt")
        message = str(info.value)
        for part in [str(last), *expected]:
            assert part in message, (part, message)
        # The command: one line on stderr, status 1, no output file.
        code, out, err = run_main(
            monkeypatch, capsys, "average", "--inputs", str(last), str(other), "--output", "a.ckpt"
        )
        assert code == 1 and out == "" and len(err) == 1, err
        assert err[0].startswith("seq2seq: error: ") and str(other) in err[0], err
        assert not (tmp_path / "a.ckpt").exists() and not (tmp_path / "avg.ckpt").exists()
    # Dropout only acts in training: checkpoints that differ there average (weights of
    # another step of the run: the same weights twice are refused).
    later = dict(checkpoint)
    later["state_dict"] = {k: v * 1.01 if v.is_floating_point() else v for k, v in
                           checkpoint["state_dict"].items()}  # fmt: skip
    dropped = _variant(later, tmp_path / "dropout.ckpt", model_config={**config, "dropout": 0.3})
    assert average_checkpoints([last, dropped], tmp_path / "avg.ckpt").is_file()


def test_translate_n_best_writes_n_rows_for_empty_lines(tiny_run, monkeypatch, capsys):
    """An empty or blank input line gets n_best rows (empty text, score 0) like any other."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    source = "Ein Hund läuft.\n\nEine Frau singt.\n   \n".encode()
    for extra in ([], ["--scores"]):
        code, out, err = run_main(
            monkeypatch, capsys, "translate", "--ckpt_path", ckpt, "--beam_size", "3",
            "--n_best", "3", *extra, stdin=source,
        )  # fmt: skip
        assert code == 0, err
        rows = [line.split("\t") for line in out.splitlines()]
        assert [row[0] for row in rows] == [str(i) for i in range(4) for _ in range(3)], rows
        for blank in (1, 3):
            assert rows[3 * blank : 3 * blank + 3] == [[str(blank), "0.0000", ""]] * 3


def test_translate_takes_the_target_language_of_a_bilingual_model(tiny_run, monkeypatch, capsys):
    """--tgt_lang naming the language a model without language tokens translates into
    selects nothing and is no error; another language is one."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    source = "Ein Hund läuft.\n".encode()
    outputs = []
    for extra in ([], ["--tgt_lang", "en"]):
        code, out, err = run_main(monkeypatch, capsys, "translate", "--ckpt_path", ckpt, *extra,
                                  stdin=source)  # fmt: skip
        assert code == 0, err
        outputs.append(out)
    assert outputs[0] == outputs[1]
    code, out, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", ckpt, "--tgt_lang", "fr", stdin=source
    )
    assert code == 1 and err[-1].startswith(
        "seq2seq: error: tgt_lang='fr': this model has no target-language tokens; it translates "
        "into en alone (give en or leave tgt_lang out)"
    ), err


def test_translate_takes_the_length_settings_of_the_api(tiny_run, monkeypatch, capsys):
    """``--max_len_a/--max_len_b/--min_len/--length_penalty_form`` override the checkpoint's
    decoding settings as ``Translator.from_checkpoint`` does; bad values exit 2 first."""
    from seq2seq.translator import Translator

    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    lines = ["Ein Hund läuft über die Wiese.", "Eine Frau singt."]
    source = "".join(f"{line}\n" for line in lines).encode()
    settings = {"max_len_a": 0.0, "max_len_b": 6, "min_len": 6, "length_penalty_form": "gnmt"}
    argv = [f"--{k}={v}" for k, v in settings.items()]
    code, out, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", ckpt, "--beam_size", "2", "--scores",
        *argv, stdin=source,
    )  # fmt: skip
    assert code == 0, err
    api = Translator.from_checkpoint(ckpt, device="cpu", **settings)
    expected = api.translate(lines, beam_size=2, return_scores=True)
    assert out.splitlines() == [f"{hyps[0][1]:.4f}\t{hyps[0][0]}" for hyps in expected]
    default = Translator.from_checkpoint(ckpt, device="cpu")
    assert default.translate(lines, beam_size=2, return_scores=True) != expected
    for extra, message in [
        (["--min_len", "-1"], "--min_len must be >= 0, got -1"),
        (["--max_len_a", "inf"], "--max_len_a must be >= 0, got inf"),
        (
            ["--length_penalty_form", "none"],
            "--length_penalty_form must be 'fairseq' or 'gnmt', got 'none'",
        ),
    ]:
        code, out, err = run_main(
            monkeypatch, capsys, "translate", "--ckpt_path", ckpt, *extra, stdin=source
        )
        assert code == 2 and out == "", (extra, err)
        assert err[-1] == f"seq2seq translate: error: {message}", (extra, err)


def test_translator_takes_decoding_settings_per_call(tiny_run):
    """Translator.translate(..., max_len_b=..., min_len=..., length_penalty=...) decodes as a
    translator built with those settings; unknown or negative settings are refused."""
    from seq2seq.translator import Translator

    ckpt = tiny_run / "checkpoints/tiny/last.ckpt"
    lines = ["Ein Hund läuft über die Wiese.", "Eine Frau singt."]
    settings = {"max_len_a": 0.0, "max_len_b": 6, "min_len": 6, "length_penalty": 0.5}
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    for beam in (1, 2):
        expected = Translator.from_checkpoint(ckpt, device="cpu", **settings).translate(
            lines, beam_size=beam, return_scores=True
        )
        got = translator.translate(lines, beam_size=beam, return_scores=True, **settings)
        assert got == expected
        assert translator.translate(lines, beam_size=beam, return_scores=True) != expected
    with pytest.raises(ValueError, match=r"unknown decoding settings: \['num_beams'\]"):
        translator.translate(lines, num_beams=2)
    with pytest.raises(ValueError, match="^min_len must be >= 0, got -1$"):
        translator.translate(lines, min_len=-1)


def test_version_names_the_versions_that_decide_a_run(monkeypatch, capsys):
    from importlib.metadata import version

    for flag in ("--version", "-V"):
        code, out, err = run_main(monkeypatch, capsys, flag)
        assert code == 0 and err == [], err
        assert out.startswith(f"seq2seq {version('seq2seq')} (torch {torch.__version__}, "), out
        assert "lightning " in out and "sacrebleu " in out and len(out.splitlines()) == 1


def test_translator_n_best_lists_have_n_entries(tiny_run):
    from seq2seq.translator import Translator

    translator = Translator.from_checkpoint(tiny_run / "checkpoints/tiny/last.ckpt", device="cpu")
    sentences = ["", "Ein Hund läuft.", " ", "\u2060"]
    results = translator.translate(sentences, beam_size=3, n_best=3)
    assert [len(hyps) for hyps in results] == [3, 3, 3, 3]
    for i in (0, 2, 3):
        assert results[i] == [("", 0.0)] * 3
    assert translator.translate(sentences, beam_size=3) == ["", results[1][0][0], "", ""]
    scored = translator.translate(sentences, beam_size=3, return_scores=True)
    assert [hyps[0] for hyps in scored] == [hyps[0] for hyps in results]


def test_translator_translates_a_single_string_to_a_single_result(tiny_run):
    """``translate(text)`` returns that sentence's result alone (as Hugging Face pipelines do),
    not a list, and not one translation per character; lists behave as before."""
    from seq2seq.translator import Translator

    translator = Translator.from_checkpoint(tiny_run / "checkpoints/tiny/last.ckpt", device="cpu")
    text, other = "Ein Mann fährt Fahrrad.", "Ein Hund läuft."
    single = translator.translate(text, beam_size=2)
    assert isinstance(single, str) and [single] == translator.translate([text], beam_size=2)
    n_best = translator.translate(text, beam_size=2, n_best=2)
    assert n_best == translator.translate([text], beam_size=2, n_best=2)[0]
    assert len(n_best) == 2 and all(isinstance(t, str) for t, _ in n_best)
    assert translator.translate(text, beam_size=2, return_scores=True) == [n_best[0]]
    assert translator.translate("", beam_size=2) == ""  # nothing to translate: empty
    assert len(translator.translate((text, other), beam_size=1)) == 2
    with pytest.warns(UserWarning, match=r"^input line 1 has \d+ tokens") as record:
        assert isinstance(translator.translate("Hund " * 100, beam_size=1), str)
    assert len(record) == 1 and record[0].filename == __file__
    with pytest.raises(ValueError, match=r"^the sentence holds a line break \(\\n\): "):
        translator.translate(f"{text}\n{other}")
    with pytest.raises(TypeError, match=r"not bytes: decode the text first"):
        translator.translate(text.encode())
    # encode takes lists only: a string would be encoded character by character.
    with pytest.raises(TypeError, match=r"list of sentences.*encode\(\[text\]\)"):
        translator.encode(text)
    assert len(translator.encode([text])) == 1


@pytest.mark.parametrize("value", ["", "0", "false", "False", "no", "OFF", " off "])
def test_traceback_switch_off_values_keep_errors_to_one_line(value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEQ2SEQ_TRACEBACK", value)
    code, _, err = run_main(monkeypatch, capsys, "translate", "--ckpt_path", "nope.ckpt")
    assert code == 1
    assert err == [
        "seq2seq: error: checkpoint not found: nope.ckpt (SEQ2SEQ_TRACEBACK=1 shows where)"
    ]


def test_translate_names_a_missing_input_before_reading_the_checkpoint(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    argv = ["translate", "--ckpt_path", "nope.ckpt", "--input"]
    code, _, err = run_main(monkeypatch, capsys, *argv, "nope.de")
    assert code == 1
    assert err == [
        "seq2seq: error: --input nope.de: not found (a file, or - for stdin) "
        "(SEQ2SEQ_TRACEBACK=1 shows where)"
    ]
    code, _, err = run_main(monkeypatch, capsys, *argv, str(tmp_path))
    assert code == 1 and f"--input {tmp_path}: is a folder" in err[0]


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
@pytest.mark.parametrize(
    "command", [["translate"], ["export", "--format", "ctranslate2", "--output", "out"]]
)
def test_an_alias_without_a_folder_says_it_needs_one(alias, command, tmp_path, monkeypatch, capsys):
    """best and last without --checkpoint_dir: one line saying to give it (or a file)."""
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, *command, "--ckpt_path", alias)
    assert (code, out) == (2, "")
    assert err == [
        f"seq2seq {command[0]}: error: --ckpt_path {alias} needs --checkpoint_dir, the run's "
        "checkpoint folder (e.g. checkpoints/multi30k_de_en), or give the path of a "
        "checkpoint file"
    ]


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


def test_files_without_model_weights_are_refused_by_translate_average_and_the_api(
    run_dir, monkeypatch, capsys
):
    """A PyTorch file that holds no model (``{"a": 1}``, an empty ``state_dict``): one line
    naming it; average no longer writes an "average" of two empty checkpoints."""
    from seq2seq.translator import Translator

    for name, content in (("other.pt", {"a": 1}), ("empty.pt", {"state_dict": {}})):
        torch.save(content, name)
        torch.save(content, f"copy-{name}")
        expected = f"seq2seq: error: {name} holds no model weights (no state_dict)"
        for argv in (
            ["translate", "--ckpt_path", name],
            ["average", "--inputs", name, f"copy-{name}", "--output", "avg.ckpt"],
        ):
            code, out, err = run_main(monkeypatch, capsys, *argv, stdin=b"Ein Hund.\n")
            assert code == 1 and out == "" and len(err) == 1, err
            assert err[0].startswith(expected), err
        with pytest.raises(CheckpointError, match=f"{name} holds no model weights"):
            Translator.from_checkpoint(name, device="cpu")
    assert not Path("avg.ckpt").exists()


def test_average_refuses_an_output_it_cannot_write_before_reading_checkpoints(
    run_dir, monkeypatch, capsys
):
    """An --output that is a folder, or in a folder that cannot be written: refused up front
    (the --inputs here do not even exist, and the --dir holds no checkpoint), not after the
    checkpoints have been read."""
    (run_dir.parent / "locked").mkdir()
    (run_dir.parent / "bad").mkdir()
    (run_dir.parent / "bad" / "notes.ckpt").write_text("not a checkpoint\n")
    refuse_new_files(monkeypatch, "locked")  # as a read-only folder (chmod does not stop root)
    for output, expected in (
        (str(run_dir), f"--output {run_dir} is a folder; give a file name"),
        (
            "locked/avg.ckpt",
            "--output locked/avg.ckpt: no file can be written in folder locked (Permission denied)",
        ),
    ):
        for sources in (["--inputs", "missing1.ckpt", "missing2.ckpt"], ["--dir", "bad"]):
            if sources[0] == "--dir":
                sources += ["--last", "1"]
            code, out, err = run_main(monkeypatch, capsys, "average", *sources, "--output", output)
            assert code == 2 and out == "", err
            assert err[-1] == f"seq2seq average: error: {expected}", err
    with pytest.raises(IsADirectoryError, match="is a folder"):
        average_checkpoints(["missing1.ckpt"], run_dir)


def test_average_writes_through_a_temporary_file_of_its_own(run_dir, monkeypatch, capsys):
    """A user's avg.ckpt.tmp is left alone; a failed write leaves no temporary file."""
    Path("avg.ckpt.tmp").write_text("the user's notes\n")
    inputs = ["--inputs", "ckpts/epoch=1.ckpt", "ckpts/epoch=2.ckpt"]
    code, _, err = run_main(monkeypatch, capsys, "average", *inputs, "--output", "avg.ckpt")
    assert code == 0, err
    assert Path("avg.ckpt.tmp").read_text() == "the user's notes\n"
    before = Path("avg.ckpt").read_bytes()

    def fail(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", fail)
    code, _, err = run_main(monkeypatch, capsys, "average", *inputs, "--output", "avg.ckpt")
    assert code == 1 and "No space left on device" in err[-1], err
    assert Path("avg.ckpt").read_bytes() == before
    assert sorted(p.name for p in Path().iterdir()) == ["avg.ckpt", "avg.ckpt.tmp", "ckpts"]


def test_translate_refuses_an_unwritable_output_folder_before_reading_the_checkpoint(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "locked").mkdir()
    refuse_new_files(monkeypatch, "locked")  # as a read-only folder (chmod does not stop root)
    code, out, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", "no.ckpt", "--output", "locked/out.en"
    )
    assert code == 2 and out == ""
    assert err[-1] == (
        "seq2seq translate: error: --output locked/out.en: no file can be written in folder "
        "locked (Permission denied)"
    )


def test_translate_warns_of_a_cut_line_in_one_line(tiny_run, tmp_path, monkeypatch, capsys):
    """A line above max_positions is cut with a seq2seq warning line, as predict's are (a
    UserWarning through the Python API); the output file is written whole, and a user's
    ``<output>.tmp`` is left alone."""
    from seq2seq.translator import Translator

    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    Path("out.en.tmp").write_text("the user's notes\n")
    source = ("Ein Hund.\n" + "Hund " * 100 + "\n").encode()
    argv = ["translate", "--ckpt_path", ckpt, "--beam_size", "1", "--output", "out.en"]
    code, out, err = run_main(monkeypatch, capsys, *argv, stdin=source)
    assert code == 0 and out == "", err
    warning = (
        r"input line 2 has \d+ tokens \(with EOS\), more than the model's max_positions=64; "
        "truncated to 64"
    )
    assert len(err) == 1 and re.fullmatch(f"seq2seq: warning: {warning}", err[0]), err
    assert len(Path("out.en").read_text().splitlines()) == 2
    assert Path("out.en.tmp").read_text() == "the user's notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.en", "out.en.tmp"]
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    with pytest.warns(UserWarning, match=warning.replace("line 2", "line 1")) as record:
        translator.encode(["Hund " * 100])
    assert record[0].filename == __file__  # the caller's line, not the library's
    # Many cut lines: one warning for them all, naming the first ten and the longest.
    many = ["Hund " * (70 + i) for i in range(12)]
    with pytest.warns(UserWarning) as record:
        translator.translate(["Ein Hund."] + many, beam_size=1)
    assert len(record) == 1 and record[0].filename == __file__
    assert re.fullmatch(
        r"12 input lines \(lines 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, \.\.\.\) have more than the "
        r"model's max_positions=64 tokens \(with EOS\); truncated to 64 \(longest: line 13, "
        r"\d+ tokens\)",
        str(record[0].message),
    ), record[0].message


def test_translate_output_to_an_open_descriptor_continues_the_file(
    tiny_run, tmp_path, monkeypatch, capsys
):
    """--output /dev/fd/N (as /dev/stdout that the shell redirected to a log): the translations
    follow what the log held, and what is written after them follows them; the log is not
    replaced. A closed descriptor is refused in one line before the checkpoint is read."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs Linux /dev/fd")
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    Path("in.de").write_text("Ein Hund läuft.\nEine Frau singt.\n", encoding="utf-8")
    argv = ["translate", "--ckpt_path", str(tiny_run / "checkpoints/tiny/last.ckpt")]
    argv += ["--beam_size", "1", "--input", "in.de", "--output"]
    code, _, err = run_main(monkeypatch, capsys, *argv, "out.en")
    assert code == 0, err
    fd = os.open("log.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"line before\n")
        code, out, err = run_main(monkeypatch, capsys, *argv, f"/dev/fd/{fd}")
        os.write(fd, b"line after\n")
    finally:
        os.close(fd)
    assert code == 0 and out == "", err
    translations = Path("out.en").read_text(encoding="utf-8")
    assert Path("log.txt").read_text(encoding="utf-8") == (
        f"line before\n{translations}line after\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.de", "log.txt", "out.en"]
    code, out, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", "no.ckpt", "--output", f"/dev/fd/{fd}"
    )
    assert code == 2 and out == "", err
    assert err[-1] == (
        f"seq2seq translate: error: --output /dev/fd/{fd}: file descriptor {fd} is not open in "
        "this process"
    )


def test_every_decoding_field_is_a_translate_flag_and_a_model_decoding_key():
    """seq2seq translate and --model.decoding.* offer each DecodingConfig field, of its type,
    with the help of its Attributes documentation."""
    import dataclasses
    import typing

    import docstring_parser
    from jsonargparse import ArgumentParser

    from seq2seq.commands.parsing import Parser, plain
    from seq2seq.commands.translating import add_decoding_flags
    from seq2seq.module import TranslationModule
    from seq2seq.nn import DecodingConfig

    docs = {
        p.arg_name: p.description for p in docstring_parser.parse(DecodingConfig.__doc__).params
    }
    types = typing.get_type_hints(DecodingConfig)
    translate_flags = Parser(prog="t")
    add_decoding_flags(translate_flags)
    flags = {a.dest: a for a in translate_flags._actions}
    config = ArgumentParser()
    config.add_class_arguments(TranslationModule, "model")
    keys = {a.dest: a for a in config._actions}
    for field in dataclasses.fields(DecodingConfig):
        name, text = field.name, " ".join(plain(docs[field.name]).split())
        assert text, name
        flag = flags[name]
        assert flag.option_strings == [f"--{name}"] and flag.default is None
        assert flag.help == f"{text} (default: the checkpoint's model.decoding.{name})"
        if types[name] is bool:
            assert flag.const is True and flag.nargs == "?", name
        else:
            assert flag.type is types[name], name
        key = keys[f"model.decoding.{name}"]
        assert key.option_strings == [f"--model.decoding.{name}"]
        assert " ".join(plain(key.help).split()) == text, name
        assert key.default == getattr(DecodingConfig(), name)
    assert set(DecodingConfig.field_names()) <= set(flags)


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], None),
        (["--disable_unk"], True),
        (["--disable_unk", "true"], True),
        (["--disable_unk", "False"], False),
        (["--disable_unk", "no", "--beam_size", "2"], False),
    ],
)
def test_a_yes_no_translate_flag_alone_is_true_and_takes_false(argv, expected):
    """A bool decoding flag turns a checkpoint's setting on alone and off with ``false``."""
    from seq2seq.commands.parsing import Parser
    from seq2seq.commands.translating import add_decoding_flags

    parser = Parser(prog="seq2seq translate")
    add_decoding_flags(parser)
    assert parser.parse_args(argv).disable_unk is expected


def test_a_yes_no_translate_flag_refuses_other_words_and_sampling_false_with_its_field(
    capsys,
):
    from seq2seq.commands import translating

    with pytest.raises(SystemExit) as err:
        translating.translate(["--ckpt_path", "m.ckpt", "--disable_unk", "maybe"])
    assert err.value.code == 2
    assert capsys.readouterr().err.endswith(
        "seq2seq translate: error: argument --disable_unk: expected true or false, got 'maybe'\n"
    )
    with pytest.raises(SystemExit):
        translating.translate(
            ["--ckpt_path", "m.ckpt", "--sampling", "false", "--temperature", "0.5"]
        )
    assert capsys.readouterr().err.endswith(
        "seq2seq translate: error: --temperature applies to sampling, but --sampling false "
        "was given\n"
    )


def test_translate_sigterm_leaves_the_old_output_and_no_temporary_file(
    tiny_run, tmp_path, monkeypatch, capsys
):
    """A SIGTERM while ``translate --output`` writes: exit 143 with one line saying nothing is
    written, the earlier output as it was, no temporary file beside it; SIGTERM's handler is
    back to what it was afterwards."""
    import signal
    import threading

    from seq2seq.translator import Translator

    # pytest and its xdist workers run tests on the main thread, the one signals reach
    assert threading.current_thread() is threading.main_thread()
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    Path("in.de").write_text("Ein Hund läuft.\nEine Frau singt.\nZwei Männer.\n", encoding="utf-8")
    Path("out.en").write_text("the earlier translations\n", encoding="utf-8")
    translate, calls = Translator.translate, []

    def terminated_at_the_second_buffer(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return translate(self, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate", terminated_at_the_second_buffer)
    before = signal.getsignal(signal.SIGTERM)
    code, out, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path",
        str(tiny_run / "checkpoints/tiny/last.ckpt"), "--input", "in.de", "--output", "out.en",
        "--buffer_size", "1",
    )  # fmt: skip
    assert code == 143 and out == "", err
    assert len(calls) == 2
    assert err[-2:] == [
        "seq2seq: translate stopped: nothing is written to out.en, which is written whole or not "
        "at all (standard output takes each part as it is done)",
        "seq2seq: terminated (SIGTERM)",
    ]
    assert Path("out.en").read_text(encoding="utf-8") == "the earlier translations\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.de", "out.en"]
    assert signal.getsignal(signal.SIGTERM) == before
