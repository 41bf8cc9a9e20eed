"""``seq2seq import``: tiny random Hugging Face models (Marian, M2M-100, NLLB, and the Pegasus
folders our export writes), built offline over SentencePiece models trained here, compute our
logits, searches and scores after import, survive the round trips through our exporters, and
what cannot be imported is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, multi30k_lines, run_main
from hf_folders import (
    D_MODEL,
    FFN,
    HEADS,
    LAYERS,
    POSITIONS,
    fairseq_spm,
    import_folder,
    load_hf,
    m2m_folder,
    marian_folder,
    nllb_folder,
    save,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def lines(multi30k_dir) -> dict[str, list[str]]:
    return {lang: multi30k_lines("val", lang, 200, multi30k_dir) for lang in ("de", "en")}


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory, multi30k_dir) -> Path:
    return fairseq_spm(tmp_path_factory.mktemp("spm"), multi30k_dir)


@pytest.fixture(scope="module")
def marian(tmp_path_factory, spm_file):
    root = tmp_path_factory.mktemp("marian")
    folder = marian_folder(root / "hf", spm_file)
    return folder, load_hf(folder), import_folder(folder, root / "marian.ckpt")


@pytest.fixture(scope="module")
def m2m(tmp_path_factory, spm_file):
    root = tmp_path_factory.mktemp("m2m")
    folder = m2m_folder(root / "hf", spm_file)
    translator = import_folder(folder, root / "m2m.ckpt", src_lang="de", tgt_lang="en")
    return folder, load_hf(folder), translator


@pytest.fixture(scope="module")
def nllb(tmp_path_factory, spm_file):
    root = tmp_path_factory.mktemp("nllb")
    folder = nllb_folder(root / "hf", spm_file)
    translator = import_folder(folder, root / "nllb.ckpt", src_lang="deu_Latn", tgt_lang="eng_Latn")
    return folder, load_hf(folder), translator


@pytest.fixture(scope="module")
def tagged_marian(tmp_path_factory, marian):
    """A multi-target OPUS-MT model: the Marian folder with ``>>fra<<`` and ``>>eng<<`` after
    its pieces (vocab.json, the embeddings and ``final_logits_bias`` resized; the tags' rows
    random), and tokenizer_config.json's ``target_lang "en"``, as ``MarianTokenizer`` writes it
    from the model's name (no tag)."""
    folder = tmp_path_factory.mktemp("tagged") / "hf"
    shutil.copytree(marian[0], folder)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    for tag in (">>fra<<", ">>eng<<"):
        vocab[tag] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    model = load_hf(folder)
    model.resize_token_embeddings(len(vocab), mean_resizing=False)
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        model.get_input_embeddings().weight[-2:] = 0.25 * torch.randn(2, D_MODEL, generator=g)
    save(model, folder)
    assert json.loads((folder / "tokenizer_config.json").read_text())["target_lang"] == "en"
    return folder, load_hf(folder)


# ---------------------------------------------------------------------- helpers
def _pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def _batch(translator, src_lines: list[str], tgt_lines: list[str]):
    """Our and Hugging Face's padded inputs of sentence pairs: sources with EOS (and the
    language code), decoder inputs start + target (target-language code first)."""
    tok = translator.tokenizer
    src = [ids + [tok.eos_id] for ids in tok.encode(src_lines)]
    tgt = [[tok.bos_id, *ids] for ids in tok.encode(tgt_lines, side="target")]
    hf_pad = tok.hf_ids[tok.pad_id]
    ours = _pad(src, tok.pad_id), _pad(tgt, tok.pad_id)
    theirs = (
        _pad([tok.to_hf_ids(r) for r in src], hf_pad),
        _pad([tok.to_hf_ids(r) for r in tgt], hf_pad),
    )
    return ours, theirs, src, tgt


def _assert_same_logits(translator, model, src_lines, tgt_lines) -> None:
    """``ours[..., i] == hf[..., hf_ids[i]]`` at every real target position of a padded batch."""
    (src, tgt), (hf_src, hf_tgt), src_rows, tgt_rows = _batch(translator, src_lines, tgt_lines)
    tok = translator.tokenizer
    mask = (src != tok.pad_id)[:, None, None, :]
    with torch.no_grad():
        ours = translator.model(src, tgt, mask)
        hf = model(
            input_ids=hf_src, attention_mask=(src != tok.pad_id).long(), decoder_input_ids=hf_tgt
        ).logits[..., tok.hf_ids]
    assert len({len(r) for r in src_rows}) > 1 and len({len(r) for r in tgt_rows}) > 1  # padded
    real = torch.zeros(tgt.shape, dtype=torch.bool)
    for i, row in enumerate(tgt_rows):
        real[i, : len(row)] = True
    torch.testing.assert_close(ours[real], hf[real], atol=1e-5, rtol=0)


def _our_ids(translator, sources, beam: int, limits, prefix=None, lp=1.0) -> list[list[int]]:
    from seq2seq.nn import DecodingConfig, beam_search, greedy_search
    from seq2seq.text_decoding import source_batch

    tok, results = translator.tokenizer, []
    for start in range(0, len(sources), 50):
        chunk = sources[start : start + 50]
        batch = source_batch(chunk, tok.pad_id)
        config = DecodingConfig(beam_size=beam, length_penalty=lp, **limits)
        search = greedy_search if beam == 1 else beam_search
        forced = None if prefix is None else [prefix] * len(chunk)
        hyps = search(
            translator.model, batch["src"], batch["src_mask"], tok.bos_id, tok.eos_id, config,
            prefix=forced, unscored_prefix=0 if prefix is None else len(prefix),
        )  # fmt: skip
        results += [h[0].tokens for h in hyps]
    return results


def _hf_ids(
    translator, model, sources, beam: int, limits, forced_bos=None, lp=1.0
) -> list[list[int]]:
    """``generate`` under our per-sentence limits (grouped by limit), as our ids without the
    decoder start and EOS."""
    from seq2seq.export.common import max_len

    tok = translator.tokenizer
    hf_pad, hf_eos = tok.hf_ids[tok.pad_id], tok.hf_ids[tok.eos_id]
    wanted = [max_len(len(s), limits["max_len_a"], limits["max_len_b"], POSITIONS) for s in sources]
    results: list[list[int]] = [[] for _ in sources]
    for limit in sorted(set(wanted)):
        chosen = [i for i, w in enumerate(wanted) if w == limit]
        ids = _pad([tok.to_hf_ids(sources[i]) for i in chosen], hf_pad)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=(ids != hf_pad).long(),
                num_beams=beam,
                length_penalty=lp,
                early_stopping=False,
                max_new_tokens=limit,
                max_length=None,
                min_new_tokens=None,
                do_sample=False,
                forced_bos_token_id=forced_bos,
                forced_eos_token_id=None,
                suppress_tokens=[hf_pad],
                bad_words_ids=None,
                num_return_sequences=1,
            )
        for i, row in zip(chosen, out[:, 1:].tolist(), strict=True):
            row = row[: row.index(hf_eos)] if hf_eos in row else row
            results[i] = tok.from_hf_ids([t for t in row if t != hf_pad])
    return results


def _search_differences(translator, model, src_lines, beam, prefix=None, forced_bos=None, lp=1.0):
    """The sentences (indices) whose output differs between our search and ``generate``, both
    under the limit ``int(0.5 * src_len + 5)``, after checking that the outputs are varied
    (some end with EOS before the limit, or most differ)."""
    from seq2seq.export.common import max_len

    tok = translator.tokenizer
    sources = [ids + [tok.eos_id] for ids in tok.encode(src_lines)]
    limits = {"max_len_a": 0.5, "max_len_b": 5}
    ours = _our_ids(translator, sources, beam, limits, prefix, lp)
    theirs = _hf_ids(translator, model, sources, beam, limits, forced_bos, lp)
    ended = [
        len(h) < max_len(len(s), 0.5, 5, POSITIONS) for h, s in zip(ours, sources, strict=True)
    ]
    distinct = len(set(map(tuple, ours)))
    assert distinct > 10 and (sum(ended) >= 10 or distinct > 50)
    return [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]


# ---------------------------------------------------------------------- equality with HF
def test_marian_logits_are_hugging_faces(marian, lines):
    folder, model, translator = marian
    config = translator.model.config
    assert (config.norm_first, config.activation, config.output_bias) == (False, "silu", True)
    assert config.tie_embeddings == "all" and config.scale_embedding
    assert translator.tokenizer.bos_id == translator.tokenizer.pad_id == 0  # Marian starts at pad
    _assert_same_logits(translator, model, lines["de"][:8], lines["en"][:8])


def test_m2m_100_logits_are_hugging_faces(m2m, lines):
    folder, model, translator = m2m
    config = translator.model.config
    assert (config.norm_first, config.positional) == (True, "sinusoidal_fairseq")
    assert translator.tokenizer.bos_id == translator.tokenizer.eos_id == 3  # starts at EOS
    _assert_same_logits(translator, model, lines["de"][:8], lines["en"][:8])


def test_nllb_logits_with_language_codes_are_hugging_faces(nllb, lines):
    folder, model, translator = nllb
    tok = translator.tokenizer
    source_prefix, target_prefix = tok.language_prefix("eng_Latn")
    first = tok.encode(lines["de"][:1])[0]
    assert first[: len(source_prefix)] == source_prefix and len(source_prefix) == 1
    assert tok.encode(lines["en"][:1], side="target")[0][:1] == target_prefix
    _assert_same_logits(translator, model, lines["de"][:8], lines["en"][:8])


@pytest.mark.parametrize("beam", [1, 5])
def test_marian_greedy_and_beam_search_are_generates(marian, lines, beam):
    folder, model, translator = marian
    differ = _search_differences(translator, model, lines["de"], beam)
    assert len(differ) <= 2, differ  # 99% of 200; none differ today


@pytest.mark.parametrize(("beam", "lp"), [(1, 1.0), (5, 0.0), (5, 1.0), (5, 0.6)])
def test_nllb_search_with_the_forced_language_is_generates(nllb, lines, beam, lp):
    """Our target-language prefix, forced unscored (``unscored_prefix``, as the Translator and
    the data module's decoding force it), against ``generate``'s ``forced_bos_token_id``,
    which gives the forced token log-probability 0: with and without a length penalty."""
    folder, model, translator = nllb
    tok = translator.tokenizer
    _, prefix = tok.language_prefix("eng_Latn")
    forced = tok.to_hf_ids(prefix)[0]
    differ = _search_differences(translator, model, lines["de"], beam, prefix, forced, lp)
    assert len(differ) <= 2, differ  # at least 99% of 200


def test_our_score_of_a_target_is_hugging_faces_log_probability(marian, nllb, lines):
    from seq2seq.nn import label_smoothed_cross_entropy

    for _, model, translator in (marian, nllb):
        tok = translator.tokenizer
        (src, tgt), (hf_src, hf_tgt), _, tgt_rows = _batch(
            translator, lines["de"][:6], lines["en"][:6]
        )
        labels = _pad([r[1:] + [tok.eos_id] for r in tgt_rows], tok.pad_id)
        hf_labels = _pad([tok.to_hf_ids(r[1:] + [tok.eos_id]) for r in tgt_rows], -100)
        with torch.no_grad():
            logits = translator.model(src, tgt, (src != tok.pad_id)[:, None, None, :])
            _, nll = label_smoothed_cross_entropy(logits, labels, 0.0, ignore_index=tok.pad_id)
            hf_logits = model(
                input_ids=hf_src,
                attention_mask=(src != tok.pad_id).long(),
                decoder_input_ids=hf_tgt,
            ).logits
        log_probs = hf_logits.log_softmax(-1)
        real = hf_labels != -100
        expected = log_probs[real].gather(1, hf_labels[real][:, None]).sum()
        torch.testing.assert_close(-nll, expected, atol=1e-4, rtol=1e-6)


def test_translator_score_is_hugging_faces_log_probability_less_the_forced_code(
    marian, nllb, lines
):
    """Translator.score sums Hugging Face's log-probabilities of each target's labels, EOS
    included, leaving out NLLB's target-language code (forced, as translate leaves it out)."""
    for _, model, translator in (marian, nllb):
        tok = translator.tokenizer
        _, (hf_src, hf_tgt), src_rows, tgt_rows = _batch(
            translator, lines["de"][:6], lines["en"][:6]
        )
        forced = 1 if tok.family == "nllb" else 0
        with torch.no_grad():
            hf_mask = (hf_src != tok.hf_ids[tok.pad_id]).long()
            hf = model(input_ids=hf_src, attention_mask=hf_mask, decoder_input_ids=hf_tgt)
        log_probs = hf.logits.log_softmax(-1)
        expected = []
        for i, row in enumerate(tgt_rows):
            labels = torch.tensor(tok.to_hf_ids(row[1:] + [tok.eos_id]))
            picked = log_probs[i, : len(labels)].gather(1, labels[:, None]).squeeze(1)
            expected.append(float(picked[forced:].sum()))
        scores = translator.score(lines["de"][:6], lines["en"][:6])
        assert [s.pieces[-1] for s in scores] == [tok.id_to_piece([tok.eos_id])[0]] * 6
        assert [len(s.pieces) for s in scores] == [len(r) - forced for r in tgt_rows]
        torch.testing.assert_close(
            torch.tensor([s.log_prob for s in scores]), torch.tensor(expected), atol=1e-4, rtol=0
        )


def _with_tokenizer_config(folder: Path, tmp_path: Path, **changes) -> Path:
    """A copy of ``folder`` with ``tokenizer_config.json`` keys changed."""
    copy = tmp_path / f"tokenizer{len(list(tmp_path.iterdir()))}"
    shutil.copytree(folder, copy)
    settings = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps(settings | changes))
    return copy


def test_multi_target_marian_takes_the_given_tgt_lang_over_tokenizer_configs(
    tagged_marian, tmp_path, lines, monkeypatch, capsys
):
    """``--tgt_lang fra`` on a folder whose tokenizer_config.json says ``target_lang "en"`` (no
    tag of the model) or ``"ROMANCE"`` (en-ROMANCE's group name): imported, ``>>fra<<`` the
    default and first, and the translations into each tag ``generate``'s from that tag."""
    from seq2seq.translator import Translator

    folder, model = tagged_marian
    for target_lang in ("en", "ROMANCE"):
        copy = _with_tokenizer_config(folder, tmp_path, target_lang=target_lang)
        output = tmp_path / f"{target_lang}.ckpt"
        argv = ("import", "--input", str(copy), "--output", str(output), "--tgt_lang", "fra")
        code, out, err = run_main(monkeypatch, capsys, *argv)
        assert code == 0 and err == [], err
        assert "tokenizer_config.json" not in out  # the given language is no note's subject
        translator = Translator.from_checkpoint(output, device="cpu")
        tok = translator.tokenizer
        assert tok.languages == ("fra", "eng") and tok.tgt_lang == "fra"
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    argv = ("import", "--input", str(folder), "--output", str(tmp_path / "fr.ckpt"))
    code, _, err = run_main(monkeypatch, capsys, *argv, "--tgt_lang", "fr")  # ISO 639-1
    assert code == 0 and err == [], err
    assert (
        Translator.from_checkpoint(tmp_path / "fr.ckpt", device="cpu").tokenizer.tgt_lang == "fra"
    )
    code, _, err = run_main(monkeypatch, capsys, *argv, "--tgt_lang", "frx")  # no such code
    assert code == 1 and len(err) == 1, err
    assert "tgt_lang 'frx' is not a language of the model; its languages: fra, eng" in err[0]
    sentences, limits = lines["de"][:40], {"max_len_a": 0.5, "max_len_b": 5}
    translations = {}  # of the last import (ROMANCE)
    for lang in ("fra", "eng", None):
        sources = [ids + [tok.eos_id] for ids in tok.encode(sentences, tgt_lang=lang)]
        assert {tuple(tok.id_to_piece(s[:1])) for s in sources} == {(f">>{lang or 'fra'}<<",)}
        ours = translator.translate(sentences, beam_size=1, tgt_lang=lang, **limits)
        assert ours == tok.decode(_hf_ids(translator, model, sources, 1, limits))
        translations[lang] = ours
    assert translations["fra"] == translations[None] != translations["eng"]
    assert len(set(translations["fra"])) > 10


def test_a_tokenizer_config_language_that_is_no_language_of_the_model_is_no_default(
    tagged_marian, nllb, tmp_path, lines, monkeypatch, capsys
):
    """Without ``--tgt_lang``, tokenizer_config.json's ``target_lang`` that is no tag of the
    model is imported as no default, in a note naming the file and the key (translate then
    takes ``tgt_lang``); one that is a tag stays the default. NLLB's ``src_lang`` that is no
    code of the model yields to ``--src_lang``, and is not blamed when both are missing."""
    from seq2seq.translator import Translator

    folder, _ = tagged_marian
    sentences, limits = lines["de"][:20], {"beam_size": 1, "max_len_a": 0.5, "max_len_b": 5}
    tagged = tmp_path / "tagged.ckpt"
    import_folder(folder, tagged, tgt_lang="fra")
    expected = Translator.from_checkpoint(tagged, device="cpu").translate(sentences, **limits)
    for target_lang in ("en", "ROMANCE"):
        copy = _with_tokenizer_config(folder, tmp_path, target_lang=target_lang)
        output = tmp_path / f"{target_lang}.ckpt"
        argv = ("import", "--input", str(copy), "--output", str(output))
        code, out, err = run_main(monkeypatch, capsys, *argv)
        assert code == 0 and err == [], err
        note = (
            f"tokenizer_config.json target_lang={target_lang!r} (names no language of the "
            "model: fra, eng; no default: translate takes --tgt_lang)"
        )
        assert out.splitlines()[1].startswith("not carried: ") and note in out.splitlines()[1]
        translator = Translator.from_checkpoint(output, device="cpu")
        assert translator.tokenizer.tgt_lang is None and translator.tokenizer.src_lang == "de"
        assert translator.translate(sentences, tgt_lang="fra", **limits) == expected
        typed = translator.translate([f">>fra<< {s}" for s in sentences], **limits)
        assert typed == expected  # a tag typed first selects, as in MarianTokenizer
    # translate without --tgt_lang: the first line without a typed tag is warned about, once
    argv = ["translate", "--ckpt_path", str(output), "--beam_size", "1", "--max_len_b", "5"]
    stdin = f">>fra<< {sentences[0]}\n{sentences[1]}\n{sentences[2]}\n".encode()
    code, out, err = run_main(monkeypatch, capsys, *argv, stdin=stdin)
    assert code == 0 and len(out.splitlines()) == 3
    assert err == [
        "seq2seq: warning: line 2 has no >>xx<< tag at its start, and the model translates "
        "into fra, eng: lines without one are translated without a target language (give "
        "--tgt_lang, or a tag at the start of each line)"
    ]
    for extra, text in (([], f">>eng<< {sentences[0]}\n"), (["--tgt_lang", "fr"], "Ein Hund.\n")):
        code, _, err = run_main(monkeypatch, capsys, *argv, *extra, stdin=text.encode())
        assert (code, err) == (0, []), err
    copy = _with_tokenizer_config(folder, tmp_path, target_lang="fra")
    code, out, err = run_main(
        monkeypatch, capsys, "import", "--input", str(copy), "--output", str(tmp_path / "t.ckpt")
    )
    assert code == 0 and "tokenizer_config.json" not in out, (out, err)
    translator = Translator.from_checkpoint(tmp_path / "t.ckpt", device="cpu")
    assert translator.tokenizer.tgt_lang == "fra"
    assert translator.translate(sentences, **limits) == expected

    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    broken = _with_tokenizer_config(folder, tmp_path, target_lang="en")
    (broken / "target.spm").unlink()
    argv = ("import", "--input", str(broken), "--output", str(tmp_path / "b.ckpt"))
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert code == 1 and len(err) == 1, err
    assert f"{broken / 'target.spm'}: file not found" in err[0]  # the folder, not a copy of it
    nllb_copy = _with_tokenizer_config(nllb[0], tmp_path, src_lang="eng", tgt_lang="French")
    translator = import_folder(
        nllb_copy, tmp_path / "nllb.ckpt", src_lang="deu_Latn", tgt_lang="eng_Latn"
    )
    assert (translator.tokenizer.src_lang, translator.tokenizer.tgt_lang) == (
        "deu_Latn",
        "eng_Latn",
    )
    argv = ("import", "--input", str(nllb_copy), "--output", str(tmp_path / "n.ckpt"))
    code, out, err = run_main(monkeypatch, capsys, *argv, "--tgt_lang", "eng_Latn")
    assert code == 1 and len(err) == 1, err
    assert "multilingual M2M100ForConditionalGeneration: give --src_lang, codes of its 4 " in err[0]


# ---------------------------------------------------------------------- round trips
@pytest.fixture(scope="module")
def our_ckpt(tmp_path_factory, train_spm, lines) -> Path:
    """A checkpoint of ours (Pre-LN, random weights, our SentencePiece model)."""
    from seq2seq.data.tokenizer import Tokenizer
    from seq2seq.importing.checkpoint import build_checkpoint
    from seq2seq.nn import DecodingConfig, Transformer, TransformerConfig

    tokenizer = Tokenizer.load(train_spm(lines["de"] + lines["en"], 150))
    config = TransformerConfig(
        vocab_size=150, d_model=D_MODEL, n_heads=HEADS, n_encoder_layers=LAYERS,
        n_decoder_layers=LAYERS, d_ff=FFN, max_positions=POSITIONS, activation="gelu",
    )  # fmt: skip
    torch.manual_seed(5)
    model = Transformer(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.25)
    path = tmp_path_factory.mktemp("ours") / "ours.ckpt"
    decoding = DecodingConfig(beam_size=3, length_penalty=0.6)
    torch.save(
        build_checkpoint(config, model.state_dict(), tokenizer, decoding, ("de", "en")), path
    )
    return path


def _state(path: Path) -> dict[str, torch.Tensor]:
    from seq2seq.checkpoint import load_checkpoint

    return load_checkpoint(path)["state_dict"]


def test_our_checkpoint_exported_and_imported_is_the_same_model(our_ckpt, tmp_path, lines):
    from seq2seq.export.huggingface import export_huggingface
    from seq2seq.translator import Translator

    folder = export_huggingface(our_ckpt, tmp_path / "hf")
    translator = import_folder(folder, tmp_path / "back.ckpt")
    assert type(load_hf(folder)).__name__ == "PegasusForConditionalGeneration"
    _assert_same_logits(translator, load_hf(folder), lines["de"][:8], lines["en"][:8])
    before, after = _state(our_ckpt), _state(tmp_path / "back.ckpt")
    assert before.keys() == after.keys()
    vocab = translator.model.vocab_size  # rows past it pad the matrices and are never used
    for key, value in before.items():
        assert torch.equal(value[:vocab], after[key][:vocab]), key
    original = Translator.from_checkpoint(our_ckpt, device="cpu")
    assert original.model.config == translator.model.config
    for beam in (1, 3):
        expected = original.translate(lines["de"][:40], beam_size=beam)
        assert translator.translate(lines["de"][:40], beam_size=beam) == expected
    assert translator.decoding.beam_size == 3  # generation_config's num_beams, carried


def test_imported_marian_exported_to_ctranslate2_translates_the_same(marian, tmp_path, lines):
    from seq2seq.export.ctranslate2 import export_ctranslate2
    from seq2seq.translator import Translator

    folder, model, translator = marian
    ckpt = tmp_path / "marian.ckpt"
    import_folder(folder, ckpt)
    ct2 = Translator.from_checkpoint(export_ctranslate2(ckpt, tmp_path / "ct2"), device="cpu")
    sentences = lines["de"][:60]
    settings = {"beam_size": 1, "max_len_a": 0.5, "max_len_b": 5}
    expected = translator.translate(sentences, **settings)
    assert len(set(expected)) > 10
    assert ct2.translate(sentences, **settings) == expected


def test_imported_nllb_translates_into_a_chosen_language_here_and_through_ctranslate2(
    nllb, tmp_path, lines
):
    """``tgt_lang`` with greedy and beam search, prefixes, sampling and an ensemble, and the
    same translations from the CTranslate2 export (its target prefix is the code)."""
    from seq2seq.export.ctranslate2 import export_ctranslate2
    from seq2seq.translator import Translator

    folder, model, translator = nllb
    ckpt = tmp_path / "nllb.ckpt"
    import_folder(folder, ckpt, src_lang="deu_Latn", tgt_lang="eng_Latn")
    sentences, settings = lines["de"][:40], {"max_len_a": 0.5, "max_len_b": 5}
    english = translator.translate(sentences, beam_size=1, **settings)
    french = translator.translate(sentences, beam_size=1, tgt_lang="fra_Latn", **settings)
    assert english != french and len(set(french)) > 5
    assert translator.translate(["", "Ein Hund."], beam_size=1)[0] == ""  # only its code
    ct2 = Translator.from_checkpoint(export_ctranslate2(ckpt, tmp_path / "ct2"), device="cpu")
    for beam in (1, 3):
        ours = translator.translate(sentences, beam_size=beam, tgt_lang="fra_Latn", **settings)
        assert ct2.translate(sentences, beam_size=beam, tgt_lang="fra_Latn", **settings) == ours
    # scores of given translations, the forced code left out by both
    scored = [
        translator.score(sentences, french, "fra_Latn"),
        ct2.score(sentences, french, "fra_Latn"),
    ]
    assert [s.pieces for s in scored[0]] == [s.pieces for s in scored[1]]
    assert scored[0][0].pieces[0] != "fra_Latn"
    torch.testing.assert_close(
        *(torch.tensor([s.log_prob for s in scores]) for scores in scored), atol=1e-4, rtol=0
    )
    with pytest.raises(
        ValueError, match="'xx_Latn' is not a language of the model; its languages: deu_Latn"
    ):
        translator.translate(sentences, tgt_lang="xx_Latn")
    # a prefix continues after the forced code; sampling and an ensemble take the language
    word = french[0].split()[0]
    forced = translator.translate(sentences[:3], prefixes=[word] * 3, tgt_lang="fra_Latn")
    assert all(text.startswith(word) for text in forced)
    drawn = translator.translate(sentences[:3], sampling=True, tgt_lang="fra_Latn", **settings)
    assert len(drawn) == 3
    twin = tmp_path / "twin.ckpt"
    import_folder(folder, twin, src_lang="deu_Latn", tgt_lang="eng_Latn")
    checkpoint = torch.load(twin, weights_only=False)  # weights a hair apart: an ensemble
    for value in checkpoint["state_dict"].values():  # refuses two files of the same weights
        if value.is_floating_point():
            value.mul_(1 + 1e-6)
    torch.save(checkpoint, twin)
    pair = Translator.from_checkpoint([ckpt, twin], device="cpu")
    from seq2seq.export.huggingface import export_huggingface

    with pytest.raises(ValueError, match="its imported nllb tokenizer") as refused:
        export_huggingface(ckpt, tmp_path / "hf")
    assert "\n" not in str(refused.value) and not (tmp_path / "hf").exists()
    assert pair.translate(sentences, beam_size=1, tgt_lang="fra_Latn", **settings) == french


def test_imported_marian_exported_to_hugging_face_gives_back_its_logits(marian, tmp_path, lines):
    from seq2seq.export.huggingface import export_huggingface

    folder, model, translator = marian
    ckpt = tmp_path / "marian.ckpt"
    import_folder(folder, ckpt)
    sentences = lines["de"][:6]
    exported = load_hf(export_huggingface(ckpt, tmp_path / "hf"))
    assert type(exported).__name__ == "MarianMTModel"
    tok = translator.tokenizer
    (src, tgt), (hf_src, hf_tgt), _, _ = _batch(translator, sentences[:6], lines["en"][:6])
    with torch.no_grad():
        original = model(
            input_ids=hf_src, attention_mask=(hf_src != model.config.pad_token_id).long(),
            decoder_input_ids=hf_tgt,
        ).logits[..., tok.hf_ids]  # fmt: skip
        again = exported(
            input_ids=src, attention_mask=(src != tok.pad_id).long(), decoder_input_ids=tgt
        ).logits
    real = (tgt != tok.pad_id) | (torch.arange(tgt.size(1)) == 0)
    torch.testing.assert_close(again[real], original[real], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------- refusals
def _edited(folder: Path, tmp_path: Path, **changes) -> Path:
    """A copy of ``folder`` with ``config.json`` keys changed (``None``: removed)."""
    copy = tmp_path / f"edited{len(list(tmp_path.iterdir()))}"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    for key, value in changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_a_suppressed_unknown_token_is_imported_as_disable_unk():
    """``suppress_tokens`` or ``bad_words_ids`` of the padding and unknown tokens alone (what our
    Hugging Face export writes for ``disable_unk``) become ``disable_unk``; a list with any other
    token is listed as not carried."""
    from seq2seq.importing.generation import decoding_settings

    pad, unk = 58100, 1  # Marian's padding is its last id
    for generation in (
        {"suppress_tokens": [pad, unk]},
        {"bad_words_ids": [[pad], [unk]]},
        {"bad_words_ids": [[unk]], "suppress_tokens": [pad]},
    ):
        decoding, notes = decoding_settings(generation, {}, pad, POSITIONS, unk)
        assert decoding.disable_unk and notes == [], generation
    decoding, notes = decoding_settings({"bad_words_ids": [[pad]]}, {}, pad, POSITIONS, unk)
    assert not decoding.disable_unk and notes == []
    decoding, notes = decoding_settings({"suppress_tokens": [pad, unk, 7]}, {}, pad, POSITIONS, unk)
    assert not decoding.disable_unk
    assert notes == [f"suppress_tokens={[pad, unk, 7]!r} (no seq2seq decoding setting)"]


def test_what_cannot_be_imported_is_refused_in_one_line(marian, m2m, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    marian_dir, m2m_dir = marian[0], m2m[0]
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(marian_dir / "config.json", no_weights / "config.json")
    tokenizer_config = {"tokenizer_class": "BertTokenizer"}
    other_tokenizer = _edited(marian_dir, tmp_path)
    (other_tokenizer / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    vocab = json.loads((marian_dir / "config.json").read_text())["vocab_size"]
    cases = [
        (_edited(marian_dir, tmp_path, architectures=["MBartForConditionalGeneration"]),
         "architectures=['MBartForConditionalGeneration'] cannot be imported; supported: "
         "MarianMTModel, M2M100ForConditionalGeneration, PegasusForConditionalGeneration"),
        (no_weights, f"--input {no_weights} holds no weights: none of model.safetensors"),
        (_edited(marian_dir, tmp_path, vocab_size=vocab - 5, decoder_vocab_size=vocab - 5),
         f"config.json's vocab_size is {vocab - 5}"),
        (_edited(marian_dir, tmp_path, layernorm_embedding=True),
         "layernorm_embedding=True cannot be imported: MarianMTModel import supports "
         "layernorm_embedding=False only"),
        (_edited(marian_dir, tmp_path, activation_function="gelu_new"),
         "activation_function='gelu_new' cannot be imported: supported: relu, gelu, silu, swish"),
        (_edited(marian_dir, tmp_path, decoder_attention_heads=2),
         "decoder_attention_heads=2 cannot be imported: seq2seq has one n_heads"),
        (_edited(marian_dir, tmp_path, decoder_vocab_size=vocab + 3),
         f"decoder_vocab_size={vocab + 3} cannot be imported: seq2seq has one vocabulary"),
        (_edited(marian_dir, tmp_path, add_bias_logits=True), "add_bias_logits=True"),
        (_edited(marian_dir, tmp_path, tie_word_embeddings=False), "tie_word_embeddings=False"),
        (other_tokenizer, "tokenizer class BertTokenizer (tokenizer_config.json) is not supported"),
        (m2m_dir, "multilingual M2M100ForConditionalGeneration: give --src_lang and --tgt_lang, "
         "codes of its 100 languages (af, am, ar, ast, az, ba, ...)"),
        ("Helsinki-NLP/opus-mt-de-en", "--input Helsinki-NLP/opus-mt-de-en is not a folder (a "
         "save_pretrained folder); download a Hub model first: hf download "
         "Helsinki-NLP/opus-mt-de-en --local-dir DIR"),
    ]  # fmt: skip
    for folder, expected in cases:
        output = tmp_path / "out.ckpt"
        code, out, err = run_main(
            monkeypatch, capsys, "import", "--input", str(folder), "--output", str(output)
        )
        assert code == 1 and out == "", (folder, err)
        assert len(err) == 1 and expected in err[0], (expected, err)
        assert not output.exists()
    # owner/name whose owner is a folder here: a local folder was meant, not a Hub id
    (tmp_path / "scratch").mkdir()
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, "import", "--input", "scratch/x",
                              "--output", "out.ckpt")  # fmt: skip
    assert code == 1 and len(err) == 1 and "hf download" not in err[0], err
    assert (
        "--input scratch/x is not a folder (a save_pretrained folder); scratch holds no x"
        in (err[0])
    )


def test_import_command_writes_and_replaces_only_its_own_output(
    marian, our_ckpt, tmp_path, monkeypatch, capsys
):
    from seq2seq.checkpoint import CHECKPOINT_KEY, load_checkpoint
    from seq2seq.checkpoint.format import IMPORTED_FROM

    folder = marian[0]
    output = tmp_path / "imported.ckpt"
    argv = ("import", "--input", str(folder), "--output", str(output))
    for _ in range(2):  # the second run replaces the first's output
        code, out, err = run_main(monkeypatch, capsys, *argv)
        assert code == 0, err
        assert out.splitlines()[0].startswith(f"imported {folder} (MarianMTModel: 2+2 layers")
        assert out.splitlines()[1] == (
            f"not carried: max_length={POSITIONS} (the model's whole length, no limit: seq2seq "
            "keeps its own, max_len_a * src_len + max_len_b); forced_eos_token_id=0 (generate "
            "forces EOS at the length limit; a seq2seq hypothesis that reaches it ends without "
            "one)"
        )
    checkpoint = load_checkpoint(output)
    assert checkpoint[CHECKPOINT_KEY][IMPORTED_FROM]["class"] == "MarianMTModel"
    assert checkpoint["hyper_parameters"]["decoding"]["beam_size"] == 4
    shutil.copy(our_ckpt, tmp_path / "trained.ckpt")
    code, _, err = run_main(
        monkeypatch,
        capsys,
        "import",
        "--input",
        str(folder),
        "--output",
        str(tmp_path / "trained.ckpt"),
    )
    assert code == 2 and "exists and is a checkpoint that seq2seq import did not write" in err[-1]
    assert torch.equal(
        _state(tmp_path / "trained.ckpt")["model.output.weight"],
        _state(our_ckpt)["model.output.weight"],
    )


def test_fit_refuses_to_resume_from_an_imported_checkpoint(marian, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "imported.ckpt"
    import_folder(marian[0], ckpt)
    config = ["--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(tmp_path / "nodata")]
    code, _, err = run_main(monkeypatch, capsys, "fit", *config, "--ckpt_path", str(ckpt))
    assert code == 1 and len(err) == 1, err
    assert f"{ckpt} was written by `seq2seq import` (from {marian[0].absolute()})" in err[0]
    assert f"--init_from {ckpt}" in err[0]
    assert not (tmp_path / "nodata").exists()


def test_a_model_fine_tuned_into_several_languages_asks_which(nllb, tagged_marian, tmp_path):
    """An imported model trained on several pairs: no target given to NLLB is refused (its
    import's default is no choice among them); its source is the one trained into the target,
    or refused among several; Marian's default serves untagged lines, with a warning."""
    from seq2seq.commands.translating import _untagged_warning
    from seq2seq.text_decoding import requested_languages

    tok = nllb[2].tokenizer
    pairs = [("de", "en"), ("fr", "en"), ("en", "fr")]
    with pytest.raises(ValueError, match=r"^this model was trained into en, fr: choose the targ"):
        requested_languages(tok, pairs, None, None)
    with pytest.raises(ValueError, match=r"^this model was trained from de, fr into eng_Latn: "):
        requested_languages(tok, pairs, "eng_Latn", None)
    tgt, src, (source, target) = requested_languages(tok, pairs, "fr", None)  # from en alone
    assert (tgt, src) == ("fr", "en")
    assert tok.id_to_piece(source + target) == ["eng_Latn", "fra_Latn"]
    assert requested_languages(tok, pairs, "en", "fra")[1] == "fra"
    assert requested_languages(tok, None, None, None)[:2] == (None, None)  # pairs not known
    marian = import_folder(tagged_marian[0], tmp_path / "m.ckpt", tgt_lang="fra").tokenizer
    assert marian.language_name(">>eng<<") == marian.language_name("en") == "eng"  # any spelling
    assert _untagged_warning(marian, None, [("de", "fr")]) is None  # its one target
    assert _untagged_warning(marian, "en", [("de", "en"), ("de", "fr")]) is None
    assert "translated into its default fra (give --tgt_lang" in _untagged_warning(
        marian, None, [("de", "en"), ("de", "fr")]
    )


def test_a_folder_with_tokenizer_json_alone_says_where_the_model_file_is(nllb, tmp_path):
    """transformers 5 saves an NLLB tokenizer as tokenizer.json alone: the missing
    SentencePiece model is named with where to get it."""
    from seq2seq.importing import import_huggingface

    folder = tmp_path / "nllb"
    shutil.copytree(nllb[0], folder)
    (folder / "sentencepiece.bpe.model").unlink()
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match=r"sentencepiece\.bpe\.model: file not found .*; the "
                       r"folder has tokenizer\.json alone, .*hf download has it"):  # fmt: skip
        import_huggingface(folder, tmp_path / "n.ckpt", src_lang="de", tgt_lang="en")
