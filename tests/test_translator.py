"""Translator: built from a checkpoint's config and weights alone, without Lightning."""

import math
import subprocess
import sys

import pytest
import torch

from seq2seq.checkpoint.format import CHECKPOINT_KEY
from seq2seq.checkpoint.models import CheckpointModel
from seq2seq.data.corpus import read_lines
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.module import TranslationModule
from seq2seq.nn import DecodingConfig
from seq2seq.text_decoding import source_batch
from seq2seq.translator import Translator

MULTI30K = __import__("conftest")._multi30k_dir()
SENTENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "", "Eine Frau."]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of an untrained module with a tokenizer (written as fit writes one), and
    that module."""
    folder = tmp_path_factory.mktemp("translator")
    lines = read_lines(MULTI30K / "train.de.gz")[:3000]
    tokenizer = Tokenizer.train(lines, folder / "spm", 300)
    torch.manual_seed(0)
    module = TranslationModule(
        vocab_size=300, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
        decoding=DecodingConfig(max_len_b=6, beam_size=3, length_penalty=0.6),
    )  # fmt: skip
    module.tokenizer = tokenizer
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    checkpoint["pytorch-lightning_version"] = "2.6.6"
    module.on_save_checkpoint(checkpoint)
    path = folder / "model.ckpt"
    torch.save(checkpoint, path)
    return path, module.eval()


def test_translating_with_a_checkpoint_imports_no_lightning_nor_data_pipeline(saved):
    code = (
        "import sys; from seq2seq.translator import Translator; "
        f"Translator.from_checkpoint({str(saved[0])!r}).translate(['Ein Mann.']); "
        "print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded = set(eval(out.stdout))
    assert "torch" in loaded and "seq2seq" in loaded
    assert not loaded & {
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "datasets",
        "pyarrow",
    }


def test_translator_from_checkpoint_translates_as_the_module(saved):
    path, module = saved
    translator = Translator.from_checkpoint(path, device="cpu")
    assert isinstance(translator.module, CheckpointModel)
    assert isinstance(translator.model, torch.nn.Module) and not isinstance(
        translator.model, TranslationModule
    )
    assert translator.module.model_config == module.model_config
    assert translator.decoding == module.decoding  # the checkpoint's decoding settings
    assert translator.decoding.beam_size == 3
    for beam in (1, 3):
        encoded = translator.encode(SENTENCES)
        batch = source_batch(encoded, translator.tokenizer.pad_id)
        expected = module.translate_batch(batch, beam_size=beam, n_best=1)
        got = translator.translate(SENTENCES, beam_size=beam, return_scores=True)
        # translate sorts by length into batches of its own: other padding, same results up
        # to the rounding of batched products
        assert [[t for t, _ in hyps] for hyps in got] == [[t for t, _ in h] for h in expected]
        scores = [s for hyps in got for _, s in hyps]
        assert scores == pytest.approx([s for hyps in expected for _, s in hyps], rel=1e-5)
    assert translator.translate(SENTENCES)[2] == ""


def test_greedy_translation_without_scores_skips_the_log_softmax_and_finds_the_same(
    saved, monkeypatch
):
    translator = Translator.from_checkpoint(saved[0], device="cpu")
    scored = translator.translate(SENTENCES, beam_size=1, return_scores=True)
    calls = []
    real = torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert translator.translate(SENTENCES, beam_size=1) == [t for [(t, _)] in scored]
    assert calls == []
    assert all(math.isfinite(s) for [(_, s)] in scored)


def test_a_translator_of_a_module_gives_the_same_as_from_checkpoint(saved):
    path, module = saved
    direct = Translator(module, device="cpu").translate(SENTENCES, return_scores=True)
    assert direct == Translator.from_checkpoint(path).translate(SENTENCES, return_scores=True)


def test_the_checkpoint_stores_the_config_and_one_lacking_a_field_takes_its_default(
    saved, tmp_path
):
    """model_config holds the TransformerConfig fields (the same keys as before the config
    class existed); a checkpoint written before a field existed gets the field's default."""
    path, module = saved
    checkpoint = torch.load(path, weights_only=True)
    config = checkpoint[CHECKPOINT_KEY]["model_config"]
    assert config == module.config.to_dict() and len(config) == 16
    assert config["positional"] == "sinusoidal"  # the default
    del config["positional"]
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    expected = Translator.from_checkpoint(path).translate(SENTENCES, return_scores=True)
    assert Translator.from_checkpoint(old).translate(SENTENCES, return_scores=True) == expected


def test_from_checkpoint_refuses_unknown_and_out_of_range_settings(saved):
    path, _ = saved
    with pytest.raises(ValueError, match=r"unknown decoding settings: \['num_beams'\]"):
        Translator.from_checkpoint(path, num_beams=2)
    with pytest.raises(ValueError, match=r"^beam_size must be >= 1, got 0$"):
        Translator.from_checkpoint(path, beam_size=0)
    with pytest.raises(ValueError, match="n_heads: checkpoint 4 vs requested 2"):
        Translator.from_checkpoint(path, n_heads=2)
    assert Translator.from_checkpoint(path, dropout=0.3).model.config.dropout == 0.1


def test_sampling_through_the_api_is_seeded_and_per_sentence(saved):
    path, _ = saved
    translator = Translator.from_checkpoint(path, device="cpu")
    greedy = translator.translate(SENTENCES, beam_size=1)
    assert translator.translate(SENTENCES, sampling_topk=1) == greedy  # top-1 is greedy
    drawn = translator.translate(SENTENCES, n_samples=3, temperature=1.5, seed=4)
    assert [len(hyps) for hyps in drawn] == [3] * len(SENTENCES)
    assert drawn[2] == [("", 0.0)] * 3  # nothing to translate
    assert translator.translate(SENTENCES, n_samples=3, temperature=1.5, seed=4) == drawn
    assert translator.translate(SENTENCES, n_samples=3, temperature=1.5, seed=5) != drawn
    assert any(len({text for text, _ in hyps}) > 1 for hyps in drawn)
    # a sentence's samples do not depend on the others, nor on its place in the list
    alone = translator.translate(SENTENCES[1], n_samples=3, temperature=1.5, seed=4)
    assert [t for t, _ in alone] == [t for t, _ in drawn[1]]
    moved = translator.translate(SENTENCES[::-1], n_samples=3, temperature=1.5, seed=4)
    assert [[t for t, _ in h] for h in moved[::-1]] == [[t for t, _ in h] for h in drawn]
    # one sample per sentence: strings, as without sampling
    one = translator.translate(SENTENCES, sampling=True, seed=4)
    assert all(isinstance(text, str) for text in one)


def test_prefixes_and_no_repeat_ngram_size_through_the_api(saved):
    path, _ = saved
    translator = Translator.from_checkpoint(path, device="cpu")
    prefixes = ["Ein Mann", "", "", "Eine"]
    for options in ({"beam_size": 1}, {"beam_size": 3}, {"n_samples": 2, "seed": 1}):
        out = translator.translate(SENTENCES, prefixes=prefixes, return_scores=True, **options)
        for hyps, sentence, prefix in zip(out, SENTENCES, prefixes, strict=True):
            if sentence:
                assert all(text.startswith(prefix) for text, _ in hyps), (options, hyps)
    single = translator.translate(SENTENCES[0], prefixes="Ein Mann", beam_size=1)
    assert single.startswith("Ein Mann")
    # The untrained model repeats one piece that decodes to nothing; the ban removes it
    # (the search-level tests check the ban token by token).
    plain = translator.translate(SENTENCES[:2], beam_size=1)
    blocked = translator.translate(SENTENCES[:2], beam_size=1, no_repeat_ngram_size=1)
    assert plain == ["", ""] and all(blocked)
    with pytest.raises(ValueError, match=r"prefixes holds 1 entries for 4 sentences"):
        translator.translate(SENTENCES, prefixes=["Ein"])


def test_repetition_penalty_through_the_api_is_the_searchs(saved):
    """``translate(repetition_penalty=...)`` decodes as the search given that setting."""
    from seq2seq.nn import beam_search, greedy_search

    path, module = saved
    translator = Translator.from_checkpoint(path, device="cpu")
    tok = module.tokenizer
    batch = source_batch(translator.encode(SENTENCES[:2]), tok.pad_id)
    for beam, search in ((1, greedy_search), (3, beam_search)):
        config = translator.decoding.replace(beam_size=beam, repetition_penalty=2.5)
        hyps = search(module.model, batch["src"], batch["src_mask"], tok.bos_id, tok.eos_id, config)
        got = translator.translate(
            SENTENCES[:2], beam_size=beam, repetition_penalty=2.5, return_scores=True
        )
        assert [h[0][0] for h in got] == tok.decode([h[0].tokens for h in hyps])
        assert [h[0][1] for h in got] == pytest.approx([h[0].score for h in hyps], abs=1e-6)
    # The untrained model repeats one piece that decodes to nothing (see above); penalised, it
    # gives way to others.
    plain = translator.translate(SENTENCES[:2], beam_size=1)
    assert plain == ["", ""] and all(translator.translate(SENTENCES[:2], repetition_penalty=2.5))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": 0.0}, r"temperature must be a finite number > 0, got 0.0"),
        ({"sampling_topp": 1.5}, r"sampling_topp must lie in \(0, 1\] \(1 = off\), got 1.5"),
        ({"sampling_topk": -1}, r"sampling_topk must be >= 0, got -1"),
        ({"n_samples": 0}, r"n_samples must be >= 1, got 0"),
        ({"no_repeat_ngram_size": -1}, r"no_repeat_ngram_size must be >= 0, got -1"),
        ({"seed": 1.5}, r"sampling_seed must be an integer, got 1.5"),
        ({"sampling": True, "beam_size": 3}, r"^beam_size=3 with sampling: sampling draws"),
        ({"temperature": 0.7, "beam_size": 2}, r"^beam_size=2 with temperature: sampling"),
        ({"temperature": 0.7, "n_best": 2}, r"n_best=2 with sampling: give n_samples=2"),
        ({"sampling": False, "temperature": 0.7}, r"temperature applies to sampling"),
        ({"num_beams": 2}, r"^unknown decoding settings: \['num_beams'\]; choose from"),
        ({"topp": 0.9}, r"^unknown decoding settings: \['topp'\] \(did you mean sampling_topp\?\)"),
        ({"n_best": 9}, r"^n_best \(9\) exceeds the beam size \(\d\); pass beam_size=9 or more"),
        ({"repetition_penalty": 0.0}, r"^repetition_penalty must be a finite number > 0"),
    ],
)
def test_the_api_refuses_bad_sampling_values(saved, options, message):
    translator = Translator.from_checkpoint(saved[0], device="cpu")
    with pytest.raises(ValueError, match=message):
        translator.translate(SENTENCES, **options)


def test_the_api_takes_any_iterable_of_sentences_and_refuses_none(saved):
    translator = Translator.from_checkpoint(saved[0], device="cpu", beam_size=1)
    assert translator.translate(s for s in SENTENCES) == translator.translate(SENTENCES)
    with pytest.raises(TypeError, match=r"^sentences must be a str or a list of str, not NoneType"):
        translator.translate(None)


def test_the_module_samples_outside_evaluation(saved):
    _, module = saved
    decoding = module.decoding.replace(sampling=True, n_samples=2)
    sampler = TranslationModule(**{**dict(module.hparams), "decoding": decoding})
    sampler.load_state_dict(module.state_dict())
    sampler.tokenizer = module.tokenizer
    batch = source_batch(Translator(module).encode(SENTENCES), module.tokenizer.pad_id)
    drawn = sampler.eval().translate_batch(batch)
    assert [len(h) for h in drawn] == [2] * len(SENTENCES)
    assert sampler.translate_batch(batch) == drawn
    searched = sampler.translate_batch(batch, sampling=False, beam_size=1)
    assert [len(h) for h in searched] == [1] * len(SENTENCES)
    with pytest.raises(ValueError, match=r"^model\.decoding\.temperature must be a finite number"):
        TranslationModule(
            vocab_size=16, d_model=8, n_heads=2, d_ff=16, decoding={"temperature": -1.0}
        )


def test_the_checkpoint_stores_decoding_as_a_plain_dict(saved):
    path, module = saved
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["decoding"] == module.decoding.to_dict()
    assert not set(DecodingConfig.field_names()) & set(checkpoint["hyper_parameters"])


def test_a_checkpoint_with_flat_decoding_hyperparameters_translates_with_its_settings(
    saved, tmp_path
):
    """Checkpoints written before ``decoding`` existed hold its fields flat; they keep their
    settings in the Translator and in ``TranslationModule.load_from_checkpoint``."""
    path, module = saved
    checkpoint = torch.load(path, weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    hparams.update(hparams.pop("decoding"))  # flat, as before
    hparams.update(beam_size=2, max_len_b=4, no_repeat_ngram_size=1)
    old = tmp_path / "flat.ckpt"
    torch.save(checkpoint, old)
    translator = Translator.from_checkpoint(old, device="cpu")
    expected = module.decoding.replace(beam_size=2, max_len_b=4, no_repeat_ngram_size=1)
    assert translator.decoding == expected
    got = translator.translate(SENTENCES, return_scores=True)
    assert got == Translator.from_checkpoint(path, device="cpu").translate(
        SENTENCES, return_scores=True, beam_size=2, max_len_b=4, no_repeat_ngram_size=1
    )
    assert got != Translator.from_checkpoint(path).translate(SENTENCES, return_scores=True)
    loaded = TranslationModule.load_from_checkpoint(old, weights_only=True)
    assert loaded.decoding == expected
    assert loaded.hparams["decoding"] == expected.to_dict()


def test_a_cpu_translator_keeps_freed_memory_for_reuse(saved, monkeypatch):
    """CPU decoding takes the ``heap`` trick (seq2seq.nn.fast), which changes no
    translation."""
    from seq2seq.nn import fast

    path, _ = saved
    with fast.enabled(False, "heap"):  # glibc's settings last for the process: plain first
        plain = Translator.from_checkpoint(path, device="cpu").translate(SENTENCES, 3)
    calls = []
    keep = fast.keep_freed_heap
    monkeypatch.setattr(fast, "keep_freed_heap", lambda: calls.append(keep()) or calls[-1])
    translator = Translator.from_checkpoint(path, device="cpu")
    assert len(calls) == 1
    assert translator.translate(SENTENCES, beam_size=3) == plain


@pytest.mark.parametrize(
    ("stage", "precision", "device", "kept"),
    [
        ("fit", "32-true", "cpu", False),  # float32 training: not measured to pay
        ("fit", "bf16-mixed", "cpu", True),
        ("validate", "32-true", "cpu", True),
        ("test", "32-true", "cpu", True),
        ("predict", "bf16-mixed", "cpu", True),
        ("test", "32-true", "cuda", False),
    ],
)
def test_cpu_decoding_stages_and_bfloat16_fits_keep_freed_memory(stage, precision, device, kept):
    from types import SimpleNamespace

    from seq2seq.module import _keeps_freed_heap

    trainer = SimpleNamespace(
        precision=precision,
        strategy=SimpleNamespace(root_device=torch.device(device)),
    )
    assert _keeps_freed_heap(trainer, stage) is kept


def test_a_lone_surrogate_is_refused_naming_the_sentence(saved):
    """Text decoded with errors="surrogateescape" keeps each byte that was no UTF-8 as a lone
    surrogate, which SentencePiece refuses with a TypeError naming no sentence."""
    translator = Translator.from_checkpoint(saved[0], device="cpu")
    with pytest.raises(ValueError, match=r"sentence 1 \(counting from 0\) holds U\+DCFC, a lone"):
        translator.translate(["Ein Hund.", "Gr\udcfc\udcdfe"])
    with pytest.raises(ValueError, match=r"sentence 0 .* U\+DCFC"):
        translator.score(["Ein Hund."], ["Gr\udcfc\udcdfe"])
