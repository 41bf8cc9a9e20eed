"""seq2seq export: CTranslate2 and Hugging Face folders reproduce our model and search.

The tiny run of ``configs/tiny.yaml`` (Pre-LN, relu, sinusoids, tied embeddings) is the main
subject; Post-LN, gelu, silu, learned-position, fairseq-position, untied, unscaled, output-bias
and rotary variants are built from its tokenizer with fresh weights (their checkpoints hold
what ``seq2seq fit`` stores).
"""

from __future__ import annotations

import gzip
import importlib
import os
import stat
import warnings
from pathlib import Path

import pytest
import torch
from conftest import MULTI30K, run_main

from seq2seq.export.common import MARKER
from seq2seq.translator import Translator

ctranslate2 = pytest.importorskip("ctranslate2")
transformers = pytest.importorskip("transformers")


def _lines(n: int, split: str = "val") -> list[str]:
    with gzip.open(MULTI30K / f"{split}.de.gz", "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_ckpt(tiny_run) -> Path:
    return tiny_run / "checkpoints" / "tiny" / "last.ckpt"


@pytest.fixture(scope="module")
def ours(tiny_ckpt) -> Translator:
    return Translator.from_checkpoint(tiny_ckpt, device="cpu")


@pytest.fixture(scope="module")
def ct2_dir(tiny_ckpt, tmp_path_factory) -> Path:
    from seq2seq.export.ctranslate2 import export_ctranslate2

    return export_ctranslate2(tiny_ckpt, tmp_path_factory.mktemp("export") / "ct2")


@pytest.fixture(scope="module")
def hf_dir(tiny_ckpt, tmp_path_factory) -> Path:
    from seq2seq.export.huggingface import export_huggingface

    return export_huggingface(tiny_ckpt, tmp_path_factory.mktemp("export") / "hf")


def _variant(tiny_ckpt: Path, path: Path, **settings) -> Path:
    """A checkpoint of the tiny run's tokenizer and settings changed by ``settings``, with
    fresh (seeded) weights, stored as ``seq2seq fit`` stores a model."""
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.module import TranslationModule

    base = load_checkpoint(tiny_ckpt)
    config = {**base["seq2seq"]["model_config"], **settings}
    torch.manual_seed(0)
    module = TranslationModule(**config)
    with torch.no_grad():  # LayerNorms away from (1, 0), the output bias from 0, so that
        for name, p in module.named_parameters():  # their export is checked too
            if "norm" in name or "output_bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    checkpoint = {
        "state_dict": module.state_dict(),
        "hyper_parameters": {**base["hyper_parameters"], **settings},
        "datamodule_hyper_parameters": base["datamodule_hyper_parameters"],
        "seq2seq": {"model_config": config, "tokenizer": base["seq2seq"]["tokenizer"]},
    }
    torch.save(checkpoint, path)
    return path


def _our_log_probs(translator: Translator, src: list[int], tgt: list[int]) -> torch.Tensor:
    """``(T + 1,)`` log-probabilities of ``tgt + [EOS]`` given ``src`` (EOS-terminated)."""
    tok = translator.module.tokenizer
    with torch.no_grad():
        logits = translator.module.model(torch.tensor([src]), torch.tensor([[tok.bos_id, *tgt]]))
    log_probs = torch.log_softmax(logits[0].double(), dim=-1)
    return log_probs.gather(1, torch.tensor([[*tgt, tok.eos_id]]).T).squeeze(1)


def _ct2_scores(folder: Path, translator: Translator, pairs) -> list[list[float]]:
    model = ctranslate2.Translator(str(folder), device="cpu")
    tok = translator.module.tokenizer
    src = [tok.id_to_piece(s[:-1]) for s, _ in pairs]  # CTranslate2 appends EOS itself
    tgt = [tok.id_to_piece(t) for _, t in pairs]
    return [r.log_probs for r in model.score_batch(src, tgt)]


def _pairs(translator: Translator, n: int = 16) -> list[tuple[list[int], list[int]]]:
    tok = translator.module.tokenizer
    src = translator.encode(_lines(n))
    with gzip.open(MULTI30K / "val.en.gz", "rt", encoding="utf-8") as f:
        tgt = tok.encode([next(f).rstrip("\n") for _ in range(n)])
    return list(zip(src, tgt, strict=True))


def test_ctranslate2_scores_are_our_log_probabilities(ours, ct2_dir):
    pairs = _pairs(ours)
    for (src, tgt), theirs in zip(pairs, _ct2_scores(ct2_dir, ours, pairs), strict=True):
        expected = _our_log_probs(ours, src, tgt)
        assert len(theirs) == len(tgt) + 1
        torch.testing.assert_close(
            torch.tensor(theirs, dtype=torch.float64), expected, atol=1e-4, rtol=0
        )


def _ct2_scores_are_ours(ckpt, output):
    """Exports ``ckpt`` to CTranslate2 at ``output`` and checks that its token scores of 6
    (source, target) pairs are our log-probabilities; returns our translator and the folder."""
    from seq2seq.export.ctranslate2 import export_ctranslate2

    translator = Translator.from_checkpoint(ckpt, device="cpu")
    folder = export_ctranslate2(ckpt, output)
    pairs = _pairs(translator, 6)
    for (src, tgt), theirs in zip(pairs, _ct2_scores(folder, translator, pairs), strict=True):
        torch.testing.assert_close(
            torch.tensor(theirs, dtype=torch.float64),
            _our_log_probs(translator, src, tgt),
            atol=1e-4,
            rtol=0,
        )
    return translator, folder


@pytest.mark.parametrize(
    "settings",
    [
        dict(norm_first=False, activation="gelu"),
        dict(positional="learned", tie_embeddings="none"),
    ],
    ids=["post_ln_gelu", "learned_untied"],
)
def test_ctranslate2_reproduces_other_architectures(tiny_ckpt, tmp_path, settings):

    ckpt = _variant(tiny_ckpt, tmp_path / "variant.ckpt", **settings)
    translator, folder = _ct2_scores_are_ours(ckpt, tmp_path / "ct2")


def test_ctranslate2_greedy_and_beam_output_is_ours(ours, ct2_dir):
    """Greedy with the checkpoint's settings; beam 5 with ``length_penalty=0``, where our
    stopping rule and CTranslate2's (stop at ``beam_size`` finished hypotheses) provably
    return the same best hypothesis (log-probabilities only decrease)."""
    lines = _lines(60)
    theirs = Translator.from_checkpoint(ct2_dir, device="cpu")
    for beam, decoding in ((1, {}), (5, {"length_penalty": 0.0})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # lines cut at max_positions
            a = theirs.translate(lines, beam_size=beam, return_scores=True, **decoding)
            b = ours.translate(lines, beam_size=beam, return_scores=True, **decoding)
        assert [h[0][0] for h in a] == [h[0][0] for h in b]
        for x, y in zip(a, b, strict=True):
            assert x[0][1] == pytest.approx(y[0][1], abs=1e-4)


def test_ctranslate2_int8_export_is_smaller_and_translates(tiny_ckpt, ct2_dir, tmp_path):
    from seq2seq.export.ctranslate2 import export_ctranslate2

    folder = export_ctranslate2(tiny_ckpt, tmp_path / "int8", quantization="int8")
    assert (folder / "model.bin").stat().st_size < (ct2_dir / "model.bin").stat().st_size
    lines = _lines(8)
    out = Translator.from_checkpoint(folder, device="cpu").translate(lines, beam_size=2)
    assert len(out) == len(lines) and all(isinstance(t, str) for t in out)


def _hf(folder: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def _assert_same_logits(translator: Translator, model) -> None:
    tok = translator.module.tokenizer
    for src, tgt in _pairs(translator, 6):
        tgt_in = torch.tensor([[tok.bos_id, *tgt]])
        with torch.no_grad():
            expected = translator.module.model(torch.tensor([src]), tgt_in)
            logits = model(input_ids=torch.tensor([src]), decoder_input_ids=tgt_in).logits
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_huggingface_logits_and_tokenizer_are_ours(ours, hf_dir):
    model, tokenizer = _hf(hf_dir)
    assert type(model).__name__ == "PegasusForConditionalGeneration"  # Pre-LN, final norms
    _assert_same_logits(ours, model)
    lines = _lines(200) + _lines(50, "test_2016_flickr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # lines cut at max_positions
        expected = ours.encode(lines)
    assert tokenizer(lines, truncation=True)["input_ids"] == expected  # cut as ours too


def test_huggingface_post_ln_export_is_marian_with_our_logits(tiny_ckpt, tmp_path):
    from seq2seq.export.huggingface import export_huggingface

    ckpt = _variant(tiny_ckpt, tmp_path / "post.ckpt", norm_first=False, activation="gelu")
    model, _ = _hf(export_huggingface(ckpt, tmp_path / "hf"))
    assert type(model).__name__ == "MarianMTModel"
    _assert_same_logits(Translator.from_checkpoint(ckpt, device="cpu"), model)


# Each new option in a class of its own: Pegasus (Pre-LN), Marian (Post-LN), M2M-100 (fairseq).
NEW_OPTIONS = {
    "pegasus_silu_unscaled_bias": dict(activation="silu", scale_embedding=False, output_bias=True),
    "marian_silu_bias": dict(norm_first=False, activation="silu", output_bias=True),
    "m2m100_fairseq": dict(positional="sinusoidal_fairseq", activation="gelu"),
    "m2m100_fairseq_silu_unscaled": dict(
        positional="sinusoidal_fairseq", activation="silu", scale_embedding=False
    ),
}
HF_CLASS = {
    "pegasus": "PegasusForConditionalGeneration",
    "marian": "MarianMTModel",
    "m2m100": "M2M100ForConditionalGeneration",
}


@pytest.mark.parametrize("name", sorted(NEW_OPTIONS))
def test_ctranslate2_reproduces_the_new_options(tiny_ckpt, tmp_path, name):
    """silu, unscaled embeddings, an output bias and fairseq's positions: CTranslate2's scores
    are our log-probabilities, its greedy output is ours."""

    ckpt = _variant(tiny_ckpt, tmp_path / "variant.ckpt", **NEW_OPTIONS[name])
    translator, folder = _ct2_scores_are_ours(ckpt, tmp_path / "ct2")
    lines = _lines(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # lines cut at max_positions
        got = Translator.from_checkpoint(folder, device="cpu").translate(lines, beam_size=1)
        assert got == translator.translate(lines, beam_size=1)


@pytest.mark.parametrize("name", sorted(NEW_OPTIONS))
def test_huggingface_reproduces_the_new_options(tiny_ckpt, tmp_path, name):
    """The class each option is exported as gives our logits (its ids: ``vocabulary_order``)
    also for right-padded batches, its tokenizer our ids, and greedy ``generate`` our
    translations."""
    from seq2seq.export.huggingface import (
        export_huggingface,
        generate_translations,
        vocabulary_order,
    )
    from seq2seq.nn import padding_mask

    ckpt = _variant(tiny_ckpt, tmp_path / "variant.ckpt", **NEW_OPTIONS[name])
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    model, tokenizer = _hf(export_huggingface(ckpt, tmp_path / "hf"))
    assert type(model).__name__ == HF_CLASS[name.split("_")[0]]
    hf_ids = torch.tensor(vocabulary_order(translator.module.model.config.to_dict()))
    assert (hf_ids[:4].tolist() == [1, 3, 0, 2]) == name.startswith("m2m100")
    pad, bos = translator.module.tokenizer.pad_id, translator.module.tokenizer.bos_id
    pairs = _pairs(translator, 6)
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s, _ in pairs], True, pad)
    tgt = torch.nn.utils.rnn.pad_sequence([torch.tensor([bos, *t]) for _, t in pairs], True, pad)
    with torch.no_grad():
        expected = translator.module.model(src, tgt, padding_mask(src, pad))
        logits = model(
            input_ids=hf_ids[src], attention_mask=src != pad, decoder_input_ids=hf_ids[tgt]
        ).logits[..., hf_ids]  # column i: our id i
    real = tgt != pad
    torch.testing.assert_close(logits[real], expected[real], atol=1e-5, rtol=0)
    lines = _lines(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ours = translator.encode(lines)
        assert tokenizer(lines, truncation=True)["input_ids"] == [hf_ids[x].tolist() for x in ours]
        got = generate_translations(model, tokenizer, lines, 1, **_lengths(translator))
        assert got == translator.translate(lines, beam_size=1)


def _lengths(translator: Translator) -> dict:
    return {k: getattr(translator.decoding, k) for k in ("max_len_a", "max_len_b", "min_len")}


def test_huggingface_generate_is_our_search(ours, hf_dir):
    from seq2seq.export.huggingface import generate_translations

    model, tokenizer = _hf(hf_dir)
    settings = {k: getattr(ours.decoding, k) for k in ("max_len_a", "max_len_b", "min_len")}
    lines = _lines(24)  # generate is slow on the tiny model's long, repetitive outputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for beam in (1, 5):
            expected = ours.translate(lines, beam_size=beam, length_penalty=1.0)
            got = generate_translations(
                model, tokenizer, lines, beam, length_penalty=1.0, **settings
            )
            assert got == expected
        # without limits: the checkpoint's, from the folder's seq2seq_export.json
        assert (ours.decoding.max_len_a, ours.decoding.max_len_b) != (1.2, 10)  # not defaults
        assert generate_translations(model, tokenizer, lines, 1, length_penalty=1.0) == (
            ours.translate(lines, beam_size=1, length_penalty=1.0)
        )
    assert model.generation_config.num_beams == ours.decoding.beam_size
    assert model.generation_config.decoder_start_token_id == ours.module.tokenizer.bos_id


def test_huggingface_translation_pipeline_runs(hf_dir):
    """``pipeline("translation")`` where the installed transformers has it (4.x); 5.x removed
    the task, and says so."""
    if "translation" in transformers.pipelines.SUPPORTED_TASKS:
        out = transformers.pipeline("translation", model=str(hf_dir))("Ein Mann fährt Fahrrad.")
        assert isinstance(out[0]["translation_text"], str)
    else:
        with pytest.raises(KeyError, match="translation has been removed"):
            transformers.pipeline("translation", model=str(hf_dir))
        model, tokenizer = _hf(hf_dir)
        batch = tokenizer(["Ein Mann fährt Fahrrad."], return_tensors="pt")
        text = tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)
        assert isinstance(text[0], str) and text[0]


def test_translate_through_a_ctranslate2_folder_keeps_the_output_formats(
    tiny_ckpt, ct2_dir, tmp_path, monkeypatch, capsys
):
    source = tmp_path / "in.de"
    long_line = " ".join(["Hund"] * 80)  # cut at max_positions, with a warning
    source.write_text("\n".join([*_lines(12), long_line, ""]) + "\n", encoding="utf-8")
    for flags in (
        ["--beam_size", "1", "--scores"],
        ["--beam_size", "3", "--n_best", "3", "--length_penalty", "0"],
    ):
        rows = {}
        for path in (tiny_ckpt, ct2_dir):
            code, out, err = run_main(
                monkeypatch,
                capsys,
                "translate",
                "--ckpt_path",
                str(path),
                "--input",
                str(source),
                *flags,
            )
            assert code in (0, None)
            assert err == [
                "seq2seq: warning: input line 13 has 81 tokens (with EOS), more "
                "than the model's max_positions=64; truncated to 64"
            ]
            rows[path] = [line.split("\t") for line in out.splitlines()]
        ckpt_rows, ct2_rows = rows[tiny_ckpt], rows[ct2_dir]
        assert len(ct2_rows) == len(ckpt_rows) == 14 * (3 if "--n_best" in flags else 1)
        for a, b in zip(ct2_rows, ckpt_rows, strict=True):
            assert len(a) == len(b)
            assert a[:-2] == b[:-2] and a[-1] == b[-1]  # index, text
            assert float(a[-2]) == pytest.approx(float(b[-2]), abs=2e-4)  # score


def test_translate_says_which_option_ctranslate2_lacks(ct2_dir, tmp_path, monkeypatch, capsys):
    source = tmp_path / "in.de"
    source.write_text("Ein Hund.\n", encoding="utf-8")
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "translate",
        "--ckpt_path",
        str(ct2_dir),
        "--input",
        str(source),
        "--length_penalty_form",
        "gnmt",
    )
    assert code == 1 and len(err) == 1
    assert "length_penalty_form 'gnmt' has no CTranslate2 equivalent" in err[0]


@pytest.mark.parametrize(
    ("fmt", "settings", "named"),
    [
        ("ctranslate2", dict(positional="rotary"), ["model.positional='rotary'"]),
        ("huggingface", dict(positional="rotary"), ["model.positional='rotary'"]),
        ("huggingface", dict(positional="learned"), ["model.positional='learned'"]),
        (
            "huggingface",
            dict(positional="sinusoidal_fairseq", norm_first=False, output_bias=True),
            ["model.positional='sinusoidal_fairseq'", "model.output_bias=True"],
        ),
        (
            "huggingface",
            dict(positional="learned", tie_embeddings="decoder"),
            ["model.positional='learned'", "model.tie_embeddings='decoder'"],
        ),
    ],
)
def test_export_refuses_what_an_engine_cannot_represent(
    tiny_ckpt, tmp_path, monkeypatch, capsys, fmt, settings, named
):
    ckpt = _variant(tiny_ckpt, tmp_path / "variant.ckpt", **settings)
    output = tmp_path / "out"
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "export",
        "--ckpt_path",
        str(ckpt),
        "--format",
        fmt,
        "--output",
        str(output),
    )
    assert code == 1 and len(err) == 1 and err[0].startswith("seq2seq: error: ")
    for name in named:
        assert name in err[0]
    assert not output.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["variant.ckpt"]  # no staging folder left


def test_export_replaces_only_its_own_output_folder(tiny_ckpt, tmp_path, monkeypatch, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "export",
        "--ckpt_path",
        str(tiny_ckpt),
        "--format",
        "ctranslate2",
        "--output",
        str(foreign),
    )
    assert code == 2 and "was not written by seq2seq export" in err[-1]
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]

    own = tmp_path / "own"
    for fmt in ("ctranslate2", "huggingface"):  # the second export replaces the first
        code, out, err = run_main(
            monkeypatch,
            capsys,
            "export",
            "--ckpt_path",
            str(tiny_ckpt),
            "--format",
            fmt,
            "--output",
            str(own),
        )
        assert code in (0, None) and f"({fmt})" in out
        assert (own / MARKER).is_file()
    assert err[-1] == (
        f"seq2seq: note: it replaces the ctranslate2 export of {tiny_ckpt} that {own} held"
    )
    assert not any("Writing model shards" in line for line in err), err  # transformers' bar
    assert (own / "config.json").is_file() and not (own / "model.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "own"]


def test_export_says_which_weights_it_wrote(tiny_ckpt, tmp_path, monkeypatch, capsys):
    code, out, _ = run_main(
        monkeypatch, capsys, "export", "--ckpt_path", str(tiny_ckpt), "--format", "ctranslate2",
        "--output", str(tmp_path / "int8"), "--quantization", "int8",
    )  # fmt: skip
    assert code in (0, None) and out.rstrip().endswith("(ctranslate2, int8 weights)")
    assert out.startswith(f"exported {tiny_ckpt} to ")
    # a checkpoint of a run with EMA: its moving average is what is exported, and named
    ema = tmp_path / "ema.ckpt"
    checkpoint = torch.load(tiny_ckpt, weights_only=False)
    checkpoint["ema"] = {"decay": 0.999, "updates": 12}
    torch.save(checkpoint, ema)
    code, out, _ = run_main(
        monkeypatch, capsys, "export", "--ckpt_path", str(ema), "--format", "ctranslate2",
        "--output", str(tmp_path / "ema"),
    )  # fmt: skip
    assert out.startswith(f"exported the EMA weights (decay 0.999, 12 updates) of {ema} to ")


def test_export_without_the_extra_names_it(tiny_ckpt, tmp_path, monkeypatch, capsys):
    real = importlib.import_module

    def import_module(name, *args, **kwargs):
        if name in ("ctranslate2", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", import_module)
    for fmt, module in (("ctranslate2", "ctranslate2"), ("huggingface", "transformers")):
        code, _, err = run_main(
            monkeypatch,
            capsys,
            "export",
            "--ckpt_path",
            str(tiny_ckpt),
            "--format",
            fmt,
            "--output",
            str(tmp_path / fmt),
        )
        assert code == 2
        assert f"needs the {module} package" in err[-1] and ".[export]" in err[-1]
        assert not (tmp_path / fmt).exists()


def test_translate_with_a_ctranslate2_folder_without_the_extra_names_it(
    ct2_dir, tmp_path, monkeypatch, capsys
):
    real = importlib.import_module

    def import_module(name, *args, **kwargs):
        if name == "ctranslate2":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", import_module)
    source = tmp_path / "in.de"
    source.write_text("Ein Mann.\n", encoding="utf-8")
    code, _, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", str(ct2_dir), "--input", str(source)
    )
    assert code == 1
    assert len(err) == 1 and "needs the ctranslate2 package" in err[0] and ".[export]" in err[0]


def test_exported_folders_follow_the_umask(tiny_ckpt, tmp_path):
    from seq2seq.export.ctranslate2 import export_ctranslate2
    from seq2seq.export.huggingface import export_huggingface

    old = os.umask(0o022)
    try:
        folders = [
            export_ctranslate2(tiny_ckpt, tmp_path / "ct2"),
            export_huggingface(tiny_ckpt, tmp_path / "hf"),
        ]
    finally:
        os.umask(old)
    for folder in folders:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
        for path in folder.rglob("*"):
            assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path


def test_engines_benchmark_runs(tiny_ckpt, tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import engines
    finally:
        sys.path.pop(0)
    rows = engines.main(
        [
            *("--ckpt", str(tiny_ckpt), "--data_dir", str(MULTI30K), "--limit", "6"),
            *("--engines", "seq2seq,ct2-float32,ct2-int8", "--beams", "1"),
            *("--threads", "1", "--work_dir", str(tmp_path)),
        ]
    )
    by_engine = {r["engine"]: r for r in rows}
    assert set(by_engine) == {"seq2seq", "ct2-float32", "ct2-int8"}
    assert by_engine["ct2-float32"]["identical"] == 6  # greedy: the same search
    assert all(r["n"] == 6 and r["sent_per_s"] > 0 for r in rows)


def test_ctranslate2_prefixes_and_ngram_blocking_are_ours_and_sampling_is_refused(ours, ct2_dir):
    lines = _lines(12)
    theirs = Translator.from_checkpoint(ct2_dir, device="cpu")
    prefixes = ["A man", "", "Two", "A woman"] * 3
    for decoding in ({"prefixes": prefixes}, {"no_repeat_ngram_size": 2}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # lines cut at max_positions
            a = theirs.translate(lines, beam_size=1, **decoding)
            b = ours.translate(lines, beam_size=1, **decoding)
        assert a == b, decoding
        if "prefixes" in decoding:
            assert all(text.startswith(p) for text, p in zip(a, prefixes, strict=True))
    with pytest.raises(
        ValueError, match="^sampling_topk: sampling is not offered through CTranslate2"
    ):
        theirs.translate(lines, sampling_topk=5)
    with pytest.raises(ValueError, match="^sampling: sampling is not offered through CTranslate2"):
        Translator.from_checkpoint(ct2_dir, device="cpu", sampling=True)


# ------------------------------------------------------------------------ repetition penalty
def _our_search(translator: Translator, lines: list[str], config):
    """Our greedy (``beam_size`` 1) or beam search over the checkpoint's model, all ``lines``
    in one batch: the best hypothesis of each."""
    from seq2seq.nn import beam_search, greedy_search
    from seq2seq.text_decoding import source_batch

    tok = translator.module.tokenizer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # lines cut at max_positions
        batch = source_batch(translator.encode(lines), tok.pad_id)
    search = greedy_search if config.beam_size == 1 else beam_search
    hyps = search(
        translator.module.model, batch["src"], batch["src_mask"], tok.bos_id, tok.eos_id, config
    )
    return [h[0] for h in hyps]


def _hf_ids(model, tokenizer, lines: list[str], config) -> list[list[int]]:
    """``generate`` with the settings of ``config`` (whose lengths must not depend on the
    source: ``max_len_a=0``), one batch: the generated ids without BOS, EOS and padding."""
    batch = tokenizer(lines, truncation=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **batch,
            num_beams=config.beam_size,
            length_penalty=config.length_penalty,
            max_new_tokens=config.max_len_b,
            min_new_tokens=config.min_len or None,
            repetition_penalty=config.repetition_penalty,
            do_sample=False,
        )
    eos, pad = model.generation_config.eos_token_id, model.generation_config.pad_token_id
    ids = []
    for row in out[:, 1:].tolist():
        row = row[: row.index(eos)] if eos in row else row
        ids.append([t for t in row if t != pad])
    return ids


def _penalise_as_hugging_face_beam_search(monkeypatch, bos_id: int) -> None:
    """Our searches with the penalty where ``generate``'s beam search applies it: after the
    log-softmax (to log-probabilities, not renormalised), counting the decoder's start token."""
    from seq2seq.nn import rules

    original = rules.StepRules.log_probs

    def log_probs(
        self, model, tokens, memory, mask, cache, step, sentence, history, normalise=True
    ):
        penalty, self.penalty = self.penalty, 1.0
        try:
            scores = original(
                self, model, tokens, memory, mask, cache, step, sentence, None, normalise
            )
        finally:
            self.penalty = penalty
        start = torch.full((scores.size(0), 1), bos_id)
        seen = start if history is None else torch.cat([start, history], dim=1)
        return rules.penalise_repetitions(scores, seen, penalty)

    monkeypatch.setattr(rules.StepRules, "log_probs", log_probs)


def test_ctranslate2_repetition_penalty_is_ours(ours, ct2_dir):
    """Greedy with the checkpoint's settings and beam 5 with ``length_penalty=0`` (see
    test_ctranslate2_greedy_and_beam_output_is_ours): the same texts and scores with a
    penalty, which changes them."""

    lines = _lines(60)
    theirs = Translator.from_checkpoint(ct2_dir, device="cpu")
    tok = ours.module.tokenizer
    checkpoint = ours.decoding
    for beam, decoding in ((1, {}), (5, {"length_penalty": 0.0})):
        plain = None
        for penalty in (1.0, 1.3, 2.5):
            config = checkpoint.replace(beam_size=beam, repetition_penalty=penalty, **decoding)
            expected = _our_search(ours, lines, config)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                got = theirs.translate(
                    lines, beam_size=beam, return_scores=True, repetition_penalty=penalty,
                    **decoding,
                )  # fmt: skip
            assert [h[0][0] for h in got] == tok.decode([h.tokens for h in expected])
            assert [h[0][1] for h in got] == pytest.approx([h.score for h in expected], abs=1e-4)
            if penalty == 1.0:
                plain = [h.tokens for h in expected]
            else:  # the penalty changes the outputs, so the agreement says something
                assert [h.tokens for h in expected] != plain
    with pytest.raises(ValueError, match=r"^repetition_penalty must be a finite number > 0"):
        theirs.translate(lines[:2], repetition_penalty=0.0)
    with pytest.raises(ValueError, match=r"^repetition_penalty must be a finite number > 0"):
        Translator.from_checkpoint(ct2_dir, device="cpu", repetition_penalty=-1.0)


def test_huggingface_generate_with_a_repetition_penalty(ours, hf_dir, monkeypatch):
    """Greedy: ``generate`` is our search, token for token. Beam search: ``generate`` applies the
    penalty after its log-softmax (and counts the start token), where we apply it to the logits;
    its beams are ours with the penalty moved there, and differ from ours with our own rule."""
    from seq2seq.nn import DecodingConfig

    model, tokenizer = _hf(hf_dir)
    lines = _lines(24)
    fixed = DecodingConfig(max_len_a=0.0, max_len_b=30, length_penalty=1.0)
    differ = False
    for penalty in (1.3, 2.0):
        greedy = fixed.replace(beam_size=1, repetition_penalty=penalty)
        assert _hf_ids(model, tokenizer, lines, greedy) == [
            h.tokens for h in _our_search(ours, lines, greedy)
        ]
        beam = fixed.replace(beam_size=5, repetition_penalty=penalty)
        hf_beams = _hf_ids(model, tokenizer, lines, beam)
        differ |= hf_beams != [h.tokens for h in _our_search(ours, lines, beam)]
        with monkeypatch.context() as patched:
            _penalise_as_hugging_face_beam_search(patched, ours.module.tokenizer.bos_id)
            assert hf_beams == [h.tokens for h in _our_search(ours, lines, beam)]
    assert differ  # the two rules do give other beams here


def test_exports_carry_the_checkpoints_repetition_penalty(ours, tiny_ckpt, tmp_path):
    """A checkpoint's ``repetition_penalty`` (nested ``decoding`` hyperparameters) becomes the
    Hugging Face generation config's and the CTranslate2 folder's default."""
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.export.common import read_marker
    from seq2seq.export.ctranslate2 import export_ctranslate2
    from seq2seq.export.huggingface import export_huggingface
    from seq2seq.nn import DecodingConfig

    checkpoint = load_checkpoint(tiny_ckpt)
    hparams = dict(checkpoint["hyper_parameters"])
    hparams["decoding"] = (
        DecodingConfig.from_dict(hparams).replace(repetition_penalty=1.7).to_dict()
    )
    checkpoint["hyper_parameters"] = hparams
    ckpt = tmp_path / "penalised.ckpt"
    torch.save(checkpoint, ckpt)

    hf_folder = export_huggingface(ckpt, tmp_path / "hf")
    model, tokenizer = _hf(hf_folder)
    assert model.generation_config.repetition_penalty == 1.7
    assert "repetition_penalty" in read_marker(hf_folder)["note"]  # beam_size 5 here
    batch = tokenizer(_lines(4), truncation=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        default = model.generate(**batch, num_beams=1, max_new_tokens=20)
        asked = model.generate(**batch, num_beams=1, max_new_tokens=20, repetition_penalty=1.7)
        unpenalised = model.generate(
            **batch, num_beams=1, max_new_tokens=20, repetition_penalty=1.0
        )
    assert torch.equal(default, asked) and not torch.equal(default, unpenalised)

    ct2_folder = export_ctranslate2(ckpt, tmp_path / "ct2")
    assert read_marker(ct2_folder)["decoding"]["repetition_penalty"] == 1.7
    theirs = Translator.from_checkpoint(ct2_folder, device="cpu")
    lines = _lines(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        default = theirs.translate(lines, beam_size=1)
        assert default == theirs.translate(lines, beam_size=1, repetition_penalty=1.7)
        assert default != theirs.translate(lines, beam_size=1, repetition_penalty=1.0)


def test_huggingface_export_carries_no_repeat_ngram_size(ours, tiny_ckpt, tmp_path):
    """A checkpoint's ``no_repeat_ngram_size`` is the generation config's: ``generate`` (the
    one-line call and ``generate_translations``) bans the n-grams ours does."""
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.export.huggingface import export_huggingface, generate_translations
    from seq2seq.nn import DecodingConfig

    checkpoint = load_checkpoint(tiny_ckpt)
    hparams = dict(checkpoint["hyper_parameters"])
    decoding = DecodingConfig.from_dict(hparams).replace(no_repeat_ngram_size=2)
    checkpoint["hyper_parameters"] = {**hparams, "decoding": decoding.to_dict()}
    torch.save(checkpoint, tmp_path / "ngram.ckpt")
    blocked = Translator.from_checkpoint(tmp_path / "ngram.ckpt", device="cpu")
    model, tokenizer = _hf(export_huggingface(tmp_path / "ngram.ckpt", tmp_path / "hf"))
    assert model.generation_config.no_repeat_ngram_size == 2
    lines = _lines(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = blocked.translate(lines, beam_size=1)
        assert expected != blocked.translate(lines, beam_size=1, no_repeat_ngram_size=0)
        batch = tokenizer(lines[:1], return_tensors="pt", truncation=True)
        out = model.generate(**batch, num_beams=1, max_new_tokens=12)
        one = blocked.translate(lines[:1], beam_size=1, max_len_a=0, max_len_b=12)
        assert tokenizer.batch_decode(out, skip_special_tokens=True) == [one[0].rstrip()]
        for beam in (1, 5):  # no_repeat_ngram_size from the generation config
            got = generate_translations(
                model, tokenizer, lines, beam, length_penalty=1.0, **_lengths(blocked)
            )
            expected = blocked.translate(lines, beam_size=beam, length_penalty=1.0)
            # the same ids; MarianTokenizer drops the spaces of trailing "▁" pieces that
            # SentencePiece's decoding keeps
            assert got == [text.rstrip() for text in expected]
        unblocked = generate_translations(
            model, tokenizer, lines, 1, no_repeat_ngram_size=0, **_lengths(blocked)
        )
        assert unblocked == [
            t.rstrip() for t in blocked.translate(lines, no_repeat_ngram_size=0, beam_size=1)
        ]


# ------------------------------------------------------------------------ disable_unk
def _unk_favoured(ours: Translator, tiny_ckpt: Path, path: Path) -> Path:
    """The tiny run with ``disable_unk`` set and the unknown token made the model's favourite:
    its (tied) embedding row is that of the piece the model repeats, 5% longer, so that without
    the ban the outputs are ``⁇``."""
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.nn import DecodingConfig

    unk = ours.module.tokenizer.unk_id
    repeated = _our_search(ours, _lines(1), ours.decoding.replace(beam_size=1))[0].tokens[0]
    checkpoint = load_checkpoint(tiny_ckpt)
    state = checkpoint["state_dict"]
    for key in ("model.encoder.embed.weight", "model.decoder.embed.weight", "model.output.weight"):
        state[key] = state[key].clone()
        state[key][unk] = 1.05 * state[key][repeated]
    hparams = dict(checkpoint["hyper_parameters"])
    hparams["decoding"] = DecodingConfig.from_dict(hparams).replace(disable_unk=True).to_dict()
    checkpoint["hyper_parameters"] = hparams
    torch.save(checkpoint, path)
    return path


def test_exports_carry_the_checkpoints_disable_unk(ours, tiny_ckpt, tmp_path):
    """A checkpoint's ``disable_unk`` becomes CTranslate2's ``disable_unk`` (greedy texts ours;
    it bans before its softmax, so its scores are higher) and the unknown token joins the
    Hugging Face generation config's ``suppress_tokens`` (greedy and beam texts ours)."""
    from seq2seq.export.ctranslate2 import export_ctranslate2
    from seq2seq.export.huggingface import export_huggingface, generate_translations

    ckpt = _unk_favoured(ours, tiny_ckpt, tmp_path / "unk.ckpt")
    favoured = Translator.from_checkpoint(ckpt, device="cpu")
    ct2 = Translator.from_checkpoint(export_ctranslate2(ckpt, tmp_path / "ct2"), device="cpu")
    model, tokenizer = _hf(export_huggingface(ckpt, tmp_path / "hf"))
    tok = favoured.module.tokenizer
    assert favoured.decoding.disable_unk and ct2.decoding.disable_unk
    assert model.generation_config.suppress_tokens == [tok.pad_id, tok.unk_id]  # Pegasus: our ids
    lines = _lines(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # lines cut at max_positions
        for translator in (favoured, ct2):  # the ban has work to do
            assert all("⁇" in text for text in translator.translate(lines, disable_unk=False))
        expected = favoured.translate(lines, beam_size=1, return_scores=True)
        got = ct2.translate(lines, beam_size=1, return_scores=True)
        assert [h[0][0] for h in got] == [h[0][0] for h in expected]
        assert not any("⁇" in h[0][0] for h in got)
        assert all(g[0][1] > e[0][1] for g, e in zip(got, expected, strict=True))
        for beam in (1, 5):
            texts = generate_translations(
                model, tokenizer, lines, beam, length_penalty=1.0, **_lengths(favoured)
            )
            assert texts == favoured.translate(lines, beam_size=beam, length_penalty=1.0)


def test_a_checkpoint_older_than_the_new_options_exports_with_their_defaults(tiny_ckpt, tmp_path):
    """A checkpoint whose settings predate ``scale_embedding`` and ``output_bias`` (and the
    other newer fields) is read with their defaults, the behaviour it was trained with."""
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.export.common import read_checkpoint

    checkpoint = load_checkpoint(tiny_ckpt)
    new = ("scale_embedding", "output_bias")
    for settings in (checkpoint["seq2seq"]["model_config"], checkpoint["hyper_parameters"]):
        for key in new:
            settings.pop(key, None)
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    config = read_checkpoint(old).config
    assert {key: config[key] for key in new} == {"scale_embedding": True, "output_bias": False}
    assert config == read_checkpoint(tiny_ckpt).config


def test_ctranslate2_batches_many_lengths_and_keeps_each_sentences_limit(ours, ct2_dir):
    """Sentences of different lengths share a CTranslate2 call under the largest limit; one
    whose hypothesis reaches its own, lower limit is translated again under it, so greedy
    output stays ours (short limits here: most hypotheses reach them)."""
    lines = _lines(60)
    theirs = Translator.from_checkpoint(ct2_dir, device="cpu")
    calls: list[tuple[int, int]] = []
    translate_batch = theirs.model.translate_batch

    def counted(batch, **options):
        calls.append((len(batch), options["max_decoding_length"]))
        return translate_batch(batch, **options)

    theirs.model = type("Counted", (), {"translate_batch": staticmethod(counted)})()
    lengths = {len(ids) for ids in theirs.encode(lines)}
    for limits in ({}, {"max_len_a": 0.5, "max_len_b": 2}):
        calls.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # lines cut at max_positions
            a = theirs.translate(lines, beam_size=1, return_scores=True, **limits)
            b = ours.translate(lines, beam_size=1, return_scores=True, **limits)
        assert [h[0][0] for h in a] == [h[0][0] for h in b]
        for x, y in zip(a, b, strict=True):
            assert x[0][1] == pytest.approx(y[0][1], abs=1e-4)
        first = calls[0]
        assert first[0] > 1 and len(calls) < len(lengths)  # one call held many lengths
        if limits:  # the short limits were reached, and those sentences run again
            assert len(calls) > 1 and any(n < first[1] for _, n in calls[1:])


def test_a_checkpoint_that_samples_exports_with_a_note_and_searches_with_a_warning(
    ours, tiny_ckpt, tmp_path, monkeypatch, capsys
):
    """Sampling is not exported: ``seq2seq export`` says so, and translating the CTranslate2
    folder warns that it searches; a beam size given for the checkpoint itself is refused."""
    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.nn import DecodingConfig

    checkpoint = load_checkpoint(tiny_ckpt)
    hparams = dict(checkpoint["hyper_parameters"])
    sampled = DecodingConfig.from_dict(hparams).replace(sampling=True, beam_size=2)
    checkpoint["hyper_parameters"] = {**hparams, "decoding": sampled.to_dict()}
    torch.save(checkpoint, tmp_path / "sampled.ckpt")
    code, _, err = run_main(
        monkeypatch, capsys, "export", "--ckpt_path", str(tmp_path / "sampled.ckpt"),
        "--format", "ctranslate2", "--output", str(tmp_path / "ct2"),
    )  # fmt: skip
    note = (
        "the checkpoint samples (model.decoding.sampling), which the export does not carry: "
        "it searches, with beam size 2"
    )
    assert code == 0 and err == [f"seq2seq: note: {note}"]
    with pytest.warns(UserWarning, match=r"^the checkpoint samples .*: .* searches, with beam"):
        folder = Translator.from_checkpoint(tmp_path / "ct2", device="cpu")
    assert not folder.decoding.sampling
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # lines cut at max_positions
        lines = _lines(4)
        assert folder.translate(lines) == ours.translate(lines, beam_size=2)
    message = r"^beam_size=5 with sampling: .* \(or give 1\), or sampling=False$"
    with pytest.raises(ValueError, match=message):
        Translator.from_checkpoint(tmp_path / "sampled.ckpt", device="cpu", beam_size=5)
    searching = Translator.from_checkpoint(
        tmp_path / "sampled.ckpt", device="cpu", beam_size=5, sampling=False
    )
    assert searching.decoding.beam_size == 5 and not searching.decoding.sampling
