"""Tiny random Hugging Face translation models (Marian, M2M-100, NLLB) saved offline with
their tokenizer files, for the tests of ``seq2seq import`` and of fine-tuning what it writes."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import multi30k_lines

transformers = pytest.importorskip("transformers")

D_MODEL, HEADS, FFN, LAYERS, POSITIONS = 32, 4, 64, 2, 128
NLLB_CODES = ("deu_Latn", "eng_Latn", "fra_Latn", "spa_Latn")


def fairseq_spm(folder: Path, multi30k_dir: Path) -> Path:
    """A SentencePiece model laid out as fairseq's and OPUS-MT's (unk 0, bos 1, eos 2, no
    padding piece), 200 pieces over 2,000 German and 2,000 English Multi30k lines."""
    import sentencepiece as spm

    text = multi30k_lines("train", "de", 2000, multi30k_dir)
    text += multi30k_lines("train", "en", 2000, multi30k_dir)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text),
        model_prefix=str(folder / "m"),
        vocab_size=200,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    return folder / "m.model"


def pieces(spm_file: Path) -> list[str]:
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(spm_file))
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def randomise(model, seed: int, eos: int | None = None) -> None:
    """Weights far from Hugging Face's near-zero initialisation, so that the distributions
    are peaked and an arg-max is not decided by rounding; the (tied) embedding row of ``eos``
    scaled up, so that hypotheses end at varied lengths."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=g)
            if "layer_norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.25 * noise)
            else:
                param.copy_(0.25 * noise)
        if eos is not None:
            model.get_input_embeddings().weight[eos] *= 2.0


def save(model, folder: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(str(folder))
    return folder


def common(vocab_size: int, **ids) -> dict:
    return dict(
        vocab_size=vocab_size,
        d_model=D_MODEL,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        max_position_embeddings=POSITIONS,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        **ids,
    )


def marian_folder(folder: Path, spm_file: Path) -> Path:
    """OPUS-MT's layout: ``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last; swish, Post-LN,
    a random ``final_logits_bias`` (EOS raised, so that hypotheses end at varied lengths)."""
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces(spm_file)[3:]:
        vocab[piece] = len(vocab)
    pad = vocab["<pad>"] = len(vocab)
    folder.mkdir(parents=True)
    for name in ("source.spm", "target.spm"):
        shutil.copy(spm_file, folder / name)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "MarianTokenizer", "source_lang": "de", "target_lang": "en"})
    )
    config = transformers.MarianConfig(
        **common(len(vocab), pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad),
        activation_function="swish",
        scale_embedding=True,
        forced_eos_token_id=0,
    )
    model = transformers.MarianMTModel(config)
    randomise(model, 1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(1, len(vocab), generator=g))
        model.final_logits_bias[0, 0] += 4.0
    model.generation_config.num_beams = 4
    model.generation_config.max_length = POSITIONS
    model.generation_config.bad_words_ids = [[pad]]
    return save(model, folder)


def m2m_config(vocab_size: int):
    return transformers.M2M100Config(
        **common(vocab_size, pad_token_id=1, eos_token_id=2, bos_token_id=0),
        decoder_start_token_id=2,
        activation_function="relu",
        scale_embedding=True,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )


def m2m_folder(folder: Path, spm_file: Path) -> Path:
    """M2M-100's layout: fairseq's specials, the pieces (vocab.json), 100 language tokens and
    8 made-up words after them."""
    folder.mkdir(parents=True)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece in pieces(spm_file)[3:]:
        vocab.setdefault(piece, len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    shutil.copy(spm_file, folder / "sentencepiece.bpe.model")
    settings = {"tokenizer_class": "M2M100Tokenizer", "language_codes": "m2m100"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    model = transformers.M2M100ForConditionalGeneration(m2m_config(len(vocab) + 100 + 8))
    randomise(model, 3, eos=2)
    return save(model, folder)


def nllb_folder(folder: Path, spm_file: Path) -> Path:
    """NLLB's layout: ``sentencepiece.bpe.model`` with fairseq's id offset, then the language
    codes and ``<mask>`` as added special tokens."""
    folder.mkdir(parents=True)
    shutil.copy(spm_file, folder / "sentencepiece.bpe.model")
    size = 4 + len(pieces(spm_file)) - 3
    added = {str(size + i): {"content": c, "special": True} for i, c in enumerate(NLLB_CODES)}
    added[str(size + len(NLLB_CODES))] = {"content": "<mask>", "special": True}
    settings = {"tokenizer_class": "NllbTokenizer", "added_tokens_decoder": added}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    model = transformers.M2M100ForConditionalGeneration(m2m_config(size + len(NLLB_CODES) + 1))
    randomise(model, 4, eos=2)
    return save(model, folder)


def import_folder(folder: Path, output: Path, **languages):
    from seq2seq.importing import import_huggingface
    from seq2seq.translator import Translator

    import_huggingface(folder, output, **languages)
    return Translator.from_checkpoint(output, device="cpu")


def load_hf(folder: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
