"""Using a multilingual checkpoint: ``>>xx<<`` tags on the source through the Translator, the
translate command, ensembles and the exports; zero-shot warnings; a checkpoint's
``data.pairs`` against the config's; ``fit --init_from`` on languages it never saw.

The models are untrained (seeded) and tiny, saved as ``seq2seq fit`` writes a checkpoint:
their outputs are arbitrary but deterministic, which is all that comparing engines needs.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS, multi30k_lines, run_main, tiny_model, write_corpus, write_lines

from seq2seq.checkpoint import IncompatibleCheckpointsError, average_checkpoints
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.translator import Translator

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 200
SENTENCES = ["A man is riding a bike.", "Two dogs play in the snow.", "", "A woman."]
TAGGED = ["en-de", "en-fr"]  # two targets: tags >>de<< and >>fr<<
MANY_TO_ONE = ["de-en", "fr-en"]  # one target: no tags


def _texts(n: int = 300) -> list[str]:
    return [line for lang in ("de", "en", "fr") for line in multi30k_lines("train", lang, n)]


def _save(
    path: Path, tokenizer: Tokenizer, pairs: list[str] | None, seed: int = 0, pair=("de", "en")
) -> Path:
    """An untrained tiny module with ``tokenizer``, saved as ``seq2seq fit`` does, trained
    (as its data hyperparameters say) on ``data.pairs`` ``pairs`` (``None``: on ``pair``)."""
    torch.manual_seed(seed)
    module = tiny_model(
        vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
        n_decoder_layers=1, max_positions=64, max_len_b=6, beam_size=2,
    )  # fmt: skip
    module.tokenizer = tokenizer
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    checkpoint["pytorch-lightning_version"] = "2.6.6"
    data = {"src_lang": pair[0], "tgt_lang": pair[1], "pairs": pairs}
    checkpoint["datamodule_hyper_parameters"] = data
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """``tagged`` (en->de, en->fr, tags), ``tagged_twin`` (its tokenizer and pairs, other
    weights), ``other_pairs`` (its tokenizer, pairs en-de, en-fr, de-en), ``many_to_one``
    (de, fr -> en, no tags) and ``bilingual`` (de->en, no tags, no data.pairs)."""
    folder = tmp_path_factory.mktemp("multilingual")
    tagged = Tokenizer.train(
        _texts(), folder / "tagged.model", VOCAB, user_defined_symbols=[">>de<<", ">>fr<<"]
    )
    plain = Tokenizer.train(_texts(), folder / "plain.model", VOCAB)
    return {
        "tagged": _save(folder / "tagged.ckpt", tagged, TAGGED),
        "tagged_twin": _save(folder / "twin.ckpt", tagged, TAGGED, seed=1),
        "other_pairs": _save(folder / "other.ckpt", tagged, [*TAGGED, "de-en"], seed=2),
        "many_to_one": _save(folder / "many.ckpt", plain, MANY_TO_ONE),
        "bilingual": _save(folder / "bilingual.ckpt", plain, None),
    }


@pytest.fixture(scope="module")
def tagged(models) -> Translator:
    return Translator.from_checkpoint(models["tagged"], device="cpu")


def _sources_seen(translator: Translator, monkeypatch, **options) -> set[tuple[int, ...]]:
    """The source ids (without padding) that ``translate(SENTENCES, **options)`` decodes."""
    import seq2seq.translator as module

    seen: set[tuple[int, ...]] = set()
    real = module.decode_batch

    def spy(model, tokenizer, batch, config, n_best=1, **options):
        mask = batch["src_mask"][:, 0, 0]
        seen.update(tuple(row[keep].tolist()) for row, keep in zip(batch["src"], mask, strict=True))
        return real(model, tokenizer, batch, config, n_best, **options)

    monkeypatch.setattr(module, "decode_batch", spy)
    translator.translate(SENTENCES, **options)
    monkeypatch.undo()
    return seen


# ---------------------------------------------------------------------- the Translator
def test_the_translator_puts_the_target_tag_first_and_needs_a_known_language(tagged, monkeypatch):
    tok = tagged.tokenizer
    assert tok.languages == ("de", "fr")
    fr = tok.language_prefix("fr")[0]
    expected = {(*fr, *ids, tok.eos_id) for ids in tok.encode(SENTENCES)}
    assert _sources_seen(tagged, monkeypatch, tgt_lang="fr") == expected
    into_de = tagged.translate(SENTENCES, tgt_lang="de", return_scores=True)
    into_fr = tagged.translate(SENTENCES, tgt_lang="fr", return_scores=True)
    assert [h[0][1] for h in into_de] != [h[0][1] for h in into_fr]  # another model input
    assert into_de[2] == into_fr[2] == [("", 0.0)]  # a tag alone is nothing to translate
    with pytest.raises(ValueError, match=r"^this model translates into de, fr: choose"):
        tagged.translate(SENTENCES)
    with pytest.raises(ValueError, match=r"'es'.*de, fr"):
        tagged.translate(SENTENCES, tgt_lang="es")


def test_score_takes_the_tag_of_the_target_language_as_translate(tagged):
    """A tagged model scores a translation given its target language, whose tag goes first in
    the source, as translate puts it; without a language, the same refusal as translate."""
    from seq2seq.text_scoring import forced_batch, token_log_probs

    tok, targets = tagged.tokenizer, ["Un chien.", "Ein Hund läuft.", "", "Deux"]
    for lang in ("de", "fr"):
        tag = tok.language_prefix(lang)[0]
        sources = [[*tag, *ids, tok.eos_id] for ids in tok.encode(SENTENCES)]
        batch = forced_batch(sources, tok.encode(targets, side="target"), tok)
        expected = token_log_probs(tagged.model, batch)
        scores = tagged.score(SENTENCES, targets, tgt_lang=lang)
        assert [s.log_prob for s in scores] == pytest.approx([sum(e) for e in expected], abs=1e-5)
    into_de, into_fr = (tagged.score(SENTENCES, targets, tgt_lang=lang) for lang in ("de", "fr"))
    assert [s.log_prob for s in into_de] != pytest.approx([s.log_prob for s in into_fr])
    with pytest.raises(ValueError, match=r"^this model translates into de, fr: choose"):
        tagged.score(SENTENCES, targets)


def test_prefixes_sampling_and_n_best_keep_the_tag(tagged, monkeypatch):
    fr = tagged.tokenizer.language_prefix("fr")[0]
    sources = _sources_seen(tagged, monkeypatch, tgt_lang="fr", prefixes=["Un"] * 4)
    assert len(sources) == 4 and all(list(ids[:1]) == fr for ids in sources)
    forced = tagged.translate(SENTENCES, tgt_lang="fr", prefixes=["Un"] * 4, beam_size=1)
    assert all(text.startswith("Un") for i, text in enumerate(forced) if SENTENCES[i])
    drawn = [tagged.translate(SENTENCES, tgt_lang="fr", sampling=True, seed=3) for _ in "ab"]
    assert drawn[0] == drawn[1]
    n_best = tagged.translate(SENTENCES, tgt_lang="fr", beam_size=2, n_best=2)
    assert [len(h) for h in n_best] == [2] * 4
    best = tagged.translate(SENTENCES, tgt_lang="fr", beam_size=2)
    assert [h[0][0] for h in n_best] == best


def test_zero_shot_directions_are_warned_once(tagged, models, recwarn):
    tagged.translate(SENTENCES, src_lang="en", tgt_lang="fr")
    assert not recwarn.list
    with pytest.warns(UserWarning) as caught:
        tagged.translate(SENTENCES, src_lang="de", tgt_lang="fr")
    assert [str(w.message) for w in caught] == [
        "de->fr was not trained (pairs: en-de, en-fr); translating zero-shot"
    ]
    many = Translator.from_checkpoint(models["many_to_one"], device="cpu")
    assert many.pairs == (("de", "en"), ("fr", "en"))
    many.translate(SENTENCES)
    many.translate(SENTENCES, src_lang="fr")
    assert not recwarn.list
    with pytest.warns(UserWarning) as caught:
        many.translate(SENTENCES, src_lang="it")
    assert [str(w.message) for w in caught] == [  # a language the model has never seen
        "it->en was not trained (pairs: de-en, fr-en); it is none of its languages (de, en, "
        "fr); translating zero-shot"
    ]
    with pytest.warns(UserWarning) as caught:  # no language at all
        many.translate(SENTENCES, src_lang="xx")
    assert str(caught[0].message).endswith(
        "xx is none of its languages (de, en, fr), nor a language code: misspelt?; translating "
        "zero-shot"
    )
    many.translate(SENTENCES, src_lang="fra", tgt_lang="eng")  # codes of a trained pair's
    assert not recwarn.list
    # its one target language selects nothing, so naming it is no error; another one is
    assert many.translate(SENTENCES, tgt_lang="en") == many.translate(SENTENCES)
    with pytest.raises(ValueError, match="no target-language tokens"):
        many.translate(SENTENCES, tgt_lang="fr")


def test_an_ensemble_of_tagged_models_shares_their_tokenizer_and_pairs(models, tmp_path):
    pair = Translator.from_checkpoint([models["tagged"], models["tagged_twin"]], device="cpu")
    assert pair.pairs == (("en", "de"), ("en", "fr"))
    out = pair.translate(SENTENCES, tgt_lang="de", beam_size=2)
    assert len(out) == 4 and out[2] == ""
    for combine in (
        lambda a, b: Translator.from_checkpoint([a, b]),
        lambda a, b: average_checkpoints([a, b], tmp_path / "avg.ckpt"),
    ):
        with pytest.raises(IncompatibleCheckpointsError, match="other directions") as info:
            combine(models["tagged"], models["other_pairs"])
        assert "(de->en, en->de, en->fr and en->de, en->fr)" in str(info.value)
        with pytest.raises(IncompatibleCheckpointsError, match="other directions"):
            combine(models["many_to_one"], models["bilingual"])  # one of its pairs
    assert average_checkpoints([models["tagged"], models["tagged_twin"]], tmp_path / "a.ckpt")


# ---------------------------------------------------------------------- translate command
def _translate(monkeypatch, capsys, ckpt, *flags, stdin=SENTENCES):
    data = "".join(f"{line}\n" for line in stdin).encode()
    return run_main(monkeypatch, capsys, "translate", "--ckpt_path", str(ckpt), *flags, stdin=data)


def test_translate_with_tgt_lang_and_its_one_line_errors(tagged, models, monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    code, out, err = _translate(monkeypatch, capsys, models["tagged"], "--tgt_lang", "fr")
    assert code in (0, None) and err == []
    assert out.splitlines() == tagged.translate(SENTENCES, tgt_lang="fr")
    code, out, err = _translate(monkeypatch, capsys, models["tagged"])
    assert (code, out) == (1, "") and len(err) == 1
    assert err[0].startswith("seq2seq: error: this model translates into de, fr")
    code, out, err = _translate(monkeypatch, capsys, models["tagged"], "--tgt_lang", "es")
    assert (code, out) == (1, "") and len(err) == 1 and "de, fr" in err[0]
    flags = ("--src_lang", "de", "--tgt_lang", "fr")
    code, out, err = _translate(monkeypatch, capsys, models["tagged"], *flags)
    assert code in (0, None) and len(out.splitlines()) == 4
    assert err == [
        "seq2seq: warning: de->fr was not trained (pairs: en-de, en-fr); translating zero-shot"
    ]
    code, out, err = _translate(monkeypatch, capsys, models["many_to_one"])  # no flag needed
    assert code in (0, None) and err == [] and len(out.splitlines()) == 4


# ---------------------------------------------------------------------- exports
ctranslate2 = pytest.importorskip("ctranslate2")


def test_a_ctranslate2_folder_translates_a_tagged_model_as_ours(tagged, models, tmp_path):
    from seq2seq.export.ctranslate2 import export_ctranslate2

    folder = export_ctranslate2(models["tagged"], tmp_path / "ct2")
    theirs = Translator.from_checkpoint(folder, device="cpu")
    assert theirs.pairs == (("en", "de"), ("en", "fr"))
    for lang in ("de", "fr"):
        for beam, decoding in ((1, {}), (2, {"length_penalty": 0.0})):
            options = dict(tgt_lang=lang, beam_size=beam, return_scores=True, **decoding)
            a, b = theirs.translate(SENTENCES, **options), tagged.translate(SENTENCES, **options)
            assert [h[0][0] for h in a] == [h[0][0] for h in b]
            assert [h[0][1] for h in a] == pytest.approx([h[0][1] for h in b], abs=1e-4)
    prefixed = dict(tgt_lang="fr", beam_size=1, prefixes=["Un"] * 4)
    assert theirs.translate(SENTENCES, **prefixed) == tagged.translate(SENTENCES, **prefixed)
    with pytest.raises(ValueError, match="this model translates into de, fr"):
        theirs.translate(SENTENCES)
    with pytest.warns(UserWarning, match=r"^de->fr was not trained"):
        theirs.translate(SENTENCES, src_lang="de", tgt_lang="fr")


transformers = pytest.importorskip("transformers")


def test_a_hugging_face_export_of_a_tagged_model_takes_the_tag_in_the_source(
    tagged, models, tmp_path
):
    from seq2seq.export.huggingface import export_huggingface, generate_translations

    folder = export_huggingface(models["tagged"], tmp_path / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tok = tagged.tokenizer
    for lang in ("de", "fr"):
        tag = tok.language_prefix(lang)[0]
        sources = [f">>{lang}<< {text}" for text in SENTENCES]
        expected = [[*tag, *ids, tok.eos_id] for ids in tok.encode(SENTENCES)]
        assert tokenizer(sources)["input_ids"] == expected
        assert tokenizer.decode(expected[0], skip_special_tokens=True) == tok.decode(expected)[0]
        lengths = {k: getattr(tagged.decoding, k) for k in ("max_len_a", "max_len_b", "min_len")}
        got = generate_translations(model, tokenizer, sources, 1, **lengths)
        ours = tagged.translate(SENTENCES, tgt_lang=lang, beam_size=1)
        assert [g for g, s in zip(got, SENTENCES, strict=True) if s] == [
            o for o, s in zip(ours, SENTENCES, strict=True) if s
        ]  # a tag alone: we give "", generate an arbitrary sentence


# ---------------------------------------------------------------------- checkpoint arguments
def test_validate_and_test_take_the_checkpoints_pairs(models, capsys):
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.cli.checkpoint_args import apply_checkpoint_architecture
    from seq2seq.cli.checkpoint_languages import other_languages

    checkpoint = load_checkpoint(models["tagged"])
    config = {
        "ckpt_path": str(models["tagged"]),
        "data": {"src_lang": "de", "tgt_lang": "en", "pairs": ["en-de"]},
        "model": {},
    }
    # predict translates the one direction configured where it is one of the checkpoint's
    apply_checkpoint_architecture("predict", config, lambda path: checkpoint)
    assert capsys.readouterr().err.splitlines() == [
        f"seq2seq: note: {models['tagged']} was trained on the pairs en-de, en-fr; predict "
        "translates en-de (data.pairs)"
    ]
    assert [config["data"][k] for k in ("src_lang", "tgt_lang", "pairs")] == ["en", "de", ["en-de"]]
    config["data"] = {"src_lang": "en", "tgt_lang": "fr", "pairs": None}
    apply_checkpoint_architecture("predict", config, lambda path: checkpoint)
    assert "predict translates en-fr (data.src_lang, data.tgt_lang)" in capsys.readouterr().err
    assert config["data"]["pairs"] == ["en-fr"]
    # ... and refuses a target language it does not translate into, naming how to choose
    config["data"] = {"src_lang": "de", "tgt_lang": "en", "pairs": None}
    with pytest.raises(
        ValueError,
        match=r"translates the pairs en-de, en-fr \(not de-en as con"
        r"figured: it does not translate into en\); predict translates one direction: "
        r"choose it with --data.pairs '\[en-de\]'",
    ):
        apply_checkpoint_architecture("predict", config, lambda path: checkpoint)
    config["data"] = {"src_lang": "de", "tgt_lang": "en", "pairs": ["en-de", "en-fr"]}
    with pytest.raises(ValueError, match=r"translates the pairs en-de, en-fr \(data\.pairs lists "
                       r"en-de, en-fr\); predict translates one direction"):  # fmt: skip
        apply_checkpoint_architecture("predict", config, lambda path: checkpoint)
    # a direction into one of its targets that it was not trained on: zero-shot, warned
    config["data"] = {"src_lang": "en", "tgt_lang": "en", "pairs": ["de-fr"]}
    apply_checkpoint_architecture("predict", config, lambda path: checkpoint)
    assert capsys.readouterr().err.splitlines() == [
        f"seq2seq: warning: {models['tagged']} was trained on the pairs en-de, en-fr; predict "
        "translates de-fr (data.pairs), zero-shot"
    ]
    assert [config["data"][k] for k in ("src_lang", "tgt_lang", "pairs")] == ["de", "fr", ["de-fr"]]
    # validate and test score a subset named in data.pairs, not one of the defaults
    config["data"] = {"src_lang": "de", "tgt_lang": "en", "pairs": ["en-de"]}
    subset = apply_checkpoint_architecture("test", config, lambda path: checkpoint)
    assert subset == (("en", "de"),) and capsys.readouterr().err.splitlines() == [
        f"seq2seq: note: {models['tagged']} was trained on the pairs en-de, en-fr; test "
        "scores en-de (data.pairs)"
    ]
    assert [config["data"][k] for k in ("src_lang", "tgt_lang", "pairs")] == ["en", "de", ["en-de"]]
    config["data"] = {"src_lang": "en", "tgt_lang": "de", "pairs": None}
    assert apply_checkpoint_architecture("validate", config, lambda path: checkpoint) is None
    assert config["data"]["pairs"] == TAGGED and "checkpoint's languages; to score" in (
        capsys.readouterr().err
    )
    assert other_languages(checkpoint, {"pairs": ["en-fr", "en-de"]}) is None  # a set
    bilingual = load_checkpoint(models["bilingual"])
    assert other_languages(bilingual, {"src_lang": "en", "tgt_lang": "de", "pairs": None}) == (
        "de->en (data.src_lang de, data.tgt_lang en), not en->de as configured"
    )
    assert other_languages(bilingual, {"pairs": ["de-en"]}) is None  # one pair is bilingual


def test_init_from_refuses_missing_tags_and_reports_unknown_pieces(models, tmp_path, capsys):
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.cli.checkpoint_languages import check_target_tags, report_new_languages

    bilingual = load_checkpoint(models["bilingual"])
    with pytest.raises(ValueError) as info:
        check_target_tags("b.ckpt", bilingual, {"pairs": ["de-en", "en-de"]})
    assert str(info.value).startswith(
        "--init_from b.ckpt: its vocabulary has no >>de<<, >>en<< tag for the target languages"
    )
    assert "data.pairs" in str(info.value) and "\n" not in str(info.value)
    tagged = load_checkpoint(models["tagged"])
    check_target_tags("t.ckpt", tagged, {"pairs": ["en-de", "fr-de"]})  # >>de<< is there
    with pytest.raises(ValueError, match=r"no >>en<< tag .*\(its tags: >>de<<, >>fr<<\)"):
        check_target_tags("t.ckpt", tagged, {"pairs": ["en-de", "de-en"]})
    check_target_tags("b.ckpt", bilingual, {"pairs": ["de-en", "fr-en"]})  # many-to-one
    greek = ["Ένας άντρας.", "Δύο σκύλοι."]
    corpus = write_corpus(tmp_path, {"train": (greek, ["A man.", "Two dogs."])}, ("el", "en"))
    datamodule = SimpleNamespace(
        language_pairs=[("de", "en"), ("el", "en")], data_dir=str(corpus), train_split="train",
        hf_dataset=None, hf_config=None,
    )  # fmt: skip
    tokenizer = Translator.from_checkpoint(models["bilingual"], device="cpu").tokenizer
    report_new_languages("b.ckpt", bilingual, datamodule, tokenizer)
    from seq2seq.data.tokenizer import unknown_rate

    rate = unknown_rate(tokenizer, greek)
    assert capsys.readouterr().err.splitlines() == [
        "seq2seq: warning: --init_from b.ckpt was trained on the pairs de-en (data.pairs), not "
        "de-en, el-en as configured; fit trains it on the configured pairs with its "
        "SentencePiece model, which has no pieces learnt from el: their text is encoded with "
        f"its existing pieces (el {rate:.1%} of pieces unknown in 2 training sentences)"
    ]
    assert rate > 0


# ---------------------------------------------------------------------- a trained run
SPLITS = {"train": 200, "val": 8, "test_2016_flickr": 8}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> SimpleNamespace:
    """``seq2seq fit`` of configs/tiny.yaml on ``data.pairs [en-de, en-fr]`` for a few steps,
    on 200 multi-parallel Multi30k lines (one folder, as Multi30k is laid out)."""
    from seq2seq.cli import cli_main

    root = tmp_path_factory.mktemp("trained")
    corpus = root / "corpus"
    for split, n in SPLITS.items():
        for lang in ("de", "en", "fr"):
            write_lines(corpus / f"{split}.{lang}", multi30k_lines(split, lang, n))
    flags = [
        "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(corpus),
        "--data.cache_dir", str(root / "cache"), "--data.vocab_size", str(VOCAB),
        "--trainer.logger", "false", "--trainer.max_steps", "3",
        "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1",
    ]  # fmt: skip
    previous = Path.cwd()
    os.chdir(root)  # the run's own files (config.yaml) go there
    try:
        cli_main(["fit", *flags, "--data.pairs", "[en-de, en-fr]", "--checkpoint_dir", "ckpt"])
    finally:
        os.chdir(previous)
    return SimpleNamespace(root=root, corpus=corpus, flags=flags, ckpt=root / "ckpt" / "last.ckpt")


def test_a_trained_multilingual_checkpoint_translates_tests_and_grows(
    trained, in_tmp, monkeypatch, capsys
):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    translator = Translator.from_checkpoint(trained.ckpt, device="cpu")
    assert translator.tokenizer.languages == ("de", "fr")
    assert translator.pairs == (("en", "de"), ("en", "fr"))
    code, out, err = _translate(monkeypatch, capsys, trained.ckpt, "--tgt_lang", "de")
    assert code in (0, None) and err == []
    assert out.splitlines() == translator.translate(SENTENCES, tgt_lang="de")
    # test with a bilingual config: the checkpoint's pairs, one warning line
    code, out, err = run_main(
        monkeypatch, capsys, "test", *trained.flags, "--ckpt_path", str(trained.ckpt)
    )
    assert code in (0, None), err
    assert (
        f"seq2seq: warning: {trained.ckpt} was trained on the pairs en-de, en-fr (data.pairs), "
        "not de-en as configured; test uses the checkpoint's languages; to score some of its "
        "pairs, list them in data.pairs"
    ) in err
    # predict of one of its pairs: the tagged translations of translate --tgt_lang fr
    source, output = in_tmp / "in.en", in_tmp / "out.fr"
    write_lines(source, SENTENCES)
    code, out, err = run_main(
        monkeypatch, capsys, "predict", *trained.flags, "--ckpt_path", str(trained.ckpt),
        "--data.pairs", "[en-fr]", "--data.predict_file", str(source),
        "--prediction_writer.output_path", str(output),
    )  # fmt: skip
    assert code in (0, None), err
    assert output.read_text(encoding="utf-8").splitlines() == translator.translate(
        SENTENCES, tgt_lang="fr"
    )
    # validate prints the mean of the pairs' scores, which picks the best checkpoint
    code, out, err = run_main(
        monkeypatch, capsys, "validate", *trained.flags, "--ckpt_path", str(trained.ckpt)
    )
    assert code in (0, None), err
    (mean,) = [line for line in out.splitlines() if line.startswith("val: the mean of 2 pairs")]
    assert mean.startswith("val: the mean of 2 pairs: val/bleu "), mean
    assert "DataLoader 1" not in out  # Lightning's table, which repeats every set's scores
    # resuming on other pairs: refused before any data is read
    code, out, err = run_main(
        monkeypatch, capsys, "fit", *trained.flags, "--data.pairs", "[en-de]",
        "--ckpt_path", str(trained.ckpt), "--checkpoint_dir", str(trained.ckpt.parent),
    )  # fmt: skip
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(
        f"seq2seq: error: {trained.ckpt} was trained on the pairs en-de, en-fr (data.pairs), "
        "not en-de as configured; training resumes only in the checkpoint's language pairs "
        "(start a new run"
    )
    # a new target language without a tag: refused before any data is read
    grow = [*trained.flags, "--init_from", str(trained.ckpt)]
    code, out, err = run_main(
        monkeypatch, capsys, "fit", *grow, "--data.pairs", "[en-de, en-fr, de-en]",
        "--checkpoint_dir", str(trained.root / "refused"),
    )  # fmt: skip
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(
        f"seq2seq: error: --init_from {trained.ckpt}: its vocabulary has no >>en<< tag"
    )
    # a new source language: trained on, with its unknown-piece rate
    for split, n in SPLITS.items():  # "Italian": English spelled backwards
        lines = multi30k_lines(split, "en", n)
        write_lines(trained.corpus / f"{split}.it", [line[::-1] for line in lines])
    code, out, err = run_main(
        monkeypatch, capsys, "fit", *grow, "--data.pairs", "[en-de, en-fr, it-de]",
        "--trainer.max_steps", "1", "--checkpoint_dir", str(trained.root / "grown"),
    )  # fmt: skip
    assert code in (0, None), err
    notes = [line for line in err if f"--init_from {trained.ckpt}" in line]
    assert len(notes) == 1 and "pieces learnt from it:" in notes[0], err
    assert "(it 0.0% of pieces unknown in 200 training sentences)" in notes[0]


def _test_scores(out: str) -> dict[str, str]:
    """``{key: "BLEU = ..."}`` of the score lines ``test`` prints (``test/<pair>/<set>: BLEU =
    ...``), the BLEU, chrF2 and TER lines of a set joined."""
    scores: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, text = line.partition(": ")
        if sep and key.startswith("test/") and " = " in text:
            scores[key] = f"{scores.get(key, '')}{text}; "
    return scores


def test_test_and_validate_score_a_subset_of_the_checkpoints_pairs(
    trained, in_tmp, monkeypatch, capsys
):
    """``--data.pairs`` naming some of a checkpoint's pairs scores those alone, as a test of
    all its pairs scores each (one pair left: still with the tag before each source, and
    named by the pair: its hypotheses file is not another pair's); a pair it lacks still
    gives its pairs, with the hint."""
    ckpt, pairs = str(trained.ckpt), "[en-de, en-fr]"
    code, out, err = run_main(
        monkeypatch, capsys, "test", *trained.flags, "--ckpt_path", ckpt, "--data.pairs", pairs
    )
    assert code in (0, None), err
    every = _test_scores(out)
    assert list(every) == ["test/en-de/test_2016_flickr", "test/en-fr/test_2016_flickr"]
    assert "DataLoader 1" not in out  # Lightning's table, which repeats every set's scores
    for pair in ("en-fr", "en-de"):
        code, out, err = run_main(monkeypatch, capsys, "test", *trained.flags,
                                  "--ckpt_path", ckpt, "--data.pairs", f"[{pair}]")  # fmt: skip
        assert code in (0, None), err
        assert err[0] == (
            f"seq2seq: note: {ckpt} was trained on the pairs en-de, en-fr; test scores {pair} "
            "(data.pairs)"
        )
        key = f"test/{pair}/test_2016_flickr"
        assert _test_scores(out) == {key: every[key]}
        assert (in_tmp / "hypotheses" / f"test.{pair}.test_2016_flickr.step3.txt").is_file()
    code, out, err = run_main(monkeypatch, capsys, "validate", *trained.flags,
                              "--ckpt_path", ckpt, "--data.pairs", "[en-fr]")  # fmt: skip
    assert code in (0, None), err
    assert "val/en-fr: BLEU = " in out and "val/en-de" not in out
    code, out, err = run_main(monkeypatch, capsys, "test", *trained.flags,
                              "--ckpt_path", ckpt, "--data.pairs", "[en-de, de-en]")  # fmt: skip
    assert code in (0, None), err
    assert err[0] == (
        f"seq2seq: warning: {ckpt} was trained on the pairs en-de, en-fr (data.pairs), not "
        "en-de, de-en as configured; test uses the checkpoint's languages; to score some of "
        "its pairs, list them in data.pairs"
    )
    assert list(_test_scores(out)) == list(every)
