"""Translator: built from a checkpoint's config and weights alone, without Lightning."""

import subprocess
import sys

import pytest
import torch

from seq2seq.checkpoint.format import CHECKPOINT_KEY
from seq2seq.data.corpus import read_lines
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.module import TranslationModule
from seq2seq.translator import TranslationModel, Translator, source_batch

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
        max_len_b=6, beam_size=3, length_penalty=0.6,
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
    assert isinstance(translator.module, TranslationModel)
    assert isinstance(translator.model, torch.nn.Module) and not isinstance(
        translator.model, TranslationModule
    )
    assert translator.module.model_config == module.model_config
    assert translator.module.hparams.beam_size == 3  # the checkpoint's decoding settings
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
    assert config == module.config.to_dict() and len(config) == 14
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
    with pytest.raises(ValueError, match=r"^model\.beam_size must be >= 1, got 0$"):
        Translator.from_checkpoint(path, beam_size=0)
    with pytest.raises(ValueError, match="n_heads: checkpoint 4 vs requested 2"):
        Translator.from_checkpoint(path, n_heads=2)
    assert Translator.from_checkpoint(path, dropout=0.3).model.config.dropout == 0.1
