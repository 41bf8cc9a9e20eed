from types import SimpleNamespace

import pytest
import sacrebleu
import torch

from seq2seq.checkpoint.format import AVERAGED_FROM, checkpoint_label
from seq2seq.evaluation import (
    HeldOutScores,
    corpus_scores,
    gather_in_order,
    score_table,
    write_lines,
    write_report,
)

HYPS = ["A man rides a bike .", "Two dogs play in the snow.", "A woman sings"]
REFS = ["A man is riding a bike.", "Two dogs are playing in the snow.", "A woman is singing."]


def test_scores_equal_sacrebleu_and_carry_signatures():
    scores = corpus_scores(HYPS, REFS)
    assert scores["bleu"].value == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert scores["chrf"].value == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert scores["ter"].value == pytest.approx(sacrebleu.corpus_ter(HYPS, [REFS]).score)
    signature = scores["bleu"].signature
    for part in ("nrefs:1", "case:mixed", "eff:no", "tok:13a", "smooth:exp", "version:"):
        assert part in signature


def test_chrfpp_is_sacrebleus_chrf_with_word_bigrams_and_only_on_request():
    """``chrfpp``: sacreBLEU's ``CHRF(word_order=2)`` (chrF++), its score line and signature as
    sacreBLEU prints them (``chrF2++ = ...``, ``nw:2``); the default metrics leave it out."""
    score = corpus_scores(HYPS, REFS, ["chrfpp"])["chrfpp"]
    expected = sacrebleu.corpus_chrf(HYPS, [REFS], word_order=2)
    assert (score.name, score.value, score.text) == ("chrfpp", expected.score, str(expected))
    assert score.text.startswith("chrF2++ = ")
    assert "|nc:6|nw:2|" in score.signature
    assert score.value != corpus_scores(HYPS, REFS, ["chrf"])["chrf"].value
    assert list(corpus_scores(HYPS, REFS)) == ["bleu", "chrf", "ter"]
    with pytest.raises(ValueError, match=r"unknown metric 'chrf\+\+'; choose from .*chrfpp"):
        corpus_scores(HYPS, REFS, ["chrf++"])


def test_target_language_selects_sacrebleu_tokenizer():
    assert (
        "tok:zh" in corpus_scores(["我爱你"], ["我爱你"], ["bleu"], tgt_lang="zh")["bleu"].signature
    )


def test_length_mismatch_and_empty_set_are_refused():
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        corpus_scores(HYPS[:2], REFS)
    with pytest.raises(ValueError, match="empty"):
        corpus_scores([], [])


def test_gather_in_order_sorts_and_removes_duplicates():
    items = [(2, "c", "C"), (0, "a", "A"), (1, "b", "B"), (2, "c", "C")]
    assert gather_in_order(items) == [(0, "a", "A"), (1, "b", "B"), (2, "c", "C")]


def test_write_lines_keeps_alignment(tmp_path):
    path = write_lines(tmp_path / "sub" / "hyps.txt", ["one", "two\nlines", ""])
    assert path.read_text(encoding="utf-8") == "one\ntwo lines\n\n"


def test_write_lines_goes_through_a_temporary_file_of_its_own(tmp_path):
    """A user's ``<file>.tmp`` is left alone, and a failed write (here, into a folder, and a
    line that is no string) leaves no temporary file behind and the previous file as it was."""
    path = tmp_path / "hyps.txt"
    (tmp_path / "hyps.txt.tmp").write_text("the user's notes\n")
    write_lines(path, ["one"])
    assert (tmp_path / "hyps.txt.tmp").read_text() == "the user's notes\n"
    with pytest.raises(AttributeError):
        write_lines(path, ["two", None])
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError):
        write_lines(tmp_path / "folder", ["three"])
    assert path.read_text() == "one\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "hyps.txt", "hyps.txt.tmp"]
    assert list((tmp_path / "folder").iterdir()) == []


def _held_out(sets: dict) -> HeldOutScores:
    """``{key: [(index, hyp, ref, loss, nll, tokens), ...]}`` added one batch per row."""
    held_out = HeldOutScores()
    for key, rows in sets.items():
        for index, hyp, ref, loss, nll, tokens in rows:
            sums = (torch.tensor(loss), torch.tensor(nll), torch.tensor(tokens))
            held_out.add(key, sums, [index], [hyp], [ref])
    return held_out


def test_held_out_sets_come_in_the_order_of_the_keys_and_corpus_order():
    held_out = _held_out(
        {
            "test/other": [(0, "o", "O", 1.0, 1.0, 1)],
            "test/b": [(1, "y", "Y", 1.0, 1.0, 1), (0, "x", "X", 1.0, 1.0, 1)],
            "test/a": [(0, "p", "P", 1.0, 1.0, 1)],
        }
    )
    # A key without sentences is left out; one not among the keys comes last.
    gathered = list(held_out.gathered(["test/b", "test/none", "test/a"]))
    assert [key for key, _ in gathered] == ["test/b", "test/a", "test/other"]
    assert gathered[0][1] == [(0, "x", "X"), (1, "y", "Y")]
    held_out.reset()
    assert list(held_out.gathered(["test/b", "test/a"])) == []


def test_held_out_loss_is_the_sum_over_the_set_per_token_after_the_reduction():
    held_out = _held_out({"val": [(0, "a", "A", 6.0, 3.0, 2), (1, "b", "B", 4.0, 2.0, 3)]})
    seen = []

    def reduce(tensor):  # two processes holding the same share
        seen.append(tensor.dtype)
        return tensor * 2

    loss, nll = held_out.loss("val", reduce)
    assert seen == [torch.float64]
    assert float(loss) == pytest.approx(10.0 / 5) and float(nll) == pytest.approx(5.0 / 5)


def _ordered(hyps, indices=None):
    """``write_report``'s triples: (index in the set, hypothesis, reference)."""
    indices = range(len(hyps)) if indices is None else indices
    return list(zip(indices, hyps, REFS, strict=True))


def _report_trainer(tmp_path, **overrides):
    datamodule = SimpleNamespace(val_set=[0] * 4, test_sets={"newstest": [0] * 3})
    trainer = SimpleNamespace(
        global_rank=0, datamodule=datamodule, fast_dev_run=False, logger=None,
        default_root_dir=str(tmp_path), global_step=12, state=SimpleNamespace(fn="fit"),
    )  # fmt: skip
    vars(trainer).update(overrides)
    return trainer


def test_report_prints_the_scores_and_writes_hypotheses_and_scores(tmp_path):
    scores = corpus_scores(HYPS, REFS, ["bleu", "chrf"])
    printed = []
    ordered = _ordered(HYPS, [0, 2, 3])  # 3 of the 4 sentences: their line numbers written
    write_report(_report_trainer(tmp_path), "val", ordered, scores, None, printed.append)
    hyp_path = tmp_path / "hypotheses" / "val.step12.txt"
    assert hyp_path.read_text(encoding="utf-8").splitlines() == HYPS
    numbers = hyp_path.with_suffix(".lines")
    assert numbers.read_text(encoding="utf-8").splitlines() == ["1", "3", "4"]
    lines = hyp_path.with_suffix(".scores").read_text(encoding="utf-8").splitlines()
    assert lines == [f"{s.text}\t{s.signature}" for s in scores.values()] + [
        "scored on 3 of the 4 sentences (--trainer.limit_val_batches): not the whole set's score"
    ]
    assert printed == [
        f"val: {scores['bleu'].text}\n  signature: {scores['bleu'].signature}\n"
        f"val: {scores['chrf'].text}\n  signature: {scores['chrf'].signature}\n"
        "  scored on 3 of the 4 sentences (--trainer.limit_val_batches): not the whole set's "
        f"score\n  hypotheses: {hyp_path} (their line numbers in the set: val.step12.lines)"
    ]


def test_report_outside_fit_names_the_checkpoints_step_and_other_ranks_stay_quiet(tmp_path):
    scores = corpus_scores(HYPS, REFS, ["bleu"])
    printed = []
    logger = SimpleNamespace(log_dir=str(tmp_path / "logs"))
    trainer = _report_trainer(tmp_path, state=SimpleNamespace(fn="test"), logger=logger)
    write_report(trainer, "test/newstest", _ordered(HYPS), scores, "step40", printed.append)
    assert (tmp_path / "logs" / "hypotheses" / "test.newstest.step40.txt").is_file()
    # an average of three checkpoints says so in its files' names
    averaged = {"global_step": 40, AVERAGED_FROM: ["a.ckpt", "b.ckpt", "c.ckpt"]}
    assert checkpoint_label(averaged) == "step40.avg3"
    assert checkpoint_label({"global_step": 40}) == "step40" and checkpoint_label({}) is None
    write_report(
        trainer, "test/newstest", _ordered(HYPS), scores, checkpoint_label(averaged), print
    )
    assert (tmp_path / "logs" / "hypotheses" / "test.newstest.step40.avg3.txt").is_file()
    assert "scored on" not in printed[0]  # all 3 sentences
    write_report(
        _report_trainer(tmp_path, global_rank=1), "val", _ordered(HYPS), scores, None, print
    )
    smoke = []
    write_report(
        _report_trainer(tmp_path, fast_dev_run=2), "val", _ordered(HYPS), scores, None, smoke.append
    )
    assert not (tmp_path / "hypotheses").exists()
    # a smoke run limits the batches itself: the message names the flag that was given
    assert "  scored on 3 of the 4 sentences (--trainer.fast_dev_run)" in smoke[0]


def test_a_set_of_empty_hypotheses_says_so(tmp_path):
    """BLEU 0 from a model that ends every hypothesis at once is told apart from a bad one."""
    empty = ["", " ", ""]
    printed = []
    trainer = _report_trainer(tmp_path, datamodule=None)
    scores = corpus_scores(empty, REFS, ["bleu"])
    write_report(trainer, "val", _ordered(empty), scores, None, printed.append)
    assert "  every hypothesis is empty: the model ends each at once" in printed[0]
    scores = corpus_scores(HYPS, REFS, ["bleu"])
    write_report(trainer, "val", _ordered(HYPS), scores, None, printed.append)
    assert "every hypothesis is empty" not in printed[1]


def test_score_table_has_a_row_per_set_and_names_the_first():
    scores = {
        "test/newstest2013": corpus_scores(HYPS, REFS, ["bleu", "ter"]),
        "test/newstest2014": corpus_scores(HYPS[:2], REFS[:2], ["bleu", "ter"]),
    }
    lines = score_table(scores).splitlines()
    assert lines[0].split() == ["set", "BLEU", "TER"]
    assert lines[1].split()[0] == "newstest2013" and lines[2].split()[0] == "newstest2014"
    assert lines[1].split()[1] == f"{scores['test/newstest2013']['bleu'].value:.2f}"
    assert lines[-1] == "(test/bleu, test/ter: newstest2013's)"


def test_sacrebleus_tokenizer_follows_any_code_of_the_language():
    """An imported model's code (zho_Hans, jpn) picks sacreBLEU's tokenizer as zh, ja do."""
    hyps, refs = ["一只狗在跑"], ["一只狗在草地上跑"]
    for lang, tok in (("zh", "tok:zh"), ("zho_Hans", "tok:zh"), ("en", "tok:13a")):
        assert tok in corpus_scores(hyps, refs, ["bleu"], tgt_lang=lang)["bleu"].signature
