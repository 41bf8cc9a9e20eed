"""Teacher-forced scores of given translations: Translator.score and seq2seq score."""

from __future__ import annotations

import math
import random
import warnings

import pytest
import torch
from conftest import multi30k_lines, run_main, write_lines

from seq2seq.nn import DecodingConfig, beam_search
from seq2seq.text_decoding import source_batch
from seq2seq.text_scoring import (
    LOGITS_BUDGET,
    forced_batch,
    pair_batches,
    token_log_probs,
)
from seq2seq.translator import Translator

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tiny_run):
    """The tiny run's checkpoint, its translator and 60 validation pairs."""
    ckpt = tiny_run / "checkpoints" / "tiny" / "last.ckpt"
    lines = {lang: multi30k_lines("val", lang, 60) for lang in ("de", "en")}
    return ckpt, Translator.from_checkpoint(ckpt, device="cpu"), lines


def _searched(model, translator, sources):
    """The 5 best hypotheses of a beam search of each of ``sources`` (no length penalty, at
    most 12 tokens), their source ids (one row each) and whether each ended with EOS (else
    the length limit cut it)."""
    tok = translator.tokenizer
    encoded = translator.encode(sources)
    batch = source_batch(encoded, tok.pad_id)
    config = DecodingConfig(length_penalty=0.0, max_len_a=0.0, max_len_b=12, beam_size=5)
    found = beam_search(
        model, batch["src"], batch["src_mask"], tok.bos_id, tok.eos_id, config, n_best=5
    )
    hyps = [hyp for nbest in found for hyp in nbest]
    rows = [ids for ids, nbest in zip(encoded, found, strict=True) for _ in nbest]
    return rows, hyps, [len(hyp.tokens) < 12 for hyp in hyps]


@pytest.mark.parametrize("ensemble", [False, True], ids=["model", "ensemble"])
def test_a_hypothesis_scores_what_the_search_scored_it(tiny, tmp_path, ensemble):
    """The teacher-forced log-probability of a beam search's hypothesis is the search's score
    of it (length penalty 0), ended or cut, for one model and for an ensemble (its
    renormalised mean)."""
    ckpt, translator, lines = tiny
    if ensemble:
        other = tmp_path / "other.ckpt"
        checkpoint = torch.load(ckpt, weights_only=False)
        torch.manual_seed(1)
        for value in checkpoint["state_dict"].values():
            if value.is_floating_point():
                value.add_(0.02 * torch.randn_like(value))
        torch.save(checkpoint, other)
        translator = Translator.from_checkpoint([ckpt, other], device="cpu")
    model = translator.model
    rows, hyps, ended = _searched(model, translator, lines["de"])
    assert 50 < sum(ended) < len(ended) - 50
    batch = forced_batch(rows, [h.tokens for h in hyps], translator.tokenizer)
    scores = token_log_probs(model, batch)
    assert [len(s) for s in scores] == [len(h.tokens) + 1 for h in hyps]
    # A hypothesis the limit cut has no EOS: its score is that of its tokens alone.
    forced = [sum(s if end else s[:-1]) for s, end in zip(scores, ended, strict=True)]
    torch.testing.assert_close(
        torch.tensor(forced, dtype=torch.float64),
        torch.tensor([h.score for h in hyps], dtype=torch.float64),
        atol=1e-4,
        rtol=0,
    )


def test_score_of_text_is_the_same_in_any_batching_and_order(tiny):
    """Pairs scored alone, in small batches or in one, in any order: each score is its own
    pair's, in its input place; the model's own translation scores above the reference on
    most sentences; bfloat16 within 0.3 nats of float32."""
    ckpt, translator, lines = tiny
    pairs = zip(lines["de"], lines["en"], strict=True)
    alone = [translator.score(s, t).log_prob for s, t in pairs]  # one pair: its score alone
    order = random.Random(0).sample(range(len(alone)), len(alone))
    translator.max_tokens = 24
    small = translator.score([lines["de"][i] for i in order], [lines["en"][i] for i in order])
    translator.max_tokens = 4096
    whole = translator.score(lines["de"], lines["en"])
    torch.testing.assert_close(torch.tensor([s.log_prob for s in whole]), torch.tensor(alone))
    torch.testing.assert_close(
        torch.tensor([s.log_prob for s in small]), torch.tensor([alone[i] for i in order])
    )
    assert all(s.pieces[-1] == "</s>" and s.log_prob < 0 for s in whole)
    own = translator.translate(lines["de"], beam_size=1)
    mine = translator.score(lines["de"], own)
    higher = sum(m.log_prob > w.log_prob for m, w in zip(mine, whole, strict=True))
    assert higher >= 0.9 * len(whole)
    bf16 = Translator.from_checkpoint(ckpt, device="cpu", dtype="bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # emulated bfloat16 on a CPU without its instructions
        low = bf16.score(lines["de"], lines["en"])
    torch.testing.assert_close(
        torch.tensor([s.log_prob for s in low]), torch.tensor(alone), atol=0.3, rtol=0
    )


def test_pair_batches_keep_to_both_budgets():
    lengths = [3, 9, 4, 30, 2, 7]
    batches = pair_batches(lengths, lengths[::-1], max_tokens=20, vocab_size=8)
    assert sorted(i for batch in batches for i in batch) == list(range(6))
    for batch in batches:
        longest = max(max(lengths[i], lengths[::-1][i]) for i in batch)
        assert len(batch) == 1 or len(batch) * longest <= 20
    vocab = LOGITS_BUDGET // 10  # ten target positions fit the logits' budget
    batches = pair_batches([2] * 6, [4] * 6, max_tokens=4096, vocab_size=vocab)
    assert [len(batch) for batch in batches] == [2, 2, 2]


def test_score_refuses_bad_input_and_scores_a_target_too_long_nan(tiny):
    _, translator, lines = tiny
    with pytest.raises(ValueError, match="3 sources but 2 targets"):
        translator.score(lines["de"][:3], lines["en"][:2])
    with pytest.raises(ValueError, match=r"targets\[1\] holds a line break"):
        translator.score(lines["de"][:2], ["a", "b\nc"])
    with pytest.raises(TypeError, match=r"targets\[0\] is int"):
        translator.score(lines["de"][:1], [3])
    long = " ".join(["Mann"] * translator.model.max_positions)
    with pytest.warns(UserWarning, match=r"1 target\(s\) of more .* score nan \(line\(s\) 11\)"):
        scores = translator.score(lines["de"][:2], [long, ""], first_line=11)
    assert math.isnan(scores[0].log_prob) and scores[0].pieces == ()
    assert scores[1].pieces == ("</s>",) and scores[1].log_prob < 0


def test_the_score_command_writes_a_score_per_line(tiny, tmp_path, monkeypatch, capsys):
    ckpt, translator, lines = tiny
    src = write_lines(tmp_path / "s.de.gz", lines["de"][:20], compress=True)
    tgt = write_lines(tmp_path / "s.en", lines["en"][:20])
    code, out, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(ckpt),
                              "--src", str(src), "--tgt", str(tgt))  # fmt: skip
    assert code == 0, err
    expected = [f"{s.log_prob:.4f}" for s in translator.score(lines["de"][:20], lines["en"][:20])]
    assert out.splitlines() == expected
    output = tmp_path / "scores.txt"
    code, _, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(ckpt),
                            "--src", str(src), "--tgt", str(tgt), "--output", str(output),
                            "--normalize", "--token_scores")  # fmt: skip
    assert code == 0, err
    rows = output.read_text(encoding="utf-8").splitlines()
    assert len(rows) == 20
    scores = translator.score(lines["de"][:20], lines["en"][:20])
    for row, score in zip(rows, scores, strict=True):
        mean, tokens = row.split("\t")
        pieces = [t.rsplit(":", 1) for t in tokens.split(" ")]
        assert [piece for piece, _ in pieces] == list(score.pieces)
        values = [float(value) for _, value in pieces]
        assert float(mean) == pytest.approx(sum(values) / len(values), abs=2e-4)


def test_the_score_command_refuses_files_of_other_lengths_or_bad_text(
    tiny, tmp_path, monkeypatch, capsys
):
    ckpt, _, lines = tiny
    src = write_lines(tmp_path / "s.de", lines["de"][:5])
    tgt = write_lines(tmp_path / "s.en", lines["en"][:4])
    code, _, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(ckpt),
                            "--src", str(src), "--tgt", str(tgt))  # fmt: skip
    assert code == 2
    assert f"--src {src} has 5 lines but --tgt {tgt} has 4" in err[-1]
    (tmp_path / "bad.en").write_bytes(b"A man.\nA caf\xe9.\nA dog.\nx\ny\n")
    output = tmp_path / "out.txt"
    code, _, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(ckpt),
                            "--src", str(src), "--tgt", str(tmp_path / "bad.en"),
                            "--output", str(output))  # fmt: skip
    assert code == 1 and "bad.en, line 2: invalid UTF-8" in err[-1]
    assert "Nothing is scored" in err[-1] and not output.exists()


def test_a_ctranslate2_folder_scores_as_its_checkpoint(tiny, tmp_path, monkeypatch, capsys):
    """seq2seq score of an exported folder: CTranslate2's score_batch, to 1e-4 of ours."""
    pytest.importorskip("ctranslate2")
    from seq2seq.export.ctranslate2 import export_ctranslate2

    ckpt, translator, lines = tiny
    folder = export_ctranslate2(ckpt, tmp_path / "ct2")
    src = write_lines(tmp_path / "s.de", lines["de"][:30])
    tgt = write_lines(tmp_path / "s.en", lines["en"][:29] + [" ".join(["Mann"] * 80)])
    scores = {}
    for path in (ckpt, folder):
        code, out, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(path),
                                  "--src", str(src), "--tgt", str(tgt))  # fmt: skip
        assert code == 0, err
        assert [
            line for line in err if "1 target(s) of more than" in line and "(line(s) 30)" in line
        ]
        scores[path] = [float(value) for value in out.splitlines()]
    assert len(scores[ckpt]) == 30 and math.isnan(scores[folder][-1])
    torch.testing.assert_close(
        torch.tensor(scores[folder][:-1]), torch.tensor(scores[ckpt][:-1]), atol=2e-4, rtol=0
    )
    one = Translator.from_checkpoint(str(folder)).score(lines["de"][0], lines["en"][0])
    assert one.log_prob == pytest.approx(scores[ckpt][0], abs=2e-4)
    code, _, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(folder), str(ckpt),
                            "--src", str(src), "--tgt", str(tgt))  # fmt: skip
    assert code == 2 and "a CTranslate2 folder runs alone" in err[-1]


def test_the_score_command_reads_stdin_and_pipes_once(tiny, tmp_path, monkeypatch, capsys):
    """stdin (``-``) and a FIFO, which cannot be read twice, are read once and held."""
    import os
    import threading

    ckpt, translator, lines = tiny
    src = write_lines(tmp_path / "s.de", lines["de"][:6])
    expected = [f"{s.log_prob:.4f}" for s in translator.score(lines["de"][:6], lines["en"][:6])]
    stdin = "".join(f"{line}\n" for line in lines["en"][:6]).encode()
    code, out, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(ckpt),
                              "--src", str(src), "--tgt", "-", stdin=stdin)  # fmt: skip
    assert code == 0 and out.splitlines() == expected, err
    fifo = tmp_path / "tgt.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(stdin))
    writer.start()
    code, out, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(ckpt),
                              "--src", str(src), "--tgt", str(fifo))  # fmt: skip
    writer.join(timeout=10)
    assert code == 0 and out.splitlines() == expected, err
    code, _, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(ckpt),
                            "--src", "-", "--tgt", "-", stdin=stdin)  # fmt: skip
    assert code == 2 and "both read stdin" in err[-1]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--device", "tpu"], "--device tpu: not a device"),
        (["--ckpt_path", "{ckpt}", "{ckpt}"], "is named twice in the ensemble"),
        (["--tgt", "missing.en"], "--tgt missing.en: not found"),
        (["--output", "{ckpt}"], "is the checkpoint; give another file name"),
        (["--output", "s.en"], "is the --tgt file; give another file name"),
    ],
)
def test_the_score_command_refuses_bad_flags_in_one_line(
    tiny, tmp_path, monkeypatch, capsys, flags, message
):
    ckpt, _, lines = tiny
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "s.de", lines["de"][:2])
    write_lines(tmp_path / "s.en", lines["en"][:2])
    argv = ["score", "--ckpt_path", str(ckpt), "--src", "s.de", "--tgt", "s.en"]
    argv += [flag.format(ckpt=ckpt) for flag in flags]
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 2 and message in err[-1], err


def test_score_names_the_list_and_entry_at_fault(tiny):
    _, translator, _ = tiny
    with pytest.raises(TypeError, match=r"sources\[1\] is NoneType, not a string"):
        translator.score(["a", None], ["b", "c"])
    with pytest.raises(TypeError, match="sources must be a list of str .* not NoneType"):
        translator.score(None, None)
    with pytest.raises(TypeError, match="targets must be a list of str .* not str"):
        translator.score(["a"], "b")  # one sentence is two str, not a list and a str


def test_a_stopped_score_says_what_is_written(tiny, tmp_path, monkeypatch, capsys):
    """Ctrl-C after a first part: stdout holds its scores and stderr says so, as translate;
    a file output is written whole or not at all."""
    from seq2seq.commands import scoring
    from seq2seq.translator import Translator as Scorer

    ckpt, _, lines = tiny
    src = write_lines(tmp_path / "s.de", lines["de"][:5])
    tgt = write_lines(tmp_path / "s.en", lines["en"][:5])
    real, calls = Scorer.score, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(scoring, "BUFFER_SIZE", 2)
    monkeypatch.setattr(Scorer, "score", interrupted)
    code, out, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(ckpt),
                              "--src", str(src), "--tgt", str(tgt))  # fmt: skip
    assert code == 130 and len(out.splitlines()) == 2
    assert "seq2seq: score stopped: the scores of the first 2 lines are written" in err[0], err
    calls.clear()
    output = tmp_path / "out.txt"
    code, out, err = run_main(monkeypatch, capsys, "score", "--ckpt_path", str(ckpt), "--src",
                              str(src), "--tgt", str(tgt), "--output", str(output))  # fmt: skip
    assert code == 130 and not output.exists()
    assert f"nothing is written to {output}, which is written whole or not at all" in err[0]
