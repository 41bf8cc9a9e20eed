"""Ensembles: the mean of the models' log-probabilities per step, through the searches, the
Translator and ``seq2seq translate``."""

from __future__ import annotations

import pytest
import torch
from conftest import copy_batch, multi30k_lines, run_main, tiny_model

from seq2seq.checkpoint import IncompatibleCheckpointsError
from seq2seq.nn import (
    DecodingConfig,
    Ensemble,
    Transformer,
    beam_search,
    greedy_search,
    padding_mask,
    sample,
)
from seq2seq.translator import Translator

PAD, BOS, EOS = 0, 2, 3
V = 14


pytestmark = pytest.mark.usefixtures("one_thread")


def _trained(seed: int, steps: int, **architecture) -> Transformer:
    """A model trained briefly on copying: confident but imperfect, EOS at varied steps."""
    torch.manual_seed(seed)
    model = Transformer(vocab_size=V, dropout=0.0, **architecture)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        src, dec_in, tgt = copy_batch(32, g, V)
        logits = model(src, dec_in, padding_mask(src, PAD))
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt, ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def models() -> tuple[Transformer, Transformer]:
    """Two models of other architectures: Post-LN with sinusoids, and a narrower Pre-LN one
    with learned positions and a shorter position table, trained for fewer steps."""
    a = _trained(
        0, 60, d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=64,
        max_positions=40,
    )  # fmt: skip
    b = _trained(
        1, 30, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=1, d_ff=32,
        max_positions=30, norm_first=True, positional="learned",
    )  # fmt: skip
    return a, b


@pytest.fixture(scope="module")
def sources() -> tuple[torch.Tensor, torch.Tensor]:
    """Four right-padded sources of 2 to 7 tokens, and their mask."""
    src = torch.tensor(
        [[5, 6, 7, 8, 9, 10, 11], [12, 4, 0, 0, 0, 0, 0], [7, 7, 13, 9, 6, 0, 0], [9, 8] + [0] * 5]
    )
    return src, padding_mask(src, PAD)


def test_an_ensemble_of_a_model_with_itself_is_that_model(models, sources):
    model = models[0]
    ensemble = Ensemble([model, model])
    src, mask = sources
    assert (ensemble.vocab_size, ensemble.pad_id, ensemble.max_positions) == (V, PAD, 40)
    dec_in = torch.tensor([[BOS, 5, 6, 7], [BOS, 12, 4, EOS], [BOS, 7, 7, 13], [BOS, 9, 8, 3]])
    with torch.no_grad():
        expected = torch.log_softmax(model(src, dec_in, mask), dim=-1)
        got = ensemble(src, dec_in, mask)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    beam = DecodingConfig(beam_size=5)
    for search, args, kwargs in ((greedy_search, (), {}), (beam_search, (beam,), {"n_best": 5})):
        alone = search(model, src, mask, BOS, EOS, *args, **kwargs)
        together = search(ensemble, src, mask, BOS, EOS, *args, **kwargs)
        assert [[h.tokens for h in hyps] for hyps in together] == [
            [h.tokens for h in hyps] for hyps in alone
        ]
        assert [h.score for hyps in together for h in hyps] == pytest.approx(
            [h.score for hyps in alone for h in hyps], abs=1e-5
        )


def _float64_copy(model: Transformer) -> Transformer:
    """The same weights in float64, in a model of its own."""
    copy = Transformer(model.config)
    copy.load_state_dict(model.state_dict())
    return copy.double().eval()


def _reference_log_probs(models64, src_row: torch.Tensor, prefix: list[int]) -> torch.Tensor:
    """float64 ``(V,)`` next-token log-probabilities of the ensemble after ``prefix``, without
    a cache: the renormalised mean of the models' log-softmax at the last position."""
    src = src_row[None]
    dec_in = torch.tensor([prefix])
    with torch.no_grad():
        mean = torch.stack(
            [
                torch.log_softmax(m(src, dec_in, padding_mask(src, PAD))[0, -1], dim=-1)
                for m in models64
            ]
        ).mean(0)
    return torch.log_softmax(mean, dim=-1)


def test_two_models_decode_with_the_renormalised_mean_of_their_log_probs(models, sources):
    """Each step's distribution (cached, float32) equals a float64 recomputation of the whole
    prefix; greedy search equals a step-by-step float64 greedy decode."""
    ensemble = Ensemble(models)
    assert ensemble.max_positions == 30  # the smaller table
    models64 = [_float64_copy(m) for m in models]
    src, mask = sources
    a, b = 1.2, 10
    hyps = greedy_search(ensemble, src, mask, BOS, EOS, DecodingConfig(max_len_a=a, max_len_b=b))
    for row in range(src.size(0)):
        src_row = src[row][mask[row, 0, 0]]
        max_len = int(a * src_row.numel() + b)
        prefix, total, ref_steps = [BOS], 0.0, []
        while len(prefix) - 1 < max_len:
            lprobs = _reference_log_probs(models64, src_row, prefix)
            lprobs[PAD] = float("-inf")
            token = int(lprobs.argmax())
            ref_steps.append(lprobs)
            total += float(lprobs[token])
            prefix.append(token)
            if token == EOS:
                break
        tokens = prefix[1:-1] if prefix[-1] == EOS else prefix[1:]
        assert hyps[row][0].tokens == tokens
        assert hyps[row][0].score == pytest.approx(total / (len(prefix) - 1), abs=1e-5)
        # The cached float32 steps, fed the reference's tokens, give the same distributions.
        cache = ensemble.new_cache(8)
        with torch.no_grad():
            memory = ensemble.encode(src_row[None])
            for step, expected in enumerate(ref_steps):
                out = ensemble.decode(torch.tensor([[prefix[step]]]), memory, None, cache)
                got = torch.log_softmax(out[0, -1], dim=-1).double()
                got[PAD] = float("-inf")
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # The reference tells the ensemble from either model and from fairseq's mean of
    # probabilities (log of the arithmetic mean), so the agreement above says something.
    src_row = src[0][mask[0, 0, 0]]
    geometric = _reference_log_probs(models64, src_row, [BOS, 5])
    with torch.no_grad():
        each = [_reference_log_probs([m], src_row, [BOS, 5]) for m in models64]
    arithmetic = torch.logsumexp(torch.stack(each), dim=0) - torch.log(torch.tensor(2.0))
    for other in (*each, torch.log_softmax(arithmetic, dim=-1)):
        assert (other - geometric).abs().max() > 1e-3


def test_with_a_repetition_penalty_an_ensemble_of_one_model_is_that_model(models, sources):
    """The penalty acts on each model's logits before its log-softmax: an ensemble of a model
    (alone, or with itself) decodes as the model, in every search."""
    model = models[0]
    src, mask = sources
    config = DecodingConfig(beam_size=4, n_samples=3, temperature=1.5, repetition_penalty=1.6)
    searches = {
        "greedy": lambda m: greedy_search(m, src, mask, BOS, EOS, config),
        "beam": lambda m: beam_search(m, src, mask, BOS, EOS, config, n_best=4),
        "sample": lambda m: sample(m, src, mask, BOS, EOS, config, prefix=[[5], [], [7, 7], []]),
    }
    for name, search in searches.items():
        alone = search(model)
        for ensemble in (Ensemble([model]), Ensemble([model, model])):
            together = search(ensemble)
            assert [[h.tokens for h in hyps] for hyps in together] == [
                [h.tokens for h in hyps] for hyps in alone
            ], name
            assert [h.score for hyps in together for h in hyps] == pytest.approx(
                [h.score for hyps in alone for h in hyps], abs=1e-5
            ), name
    unpenalised = greedy_search(model, src, mask, BOS, EOS, config.replace(repetition_penalty=1.0))
    assert [h[0].tokens for h in unpenalised] != [h[0].tokens for h in searches["greedy"](model)]


def test_two_models_with_a_repetition_penalty_mean_their_penalised_log_probs(models, sources):
    """Greedy over two models equals a float64 step-by-step decode in which each model's logits
    are penalised by the tokens so far before its own log-softmax."""
    ensemble = Ensemble(models)
    models64 = [_float64_copy(m) for m in models]
    src, mask = sources
    penalty = 2.0
    hyps = greedy_search(ensemble, src, mask, BOS, EOS, DecodingConfig(repetition_penalty=penalty))
    for row in range(src.size(0)):
        src_row = src[row][mask[row, 0, 0]][None]
        max_len = int(1.2 * src_row.size(1) + 10)
        seq: list[int] = []
        total = 0.0
        while len(seq) < max_len:
            each = []
            for m in models64:
                with torch.no_grad():
                    logits = m(src_row, torch.tensor([[BOS, *seq]]))[0, -1]
                for t in set(seq):
                    logits[t] = logits[t] / penalty if logits[t] > 0 else logits[t] * penalty
                each.append(torch.log_softmax(logits, dim=-1))
            lprobs = torch.log_softmax(torch.stack(each).mean(0), dim=-1)
            lprobs[PAD] = float("-inf")
            seq.append(int(lprobs.argmax()))
            total += float(lprobs[seq[-1]])
            if seq[-1] == EOS:
                break
        assert hyps[row][0].tokens == [t for t in seq if t != EOS]
        assert hyps[row][0].score == pytest.approx(total / len(seq), abs=1e-5)


def test_beam_search_over_an_ensemble_drops_finished_sentences_of_a_padded_batch(
    models, sources, monkeypatch
):
    """Sentences finish at other steps and leave the batch (every model's cache rows with
    them); each sentence's beams equal those of the sentence decoded alone, unpadded."""
    from seq2seq.nn.ensemble import EnsembleCache

    ensemble = Ensemble(models)
    src, mask = sources
    reorders: list[tuple[int, bool]] = []
    reorder = EnsembleCache.reorder

    def recording(self, index, include_cross=False):
        reorders.append((index.numel(), include_cross))
        reorder(self, index, include_cross)
        rows = {c.layers[0][0].rows for c in self.caches}
        assert rows == {index.numel()}  # every model's cache holds the new rows

    monkeypatch.setattr(EnsembleCache, "reorder", recording)
    k = 3
    config = DecodingConfig(beam_size=k, max_len_a=1.0, max_len_b=2, length_penalty=0.6)
    batched = beam_search(ensemble, src, mask, BOS, EOS, config, n_best=k)
    assert any(cross and 0 < rows < src.size(0) * k for rows, cross in reorders), reorders
    assert all(len(hyps) == k for hyps in batched)
    for row, hyps in enumerate(batched):
        src_row = src[row][mask[row, 0, 0]][None]
        alone = beam_search(ensemble, src_row, None, BOS, EOS, config, n_best=k)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5)
        assert all(len(h.tokens) <= src_row.size(1) + 2 for h in hyps)


def test_an_ensemble_refuses_models_of_other_vocabularies(models):
    other = Transformer(vocab_size=V + 2, d_model=8, n_heads=2, d_ff=16)
    with pytest.raises(ValueError, match="ensemble model 1 has vocab_size 16, model 0 has 14"):
        Ensemble([models[0], other])
    with pytest.raises(ValueError, match="at least one model"):
        Ensemble([])


# ------------------------------------------------------------------ checkpoints, translate
SENTENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "", "Eine Frau."]


def _save(path, module, tokenizer, pair=("de", "en")):
    """``module`` with ``tokenizer`` as ``seq2seq fit`` writes a checkpoint, trained on
    ``pair``."""
    module.tokenizer = tokenizer
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    checkpoint["pytorch-lightning_version"] = "2.6.6"
    checkpoint["datamodule_hyper_parameters"] = {"src_lang": pair[0], "tgt_lang": pair[1]}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, train_spm):
    """Checkpoints of untrained models: ``a`` and ``a_copy`` (the same weights, beam 3: an
    ensemble refuses them), ``b``
    (another architecture, beam 2), ``other_spm`` (a SentencePiece model of the same size from
    other text) and ``en_de`` (the other direction)."""
    from seq2seq.data.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("ensemble")
    lines = multi30k_lines("train", "de", 400) + multi30k_lines("train", "en", 400)
    tokenizer = Tokenizer.load(train_spm(lines, 120))
    other = Tokenizer.load(train_spm(multi30k_lines("train", "en", 800)[400:], 120))
    torch.manual_seed(0)
    a = tiny_model(vocab_size=120, d_model=16, max_len_b=4, beam_size=3, length_penalty=0.6)
    b = tiny_model(vocab_size=120, d_model=8, n_heads=2, norm_first=True, max_len_b=8, beam_size=2)
    return {
        "a": _save(folder / "a.ckpt", a, tokenizer),
        "a_copy": _save(folder / "a_copy.ckpt", a, tokenizer),
        "b": _save(folder / "b.ckpt", b, tokenizer),
        "other_spm": _save(folder / "other_spm.ckpt", b, other),
        "en_de": _save(folder / "en_de.ckpt", b, tokenizer, ("en", "de")),
    }


def test_translator_of_several_checkpoints_decodes_their_ensemble(checkpoints):
    from seq2seq.checkpoint.models import CheckpointModel

    single = Translator.from_checkpoint(checkpoints["a"], device="cpu")
    with pytest.raises(IncompatibleCheckpointsError, match="a_copy.ckpt holds the same weights"):
        Translator.from_checkpoint([checkpoints["a"], checkpoints["a_copy"]])  # weighs double
    # An ensemble of one model twice (built directly) decodes as that model.
    one = single.module
    twice = Translator(CheckpointModel(Ensemble([one.model, one.model]), one.tokenizer,
                                       one.decoding, one.pairs), device="cpu")  # fmt: skip
    assert isinstance(twice.model, Ensemble) and len(twice.model.models) == 2
    assert isinstance(Translator.from_checkpoint([checkpoints["a"]]).model, Transformer)
    for beam in (1, 3):
        expected = single.translate(SENTENCES, beam_size=beam, return_scores=True)
        got = twice.translate(SENTENCES, beam_size=beam, return_scores=True)
        assert [[t for t, _ in h] for h in got] == [[t for t, _ in h] for h in expected]
        scores = [s for h in got for _, s in h]
        assert scores == pytest.approx([s for h in expected for _, s in h], abs=1e-5)
    # Other architectures ensemble; decoding settings are the first checkpoint's, overridable.
    mixed = Translator.from_checkpoint([checkpoints["b"], checkpoints["a"]], device="cpu")
    assert (mixed.decoding.beam_size, mixed.decoding.max_len_b) == (2, 8)
    assert len(mixed.translate(SENTENCES)) == len(SENTENCES)
    overridden = Translator.from_checkpoint(
        [checkpoints["a"], checkpoints["b"]], beam_size=1, max_len_b=3
    )
    assert (overridden.decoding.beam_size, overridden.decoding.max_len_b) == (1, 3)


def test_translator_refuses_checkpoints_that_do_not_share_a_vocabulary(checkpoints, tmp_path):
    a = checkpoints["a"]
    cases = [
        ("other_spm", ["different SentencePiece models", "id "]),
        ("en_de", ["other directions (en->de and de->en)"]),
    ]
    for name, expected in cases:
        with pytest.raises(IncompatibleCheckpointsError) as info:
            Translator.from_checkpoint([a, checkpoints[name]])
        message = str(info.value)
        for part in ["cannot ensemble", str(a), str(checkpoints[name]), *expected]:
            assert part in message, (part, message)
    with pytest.raises(ValueError, match="a.ckpt is named twice in the ensemble"):
        Translator.from_checkpoint([a, checkpoints["b"], a])
    with pytest.raises(ValueError, match="is a folder .*runs alone"):
        Translator.from_checkpoint([a, tmp_path])
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        Translator.from_checkpoint([a, tmp_path / "missing.ckpt"])


def test_translate_command_decodes_an_ensemble_and_refuses_bad_ensembles(
    checkpoints, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("SEQ2SEQ_TRACEBACK", raising=False)
    a, b = str(checkpoints["a"]), str(checkpoints["b"])
    stdin = "\n".join(SENTENCES).encode()
    code, out, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", a, b, "--scores", stdin=stdin
    )
    assert code == 0, err
    expected = Translator.from_checkpoint([a, b]).translate(SENTENCES, return_scores=True)
    assert out.splitlines() == [f"{h[0][1]:.4f}\t{h[0][0]}" for h in expected]
    missing = str(tmp_path / "missing.ckpt")
    link = tmp_path / "link.ckpt"
    link.symlink_to(a)
    refusals = [
        ([a, str(checkpoints["other_spm"])], ["different SentencePiece models", a]),
        ([a, str(checkpoints["en_de"])], ["other directions", a]),
        ([a, a], [f"{a} is named twice in the ensemble"]),
        ([a, str(checkpoints["a_copy"])], ["holds the same weights as", "weigh them double"]),
        ([a, str(link)], [f"{a} and {link} are the same file"]),
        ([a, missing], [f"checkpoint not found: {missing}"]),
        ([a, str(tmp_path)], [f"{tmp_path} is a folder", "runs alone"]),
    ]
    for paths, parts in refusals:
        code, out, err = run_main(
            monkeypatch, capsys, "translate", "--ckpt_path", *paths, stdin=stdin
        )
        assert code == 2 and out == "", (paths, err)
        assert err[-1].startswith("seq2seq translate: error: --ckpt_path: "), err
        assert not [line for line in err if "error" in line][1:], err  # one error line
        for part in [paths[-1], *parts]:
            assert part in err[-1], (part, err)
