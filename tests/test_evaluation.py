import pytest
import sacrebleu

from seq2seq.evaluation import corpus_scores, gather_in_order, write_lines

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
