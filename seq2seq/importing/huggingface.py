"""A Hugging Face ``save_pretrained`` folder: its files, and its ``config.json`` as the fields
of :class:`seq2seq.nn.TransformerConfig`, or a one-line refusal of what they cannot represent.

Three classes compute what our Transformer computes:

* ``MarianMTModel`` (OPUS-MT): Post-LN, no final LayerNorm, fixed sinusoids laid out
  sin-half | cos-half, ``final_logits_bias``, decoding from the padding token;
* ``M2M100ForConditionalGeneration`` (M2M-100, NLLB): Pre-LN with final LayerNorms, fairseq's
  sinusoids (``positional="sinusoidal_fairseq"``), decoding from EOS, the target language
  forced as the first generated token;
* ``PegasusForConditionalGeneration`` (what ``seq2seq export --format huggingface`` writes for
  Pre-LN): Pre-LN with final LayerNorms, fixed sinusoids as Marian's.

No ``transformers`` import: the folder is read as files (``config.json``, safetensors or
PyTorch weights, the tokenizer's files).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "FAMILIES",
    "Family",
    "HuggingFaceFolder",
    "model_settings",
    "read_folder",
    "read_weights",
]


@dataclass(frozen=True)
class Family:
    """What one Hugging Face class is in our terms.

    Attributes:
        name: the class (``architectures[0]``).
        model_type: its ``model_type``.
        norm_first: Pre-LN with final LayerNorms (True) or Post-LN without (False).
        positional: our positional table equal to the class's.
        permuted: whether the class's sinusoids are ours up to the ``d_model`` permutation of
            :func:`seq2seq.export.huggingface.interleave_permutation`.
        scale_embedding: the class's default of ``scale_embedding``.
        logits_bias: whether the class adds a ``final_logits_bias``.
    """

    name: str
    model_type: str
    norm_first: bool
    positional: str
    permuted: bool
    scale_embedding: bool
    logits_bias: bool


FAMILIES = {
    family.name: family
    for family in (
        Family("MarianMTModel", "marian", False, "sinusoidal", True, False, True),
        Family(
            "M2M100ForConditionalGeneration",
            *("m2m_100", True, "sinusoidal_fairseq", False, True, False),
        ),
        Family("PegasusForConditionalGeneration", "pegasus", True, "sinusoidal", True, False, True),
    )
}
"""The classes that import takes, by name."""

_BY_TYPE = {family.model_type: family for family in FAMILIES.values()}

#: ``activation_function`` values and our ``activation`` for them (Hugging Face's ``gelu`` is
#: the exact, erf form, as ours; ``swish`` is ``silu``).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "swish": "silu"}

#: Keys of configurations of related classes (BART, mBART, FSMT, older Marian configs written
#: from BART's) and the only value each may have for our layers to compute the same: ``None``
#: for "must be false", or a callable of the family giving the required value.
_FIXED_KEYS: dict[str, Any] = {
    "layernorm_embedding": None,  # mBART: a LayerNorm after the embeddings
    "normalize_embedding": None,
    "add_bias_logits": None,
    "static_position_embeddings": lambda family: True,
    "normalize_before": lambda family: family.norm_first,
    "add_final_layer_norm": lambda family: family.norm_first,
}

#: Files the weights may come in, in the order looked for.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass
class HuggingFaceFolder:
    """A folder's parsed files.

    Attributes:
        path: the folder.
        config: ``config.json``.
        generation: ``generation_config.json`` (``{}`` when absent).
        family: its class.
    """

    path: Path
    config: dict[str, Any]
    generation: dict[str, Any]
    family: Family


def read_folder(folder: str | Path) -> HuggingFaceFolder:
    """Read ``config.json`` (and ``generation_config.json``) of a ``save_pretrained`` folder
    and find its class.

    Raises:
        FileNotFoundError: for a missing folder or ``config.json``; for a folder without
            weights, naming the files looked for.
        ValueError: for unreadable JSON, or a class other than :data:`FAMILIES` (naming
            ``architectures`` / ``model_type`` and the classes supported).
    """
    path = Path(folder)
    if not path.is_dir():
        # owner/name is a Hub id, unless owner is a folder here (then a folder was meant)
        hub = str(folder).count("/") == 1 and not path.exists() and not path.parent.is_dir()
        hint = f"; download a Hub model first: hf download {folder} --local-dir DIR" if hub else ""
        if path.parent != Path(".") and path.parent.is_dir() and not path.exists():
            hint = f"; {path.parent} holds no {path.name}"
        raise FileNotFoundError(f"--input {path} is not a folder (a save_pretrained folder){hint}")
    config = _read_json(path / "config.json", required=True)
    generation = _read_json(path / "generation_config.json", required=False)
    weight_file(path)  # a folder without weights is refused before anything else is read
    names = config.get("architectures") or []
    if names:
        family = FAMILIES.get(names[0])
        what = f"architectures={names!r}"
    else:
        family = _BY_TYPE.get(config.get("model_type"))
        what = f"model_type={config.get('model_type')!r}"
    if family is None:
        raise ValueError(
            f"{path / 'config.json'}: {what} cannot be imported; supported: "
            f"{', '.join(FAMILIES)} (model_type {', '.join(_BY_TYPE)})"
        )
    return HuggingFaceFolder(path, config, generation, family)


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} not found: not a Hugging Face save_pretrained folder")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not readable JSON: {err}") from err
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds {type(value).__name__}, not a JSON object")
    return value


def weight_file(folder: Path) -> Path:
    """The first of :data:`WEIGHT_FILES` in ``folder``.

    Raises:
        FileNotFoundError: naming the folder and the files looked for.
    """
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"--input {folder} holds no weights: none of {', '.join(WEIGHT_FILES)} is there"
    )


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors by their Hugging Face names, float32 on CPU: ``model.safetensors``
    or ``pytorch_model.bin`` (``torch.load(weights_only=True)``), or the shards an
    ``*.index.json`` names.

    Raises:
        FileNotFoundError: as :func:`weight_file`, or for a shard the index names.
        ValueError: for a file that is no readable weights file, naming it.
    """
    path = weight_file(folder)
    if path.name.endswith(".index.json"):
        index = _read_json(path, required=True)
        shards = sorted(set((index.get("weight_map") or {}).values()))
        if not shards:
            raise ValueError(f"{path} has no weight_map naming the shard files")
        files = [folder / name for name in shards]
    else:
        files = [path]
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"{file} not found (named by {path})")
        weights.update(_read_weight_file(file))
    return {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}


def _read_weight_file(file: Path) -> dict[str, torch.Tensor]:
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(file), device="cpu")
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # safetensors' and torch's errors of a damaged file differ
        raise ValueError(f"{file} is not a readable weights file: {err}") from err
    if not isinstance(state, dict):
        raise ValueError(f"{file} holds {type(state).__name__}, not a dictionary of tensors")
    return state


def model_settings(folder: HuggingFaceFolder) -> dict[str, Any]:
    """The :class:`~seq2seq.nn.TransformerConfig` fields of a folder's ``config.json``.

    ``output_bias`` and ``tie_embeddings`` are set from the config here; the weights decide
    ``output_bias`` finally (a bias of zeros needs none). Layerdrop, a training setting of the
    source, is ignored with a warning; dropout rates are carried over.

    Raises:
        ValueError: one line naming the first key (and value) our options cannot represent,
            and what is supported.
    """
    config, family = folder.config, folder.family
    where = folder.path / "config.json"

    def refuse(key: str, why: str) -> ValueError:
        return ValueError(f"{where}: {key}={config.get(key)!r} cannot be imported: {why}")

    def need(key: str) -> Any:
        if key not in config:
            raise ValueError(f"{where} has no {key}")
        return config[key]

    for key, rule in _FIXED_KEYS.items():
        if key in config:
            wanted = False if rule is None else rule(family)
            if bool(config[key]) != wanted:
                raise refuse(key, f"{family.name} import supports {key}={wanted} only")
    activation = ACTIVATIONS.get(str(need("activation_function")))
    if activation is None:
        raise refuse("activation_function", f"supported: {', '.join(ACTIVATIONS)}")
    sizes = {}
    for ours, encoder_key, decoder_key in (
        ("n_heads", "encoder_attention_heads", "decoder_attention_heads"),
        ("d_ff", "encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        sizes[ours] = need(encoder_key)
        if config.get(decoder_key, sizes[ours]) != sizes[ours]:
            raise refuse(
                decoder_key,
                f"seq2seq has one {ours} for encoder and decoder ({encoder_key}={sizes[ours]!r})",
            )
    vocab_size = need("vocab_size")
    decoder_vocab = config.get("decoder_vocab_size") or vocab_size
    shared = bool(config.get("share_encoder_decoder_embeddings", True))
    if decoder_vocab != vocab_size:
        raise refuse(
            "decoder_vocab_size",
            f"seq2seq has one vocabulary for source and target (vocab_size={vocab_size!r})",
        )
    tied_output = bool(config.get("tie_word_embeddings", True))
    if shared and tied_output:
        tie = "all"
    elif tied_output:
        tie = "decoder"
    elif not shared:
        tie = "none"
    else:
        raise refuse(
            "tie_word_embeddings",
            "a source embedding shared with the target's but an output projection of its own "
            "is not a seq2seq tie_embeddings option (all, decoder, none)",
        )
    if family.model_type == "m2m_100" and need("d_model") % 2:
        raise refuse("d_model", "fairseq's sinusoid table needs an even d_model")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if config.get(key):
            warnings.warn(
                f"{where}: {key}={config[key]} ignored (layerdrop, a training setting, is not "
                "a seq2seq option); every layer is kept",
                UserWarning,
                stacklevel=2,
            )
    return {
        "vocab_size": vocab_size,
        "d_model": need("d_model"),
        "n_heads": sizes["n_heads"],
        "n_encoder_layers": need("encoder_layers"),
        "n_decoder_layers": need("decoder_layers"),
        "d_ff": sizes["d_ff"],
        "dropout": float(config.get("dropout", 0.0)),
        "attention_dropout": float(config.get("attention_dropout", 0.0)),
        "activation_dropout": float(config.get("activation_dropout", 0.0)),
        "activation": activation,
        "norm_first": family.norm_first,
        "positional": family.positional,
        "max_positions": need("max_position_embeddings"),
        "tie_embeddings": tie,
        "scale_embedding": bool(config.get("scale_embedding", family.scale_embedding)),
        "output_bias": family.logits_bias,
    }
