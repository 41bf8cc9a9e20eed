"""A Hugging Face folder written as an ordinary seq2seq checkpoint.

The checkpoint is what ``seq2seq average`` writes (:mod:`seq2seq.checkpoint.format`): weights
under ``model.`` prefixes, ``TranslationModule``'s hyper-parameters with the decoding settings,
the model configuration and tokenizer under ``checkpoint["seq2seq"]``, the language pair, no
training state; and :data:`~seq2seq.checkpoint.format.IMPORTED_FROM`, which names the source
(``fit --ckpt_path`` refuses to resume from it; ``--init_from`` starts a run from it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from seq2seq.checkpoint.format import (
    CHECKPOINT_KEY,
    IMPORTED_FROM,
    LIGHTNING_VERSION,
    tokenizer_tensor,
)
from seq2seq.checkpoint.load import written_by
from seq2seq.files import atomic_write, check_output_file
from seq2seq.importing.generation import decoding_settings
from seq2seq.importing.huggingface import HuggingFaceFolder, model_settings, read_folder
from seq2seq.importing.weights import convert_weights
from seq2seq.nn import DecodingConfig, TransformerConfig

if TYPE_CHECKING:
    from seq2seq.data.vocabulary import VocabularyTokenizer

__all__ = ["ImportResult", "check_replaceable", "import_huggingface"]

#: TranslationModule's hyper-parameters besides the architecture and decoding: its defaults.
_MODULE_DEFAULTS = {
    "label_smoothing": 0.1,
    "val_beam_size": None,
    "metrics": None,
    "compile": False,
}


@dataclass
class ImportResult:
    """What :func:`import_huggingface` wrote.

    Attributes:
        output: the checkpoint file.
        family: the Hugging Face class imported.
        config: the architecture.
        decoding: the decoding settings carried.
        languages: ``(src_lang, tgt_lang)``, or ``None``.
        notes: the keys of the folder that were not carried, and why: decoding settings, and
            a tokenizer_config.json language that is none of the model's.
    """

    output: Path
    family: str
    config: TransformerConfig
    decoding: DecodingConfig
    languages: tuple[str, str] | None
    notes: list[str] = field(default_factory=list)


def check_replaceable(output: str | Path) -> None:
    """Refuse an ``output`` that exists and is not an earlier import's checkpoint (a training
    checkpoint or any other file would be lost), or that cannot be written.

    Raises:
        FileExistsError: naming the file and what it is.
        OSError: as :func:`seq2seq.files.check_output_file`.
    """
    output = Path(output)
    check_output_file(output, "--output")
    if not output.exists():
        return
    own = written_by(output, lambda checkpoint: IMPORTED_FROM in checkpoint.get(CHECKPOINT_KEY, {}))
    if own:
        return
    what = (
        "is not a checkpoint"
        if own is None
        else "is a checkpoint that seq2seq import did not write"
    )
    raise FileExistsError(
        f"--output {output} exists and {what}; importing would replace it: give another file "
        "name (only a file written by seq2seq import is replaced)"
    )


def _tokenizer(
    folder: HuggingFaceFolder, src_lang: str | None, tgt_lang: str | None
) -> VocabularyTokenizer:
    """The folder's tokenizer with its default languages; M2M-100 and NLLB need both.

    Raises:
        ValueError: for a multilingual model without both languages (naming a few of its
            codes), or as :func:`~seq2seq.data.pretrained_tokenizers.read_pretrained_tokenizer`.
    """
    from seq2seq.data.pretrained_tokenizers import read_pretrained_tokenizer

    tokenizer = read_pretrained_tokenizer(folder.path, folder.config)
    languages = tuple(tokenizer.languages)
    if folder.family.model_type == "m2m_100" and not (src_lang and tgt_lang):
        missing = " and ".join(
            f"--{name}" for name, v in (("src_lang", src_lang), ("tgt_lang", tgt_lang)) if not v
        )
        shown = ", ".join(languages[:6]) + (", ..." if len(languages) > 6 else "")
        raise ValueError(
            f"{folder.path} is a multilingual {folder.family.name}: give {missing}, codes of "
            f"its {len(languages)} languages ({shown})"
        )
    if src_lang is None and tgt_lang is None:
        return tokenizer
    return read_pretrained_tokenizer(
        folder.path, folder.config, src_lang=src_lang, tgt_lang=tgt_lang
    )


def _languages_left_out(
    folder: Path, tokenizer: VocabularyTokenizer, given: dict[str, str | None]
) -> list[str]:
    """Notes on tokenizer_config.json's languages that the tokenizer did not take as defaults
    (none of the model's: Marian folders hold the model's name there, ``en`` beside
    ``>>eng<<``, en-ROMANCE's ``ROMANCE``), where none was given instead."""
    path = folder / "tokenizer_config.json"
    settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    notes = []
    for key, names in (
        ("src_lang", ("src_lang", "source_lang")),
        ("tgt_lang", ("tgt_lang", "target_lang")),
    ):
        name = next((n for n in names if settings.get(n)), None)
        if name and not given[key] and getattr(tokenizer, key) != settings[name]:
            languages = list(tokenizer.languages)
            shown = ", ".join(languages[:6]) + (", ..." if len(languages) > 6 else "")
            notes.append(
                f"{path.name} {name}={settings[name]!r} (names no language of the model: "
                f"{shown}; no default: translate takes --{key})"
            )
    return notes


def import_huggingface(
    folder: str | Path,
    output: str | Path,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> ImportResult:
    """Write a Hugging Face ``save_pretrained`` folder as a seq2seq checkpoint.

    Everything is read and checked before the file is written (atomically, replacing only an
    earlier import's output).

    Args:
        folder: a ``MarianMTModel``, ``M2M100ForConditionalGeneration`` or
            ``PegasusForConditionalGeneration`` folder with its tokenizer files.
        output: the ``.ckpt`` file to write.
        src_lang, tgt_lang: the tokenizer's default languages, as the model names them
            (NLLB codes such as ``deu_Latn``, M2M-100's ``de``, Marian's target tags);
            required for M2M-100 and NLLB. The checkpoint records no data language pair:
            ``test``, ``validate`` and ``fit --init_from`` read the files their config names
            (``data.src_lang de``), whatever the model's codes.

    Returns:
        What was written (:class:`ImportResult`).

    Raises:
        FileNotFoundError: for a folder without ``config.json`` or weights.
        FileExistsError: as :func:`check_replaceable`.
        ValueError: one line naming the config key, file or language our options cannot
            represent (:func:`.huggingface.model_settings`, the tokenizer's refusals).
    """
    check_replaceable(output)
    source = read_folder(folder)
    settings = model_settings(source)
    tokenizer = _tokenizer(source, src_lang, tgt_lang)
    if tokenizer.vocab_size != settings["vocab_size"]:
        raise ValueError(
            f"{source.path}: the tokenizer files give {tokenizer.vocab_size} ids but config.json "
            f"has vocab_size={settings['vocab_size']}"
        )
    from seq2seq.importing.huggingface import read_weights

    weights = read_weights(source.path)
    bias = weights.get("final_logits_bias")
    settings["output_bias"] = bool(
        settings["output_bias"] and bias is not None and bool(bias.abs().max() > 0)
    )
    config = TransformerConfig(**settings)
    state = convert_weights(
        weights, config, tokenizer.hf_ids, source.family.permuted, str(source.path)
    )
    pad_hf, unk_hf = tokenizer.hf_ids[tokenizer.pad_id], tokenizer.hf_ids[tokenizer.unk_id]
    decoding, notes = decoding_settings(
        source.generation, source.config, pad_hf, config.max_positions, unk_hf
    )
    notes += _languages_left_out(
        source.path, tokenizer, {"src_lang": src_lang, "tgt_lang": tgt_lang}
    )
    # As the model names them (de given: NLLB's deu_Latn)
    languages = (tokenizer.src_lang, tokenizer.tgt_lang) if src_lang and tgt_lang else None
    # The model's codes (deu_Latn) are not the data files' names (de): no pair is recorded.
    checkpoint = build_checkpoint(config, state, tokenizer, decoding, None)
    checkpoint[CHECKPOINT_KEY][IMPORTED_FROM] = {
        "folder": str(source.path.absolute()),
        "class": source.family.name,
        "transformers_version": source.config.get("transformers_version"),
    }
    output = Path(output)
    with atomic_write(output, "wb") as f:
        torch.save(checkpoint, f)
    return ImportResult(output, source.family.name, config, decoding, languages, notes)


def build_checkpoint(
    config: TransformerConfig,
    state: dict[str, torch.Tensor],
    tokenizer: Any,
    decoding: DecodingConfig,
    languages: tuple[str, str] | None,
) -> dict[str, Any]:
    """The checkpoint dictionary of a model without training state (as ``seq2seq average``
    writes), loadable with ``torch.load(weights_only=True)``.

    Args:
        config: the architecture.
        state: ``Transformer(config).state_dict()`` values.
        tokenizer: anything with ``to_bytes()`` that ``Tokenizer.from_bytes`` reads back.
        decoding: the decoding settings (``hyper_parameters["decoding"]``).
        languages: ``(src_lang, tgt_lang)`` (the data module's settings), or ``None``.
    """
    hparams = (
        _MODULE_DEFAULTS
        | {"tgt_lang": languages[1] if languages else None}
        | config.to_dict()
        | {"decoding": decoding.to_dict()}
    )
    # No epoch or global_step: the weights were not trained by seq2seq (messages say "trained
    # N steps" of a checkpoint that records one).
    checkpoint: dict[str, Any] = {
        LIGHTNING_VERSION: _lightning_version(),
        "state_dict": {f"model.{k}": v for k, v in state.items()},
        "hparams_name": "kwargs",
        "hyper_parameters": hparams,
        CHECKPOINT_KEY: {
            "model_config": config.to_dict(),
            "tokenizer": tokenizer_tensor(tokenizer.to_bytes()),
        },
    }
    if languages:
        checkpoint["datamodule_hyper_parameters"] = {
            "src_lang": languages[0],
            "tgt_lang": languages[1],
        }
    return checkpoint


def _lightning_version() -> str:
    """The installed Lightning's version, without importing it (Lightning's ``Trainer`` reads
    it back to restore a checkpoint)."""
    try:
        return version("lightning")
    except PackageNotFoundError:
        return version("pytorch-lightning")
