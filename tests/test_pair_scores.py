"""Held-out scores per language pair: each key (``val/de-en``, ``test/de-en/<set>``) scored by
sacreBLEU in its own target language, ``val/*`` and ``test/*`` as unweighted means over the
pairs, one table of every pair and test set, text samples per pair; a data module without
``heldout_keys`` keeps the keys of one pair (``val``, ``test/<set>``)."""

from __future__ import annotations

import math

import lightning as L
import pytest
import sacrebleu
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from seq2seq.callbacks import AttentionHeatmaps, ValidationSamples
from seq2seq.callbacks.tensorboard import _escape_markdown
from seq2seq.data.batching import collate
from seq2seq.data.corpus import read_lines
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.evaluation import Score, score_table
from seq2seq.module import TranslationModule

N = 6  # sentences per held-out set
METRICS = ("bleu", "chrf", "ter", "loss", "nll", "ppl")
CHINESE = [
    "一个男人在骑自行车。",
    "两只狗在雪地里玩耍。",
    "一个女人在街上走。",
    "孩子们在公园里踢足球。",
    "一位老人坐在长椅上看报纸。",
    "一群人在海滩上晒太阳。",
]


def _hypothesis(reference: str) -> str:
    """The reference with every third word (without spaces, its fourth character) left out:
    a hypothesis with scores far from 0 and 100."""
    if " " in reference:
        return " ".join(w for i, w in enumerate(reference.split()) if i % 3 != 2)
    return reference[:3] + reference[4:]


class ReferenceEcho(TranslationModule):
    """Translates each sentence as :func:`_hypothesis` of its reference (known hypotheses;
    the losses are still the model's)."""

    def translate_batch(self, batch, beam_size=None, n_best=1, **decoding):
        return [[(_hypothesis(ref), 0.0)] for ref in batch["ref_text"]]


class PairsData(L.LightningDataModule):
    """Held-out sets by key, ``{key: (sources, references)}``, as a data module of several
    pairs names them; ``heldout_tgt_lang`` reads the target language off the key."""

    def __init__(self, tokenizer: Tokenizer, sets: dict, pairs: list[str]) -> None:
        super().__init__()
        self.tokenizer, self.pair_names = tokenizer, pairs
        self.sets = {key: _examples(tokenizer, *texts) for key, texts in sets.items()}

    def heldout_keys(self, stage: str) -> list[str]:
        return [key for key in self.sets if key.startswith("val") == (stage == "validate")]

    def heldout_tgt_lang(self, key: str) -> str:
        return key.split("/")[1].split("-")[1]

    def val_dataloader(self):
        return [_loader(self.sets[key]) for key in self.heldout_keys("validate")]

    def test_dataloader(self):
        return [_loader(self.sets[key]) for key in self.heldout_keys("test")]


class OnePairData(L.LightningDataModule):
    """Today's data module of one pair: ``val_set``, ``test_sets``, ``test_set_names`` and
    no ``heldout_keys``."""

    def __init__(self, tokenizer: Tokenizer, val: tuple, tests: dict) -> None:
        super().__init__()
        self.tokenizer, self.val_set = tokenizer, _examples(tokenizer, *val)
        self.test_sets = {name: _examples(tokenizer, *texts) for name, texts in tests.items()}
        self.test_set_names = list(tests)

    def val_dataloader(self):
        return _loader(self.val_set)

    def test_dataloader(self):
        return [_loader(self.test_sets[name]) for name in self.test_set_names]


def _examples(tokenizer: Tokenizer, sources: list[str], references: list[str]) -> list[dict]:
    src, tgt = tokenizer.encode(sources), tokenizer.encode(references, side="target")
    return [
        {"index": i, "src": [*s, tokenizer.eos_id], "tgt": t, "src_text": a, "ref_text": b}
        for i, (s, t, a, b) in enumerate(zip(src, tgt, sources, references, strict=True))
    ]


def _loader(examples: list[dict]) -> DataLoader:
    return DataLoader(examples, batch_size=2, collate_fn=collate)


@pytest.fixture(scope="module")
def texts(multi30k_dir) -> dict[str, list[str]]:
    """Lines 0 .. N - 1 (``[:N]``) for de-en, N .. 2N - 1 (``[N:]``) for fr-en: other
    sentences, so the pairs' scores differ."""
    return {
        lang: read_lines(multi30k_dir / f"val.{lang}.gz")[: 2 * N] for lang in ("de", "fr", "en")
    }


@pytest.fixture(scope="module")
def tokenizer(train_spm, multi30k_dir) -> Tokenizer:
    lines = [
        line
        for lang in ("de", "fr", "en")
        for line in read_lines(multi30k_dir / f"val.{lang}.gz")[:300]
    ]
    return Tokenizer.load(train_spm(lines, 200))


def _module(tokenizer: Tokenizer) -> ReferenceEcho:
    L.seed_everything(0, verbose=False)
    return ReferenceEcho(
        vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
        n_decoder_layers=1, d_ff=32, dropout=0.0, max_positions=128,
        decoding={"max_len_a": 0.0, "max_len_b": 5},
    )  # fmt: skip


def _trainer(root, **kwargs) -> L.Trainer:
    kwargs = {"logger": False, **kwargs}
    return L.Trainer(
        accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root, **kwargs,
    )  # fmt: skip


def _metrics(trainer: L.Trainer) -> dict[str, float]:
    return {name: float(value) for name, value in trainer.callback_metrics.items()}


def _sacrebleu(hyps: list[str], refs: list[str], tokenize: str = "13a") -> dict[str, float]:
    """The sacreBLEU package's own scores (``tokenize``: BLEU's tokenizer)."""
    return {
        "bleu": sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize).score,
        "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
        "ter": sacrebleu.corpus_ter(hyps, [refs]).score,
    }


def _direct_loss(module: TranslationModule, examples: list[dict]) -> tuple[float, float]:
    """Label-smoothed loss and NLL per real target token of a whole set, in one batch."""
    with torch.no_grad():
        loss_sum, nll_sum, tokens = module._loss_sums(collate(examples))
    return float(loss_sum / tokens), float(nll_sum / tokens)


def test_each_pair_is_scored_by_sacrebleu_and_val_is_their_mean(tmp_path, texts, tokenizer):
    sets = {
        "val/de-en": (texts["de"][:N], texts["en"][:N]),
        "val/fr-en": (texts["fr"][N:], texts["en"][N:]),
    }
    data = PairsData(tokenizer, sets, ["de-en", "fr-en"])
    module = _module(tokenizer)
    trainer = _trainer(tmp_path)
    trainer.validate(module, datamodule=data, verbose=False)
    logged = _metrics(trainer)
    assert set(module.last_hypotheses) == set(module.last_scores) == set(sets)
    for key, (_, refs) in sets.items():
        assert [index for index, _, _ in module.last_hypotheses[key]] == list(range(N))
        hyps = [hyp for _, hyp, _ in module.last_hypotheses[key]]
        assert hyps == [_hypothesis(ref) for ref in refs]  # this pair's own sentences
        for name, value in _sacrebleu(hyps, refs).items():
            assert logged[f"{key}/{name}"] == pytest.approx(value, abs=1e-4), (key, name)
            assert module.last_scores[key][name].value == pytest.approx(value, abs=1e-9)
        loss, nll = _direct_loss(module, data.sets[key])
        assert logged[f"{key}/loss"] == pytest.approx(loss, rel=1e-5)
        assert logged[f"{key}/nll"] == pytest.approx(nll, rel=1e-5)
        assert (tmp_path / "hypotheses" / f"{key.replace('/', '.')}.step0.txt").is_file()
    de, fr = (_sacrebleu([h for _, h, _ in module.last_hypotheses[k]], sets[k][1]) for k in sets)
    assert abs(de["bleu"] - fr["bleu"]) > 1  # the mean below is not one pair's score
    for name in ("bleu", "chrf", "ter"):
        assert logged[f"val/{name}"] == pytest.approx((de[name] + fr[name]) / 2, abs=1e-4)
    for name in ("loss", "nll"):
        mean = (logged[f"val/de-en/{name}"] + logged[f"val/fr-en/{name}"]) / 2
        assert logged[f"val/{name}"] == pytest.approx(mean, rel=1e-6)
    assert logged["val/ppl"] == pytest.approx(math.exp(logged["val/nll"]), rel=1e-5)
    assert set(logged) == {f"{key}/{m}" for key in ["val", *sets] for m in METRICS}
    assert "val/bleu" in trainer.progress_bar_metrics
    assert "val/de-en/bleu" not in trainer.progress_bar_metrics


def test_a_chinese_target_is_scored_with_sacrebleus_chinese_tokenizer(tmp_path, texts, tokenizer):
    sets = {
        "val/de-en": (texts["de"][:N], texts["en"][:N]),
        "val/en-zh": (texts["en"][:N], CHINESE),
    }
    module = _module(tokenizer)
    trainer = _trainer(tmp_path)
    trainer.validate(
        module, datamodule=PairsData(tokenizer, sets, ["de-en", "en-zh"]), verbose=False
    )
    logged = _metrics(trainer)
    hyps = [hyp for _, hyp, _ in module.last_hypotheses["val/en-zh"]]
    zh, plain = _sacrebleu(hyps, CHINESE, "zh")["bleu"], _sacrebleu(hyps, CHINESE)["bleu"]
    assert zh > plain + 10  # 13a keeps a Chinese sentence as one word
    assert logged["val/en-zh/bleu"] == pytest.approx(zh, abs=1e-4)
    assert module.last_scores["val/en-zh"]["bleu"].signature.split("|")[3] == "tok:zh"
    assert module.last_scores["val/de-en"]["bleu"].signature.split("|")[3] == "tok:13a"


def test_test_scores_every_pair_and_set_in_one_table(tmp_path, texts, tokenizer, capsys):
    sets = {
        "test/de-en/flickr": (texts["de"][:N], texts["en"][:N]),
        "test/de-en/mscoco": (texts["de"][:3], texts["en"][:3]),
        "test/fr-en/flickr": (texts["fr"][N:], texts["en"][N:]),
        "test/fr-en/mscoco": (texts["fr"][N + 3 :], texts["en"][N + 3 :]),
    }
    data = PairsData(tokenizer, sets, ["de-en", "fr-en"])
    module = _module(tokenizer)
    trainer = _trainer(tmp_path)
    trainer.test(module, datamodule=data, verbose=False)
    logged = _metrics(trainer)
    assert list(module.last_scores) == list(sets)  # pair-major, as heldout_keys lists them
    for key, (_, refs) in sets.items():
        hyps = [hyp for _, hyp, _ in module.last_hypotheses[key]]
        assert hyps == [_hypothesis(ref) for ref in refs]
        assert logged[f"{key}/bleu"] == pytest.approx(_sacrebleu(hyps, refs)["bleu"], abs=1e-4)
    for name in ("bleu", "chrf", "ter"):  # the first set's mean over the pairs
        mean = (logged[f"test/de-en/flickr/{name}"] + logged[f"test/fr-en/flickr/{name}"]) / 2
        assert logged[f"test/{name}"] == pytest.approx(mean, abs=1e-4)
    printed = capsys.readouterr().out
    table = score_table(module.last_scores, data.pair_names)
    assert table in printed
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["pair", "set", "BLEU", "chrF2", "TER"]
    assert [row[:2] for row in rows[1:-1]] == [
        ["de-en", "flickr"], ["de-en", "mscoco"], ["fr-en", "flickr"], ["fr-en", "mscoco"],
        ["mean", "flickr"], ["mean", "mscoco"],
    ]  # fmt: skip
    assert rows[1][2] == f"{logged['test/de-en/flickr/bleu']:.2f}"
    assert rows[5][2] == f"{logged['test/bleu']:.2f}"
    assert table.splitlines()[-1] == (
        "(test/bleu, test/chrf, test/ter: the mean over the pairs of flickr)"
    )


def _score(name: str, value: float) -> Score:
    label = {"bleu": "BLEU", "ter": "TER"}[name]
    return Score(name, value, f"{label} = {value:.2f} (sacreBLEU's line)", "signature")


def test_score_table_of_two_pairs_and_two_sets_and_of_one_pair():
    def sets(*values):
        return {"bleu": _score("bleu", values[0]), "ter": _score("ter", values[1])}

    scores = {
        "test/de-en/newstest2013": sets(20.0, 60.0),
        "test/de-en/newstest2014": sets(22.5, 58.0),
        "test/fr-en/newstest2013": sets(30.0, 50.0),
        "test/fr-en/newstest2014": sets(31.25, 49.0),
    }
    assert score_table(scores, ["de-en", "fr-en"]) == "\n".join(
        [
            "pair   set            BLEU    TER",
            "de-en  newstest2013  20.00  60.00",
            "de-en  newstest2014  22.50  58.00",
            "fr-en  newstest2013  30.00  50.00",
            "fr-en  newstest2014  31.25  49.00",
            "mean   newstest2013  25.00  55.00",
            "mean   newstest2014  26.88  53.50",
            "(test/bleu, test/ter: the mean over the pairs of newstest2013)",
        ]
    )
    one_pair = {"test/newstest2013": sets(20.0, 60.0), "test/newstest2014": sets(22.5, 58.0)}
    expected = [
        "set            BLEU    TER",
        "newstest2013  20.00  60.00",
        "newstest2014  22.50  58.00",
        "(test/bleu, test/ter: newstest2013's)",
    ]
    assert score_table(one_pair) == score_table(one_pair, ["de-en"]) == "\n".join(expected)


def test_text_samples_and_attention_for_every_pair(tmp_path, texts, tokenizer, capsys):
    sets = {
        "val/de-en": (texts["de"][:N], texts["en"][:N]),
        "val/fr-en": (texts["fr"][N:], texts["en"][N:]),
    }
    logger = TensorBoardLogger(tmp_path, name="", version=0, default_hp_metric=False)
    trainer = _trainer(
        tmp_path, logger=logger, limit_val_batches=1,
        callbacks=[ValidationSamples(n_samples=3), AttentionHeatmaps(sentence=1)],
    )  # fmt: skip
    module = _module(tokenizer)
    trainer.validate(
        module, datamodule=PairsData(tokenizer, sets, ["de-en", "fr-en"]), verbose=False
    )
    printed = capsys.readouterr().out
    for key in sets:
        assert f"{key}: BLEU" in printed
    # 2 of the 6 lines of each pair decoded (limit_val_batches)
    assert printed.count("scored on 2 of the 6 sentences (--trainer.limit_val_batches)") == 2
    logger.experiment.flush()
    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "images": 0})
    events.Reload()
    assert sorted(events.Tags()["tensors"]) == [
        "val/de-en/samples/text_summary",
        "val/fr-en/samples/text_summary",
    ]
    for key, (sources, references) in sets.items():
        (sample,) = events.Tensors(f"{key}/samples/text_summary")
        rows = sample.tensor_proto.string_val[0].decode().splitlines()[2:]
        assert len(rows) == 3  # line 2, which validation skipped, decoded by the callback
        for line, row in enumerate(rows):
            cells = [cell.strip() for cell in row.strip("|").split(" | ")]
            src, ref = sources[line], references[line]
            assert cells == [str(line), *map(_escape_markdown, (src, ref, _hypothesis(ref)))]
    assert events.Tags()["images"] == ["val/attention/decoder.0.cross"]  # the first pair's


def test_a_data_module_of_one_pair_keeps_todays_keys(tmp_path, texts, tokenizer, capsys):
    val = (texts["de"][:N], texts["en"][:N])
    tests = {
        "flickr": (texts["de"][:N], texts["en"][:N]),
        "mscoco": (texts["de"][:3], texts["en"][:3]),
    }
    data = OnePairData(tokenizer, val, tests)
    module = _module(tokenizer)
    trainer = _trainer(tmp_path)
    trainer.validate(module, datamodule=data, verbose=False)
    assert set(_metrics(trainer)) == {f"val/{m}" for m in METRICS}
    assert list(module.last_scores) == ["val"]
    hyps = [hyp for _, hyp, _ in module.last_hypotheses["val"]]
    assert _metrics(trainer)["val/bleu"] == pytest.approx(
        _sacrebleu(hyps, val[1])["bleu"], abs=1e-4
    )
    assert "val/bleu" in trainer.progress_bar_metrics
    trainer.test(module, datamodule=data, verbose=False)
    logged = _metrics(trainer)
    assert list(module.last_scores) == ["test/flickr", "test/mscoco"]
    assert {f"test/{m}" for m in ("bleu", "chrf", "ter")} <= set(logged)
    for name in ("bleu", "chrf", "ter"):
        assert logged[f"test/{name}"] == pytest.approx(logged[f"test/flickr/{name}"], abs=1e-6)
    table = score_table(module.last_scores)
    assert table.splitlines()[0].split() == ["set", "BLEU", "chrF2", "TER"]
    assert table in capsys.readouterr().out
    assert (tmp_path / "hypotheses" / "test.mscoco.step0.txt").is_file()
