"""What every exporter needs: the checkpoint's parts, refusals by setting name, the output
folder guard and the missing-extra message.

Everything is read from the checkpoint file itself (its ``state_dict``, the model settings and
SentencePiece model that ``seq2seq fit`` stores under ``checkpoint["seq2seq"]``, and its saved
hyper-parameters for the decoding settings), never from a built ``TranslationModule``.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seq2seq.checkpoint import check_model_checkpoint, language_pair, load_checkpoint
from seq2seq.checkpoint.format import IMPORTED_FROM, language_pairs
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.vocabulary import tokenizer_from_bytes
from seq2seq.files import disk_error, write_error
from seq2seq.nn.config import TransformerConfig
from seq2seq.nn.decoding import DecodingConfig
from seq2seq.temporaries import remove_abandoned, temporary_prefix

#: File that ``seq2seq export`` writes into every folder it produces: which format, from which
#: checkpoint, and the decoding settings a CTranslate2 folder is translated with. Only a folder
#: holding it is ever replaced by a later export.
MARKER = "seq2seq_export.json"

#: SentencePiece model copied into a CTranslate2 folder (read back by the translator there).
SENTENCEPIECE_FILE = "sentencepiece.model"


EXTRA_HINT = 'pip install -e ".[export]"'


def require(module: str, purpose: str):
    """Import an optional dependency of the ``export`` extra.

    Args:
        module: the module to import (``"ctranslate2"``, ``"transformers"``).
        purpose: what it is needed for, named in the error (``"--format ctranslate2"``).

    Returns:
        The imported module.

    Raises:
        ModuleNotFoundError: naming the module and the extra to install, in one line.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ModuleNotFoundError(
            f"{purpose} needs the {module} package, which is not installed: install the "
            f'export extra ({EXTRA_HINT}, or pip install "seq2seq[export]")',
            name=module,
        ) from err


@dataclass
class ExportSource:
    """The parts of a checkpoint that an export needs.

    Attributes:
        path: the checkpoint file.
        weights: the model's parameters, keyed without the ``model.`` prefix of the
            LightningModule (``encoder.layers.0.self_attn.qkv.weight`` ...), float32 on CPU.
        config: the architecture (``vocab_size``, ``d_model``, ``n_heads``, ``norm_first``,
            ``positional``, ``tie_embeddings``, ...), as ``seq2seq.nn.Transformer`` takes it;
            every field of :class:`~seq2seq.nn.TransformerConfig` is there (those a checkpoint
            predates take their defaults, which are what it computes).
        decoding: the checkpoint's decoding settings (those it does not record take their
            defaults).
        tokenizer: the SentencePiece model the checkpoint carries.
        languages: ``(src_lang, tgt_lang)`` when the checkpoint records them (and one pair).
        pairs: the ``(src, tgt)`` pairs it was trained on (``data.pairs``, or its one pair);
            ``None`` where not known (an imported model).
    """

    path: Path
    weights: dict[str, torch.Tensor]
    config: dict[str, Any]
    decoding: DecodingConfig
    tokenizer: Tokenizer
    languages: tuple[str, str] | None
    pairs: tuple[tuple[str, str], ...] | None = None

    def weight(self, name: str) -> torch.Tensor:
        """A parameter by its ``seq2seq.nn.Transformer`` name, e.g. ``decoder.norm.weight``.

        Raises:
            ValueError: naming the checkpoint and the missing parameter.
        """
        if name not in self.weights:
            raise ValueError(
                f"{self.path}: the state_dict has no model.{name}; it does not hold a "
                "seq2seq Transformer of its recorded settings"
            )
        return self.weights[name]

    def vocab_rows(self, name: str) -> torch.Tensor:
        """An embedding or output matrix cut to the real vocabulary: ``(V, D)``
        (``seq2seq.nn.Transformer`` pads it to a multiple of 8 rows that are never used)."""
        return self.weight(name)[: self.config["vocab_size"]]


def read_checkpoint(path: str | Path) -> ExportSource:
    """Load what an export needs from a checkpoint written by ``seq2seq fit`` or ``average``.

    Args:
        path: the ``.ckpt`` file.

    Returns:
        The checkpoint's :class:`ExportSource`.

    Raises:
        FileNotFoundError: if the file does not exist.
        seq2seq.checkpoint.CheckpointError: if it is not a checkpoint or holds no weights.
        ValueError: if it carries no model settings or SentencePiece model, or a decoding
            setting out of range (DecodingConfig's message).
    """
    path = Path(path)
    checkpoint = load_checkpoint(path)
    check_model_checkpoint(checkpoint, path)
    extra = checkpoint.get("seq2seq", {})
    if "model_config" not in extra or "tokenizer" not in extra:
        raise ValueError(
            f"{path} carries no model settings or SentencePiece model; export needs a "
            "checkpoint written by seq2seq fit or seq2seq average"
        )
    weights = {
        key[len("model.") :]: value.detach().float().cpu()
        for key, value in checkpoint["state_dict"].items()
        if key.startswith("model.")
    }
    hparams = checkpoint.get("hyper_parameters", {}) or {}
    decoding = DecodingConfig.from_dict(hparams)  # nested "decoding", or older flat keys
    blob = extra["tokenizer"]
    tokenizer = tokenizer_from_bytes(bytes(blob.numpy().tobytes()), name=f"{path} (tokenizer)")
    languages = language_pair(checkpoint)
    pairs = None if IMPORTED_FROM in extra else language_pairs(checkpoint)
    config = dict(extra["model_config"])
    for key in ("positional", "tie_embeddings", "activation", "norm_first"):
        config.setdefault(key, hparams.get(key))
    for key, default in TransformerConfig().to_dict().items():  # fields newer than the file
        if config.get(key) is None:
            config[key] = default if hparams.get(key) is None else hparams[key]
    return ExportSource(path, weights, config, decoding, tokenizer, languages, pairs)


def refuse(source: ExportSource, engine: str, problems: Iterable[tuple[str, str]]) -> None:
    """Refuse, before anything is written, the settings an engine cannot represent.

    Args:
        source: the checkpoint.
        engine: the engine's name in the message (``"CTranslate2"``).
        problems: ``(setting, why)`` pairs, e.g. ``("positional", "rotary positions ...")``.

    Raises:
        ValueError: one line naming every setting (``model.positional=rotary: ...``).
    """
    problems = list(problems)
    if problems:
        what = "; ".join(
            f"model.{name}={source.config[name]!r}: {why}" if name in source.config else why
            for name, why in problems
        )
        raise ValueError(f"{source.path} cannot be exported to {engine}: {what}")


def max_len(src_len: int, max_len_a: float, max_len_b: int, max_positions: int) -> int:
    """The longest hypothesis (tokens, EOS included) for a source of ``src_len`` tokens (EOS
    included), as :func:`seq2seq.nn.rules.max_lengths` computes it: ``int(a * src_len + b)``
    in ``[1, max_positions]``."""
    return max(1, min(math.trunc(max_len_a * float(src_len) + max_len_b), max_positions))


def check_output_folder(output: str | Path) -> Path:
    """Refuse an ``--output`` folder that ``seq2seq export`` did not write, before any work.

    An absent path or an empty folder is taken; an existing folder is replaced only if it holds
    :data:`MARKER` (an earlier export's output). Its parent folder must take new files.

    Returns:
        The output path.

    Raises:
        FileExistsError: for a file, or a folder with other contents.
        PermissionError: if the folder that would hold it takes no new files.
    """
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"--output {output} is a file; export writes a folder")
    if output.is_dir() and any(output.iterdir()) and not (output / MARKER).is_file():
        raise FileExistsError(
            f"--output {output} exists and was not written by seq2seq export (no {MARKER} "
            "in it); give a new or empty folder"
        )
    parent = output.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise PermissionError(f"--output {output}: the folder {parent} takes no new files")
    return output


def write_folder(output: Path, build: Callable[[Path], None], marker: dict[str, Any]) -> Path:
    """Build an export in a temporary folder beside ``output``, then move it into place, so a
    failed export leaves nothing half-written (and an earlier export's folder as it was).
    Staging folders that killed exports left beside ``output`` are removed first (see
    :func:`seq2seq.temporaries.remove_abandoned`).

    Args:
        output: the folder to produce (checked with :func:`check_output_folder`).
        build: writes the export's files into the folder it is given.
        marker: the contents of :data:`MARKER`.

    Returns:
        ``output``.

    Raises:
        WriteError: (an ``OSError``) naming ``output`` if the machine refuses a write (a full
            disk, ...); the temporary folder is removed, an earlier export left as it was.
    """
    output = check_output_folder(output)
    if output.is_dir() and (output / MARKER).is_file():
        kept = f"The previous export in {output} is unchanged."
    else:
        kept = "Nothing partial was written."
    parent = output.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(parent, output.name)  # staging folders of killed exports
        if output.is_dir():  # an earlier export moved aside; only litter once it is back in place
            remove_abandoned(parent, output.name, ".old")
        staging = Path(tempfile.mkdtemp(prefix=temporary_prefix(output.name), dir=parent))
    except OSError as err:
        raise write_error(err, output, kept) from err
    try:
        build(staging)
        (staging / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        _follow_umask(staging)
        if output.exists():
            old = staging.with_name(staging.name + ".old")
            output.rename(old)
            try:
                staging.rename(output)
            except OSError:
                old.rename(output)  # the previous export back in its place
                raise
            shutil.rmtree(old)
        else:
            staging.rename(output)
    except (OSError, RuntimeError) as err:
        # A writer's RuntimeError counts when an OSError is behind it (torch's zip writer).
        cause = disk_error(err)
        if cause is None:
            raise
        raise write_error(cause, output, kept) from err
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return output


def _follow_umask(folder: Path) -> None:
    """Give ``folder`` and everything in it the modes that the umask gives new files: the
    temporary folder is private (``mkdtemp``), and some writers (safetensors) make private
    files, which would keep a serving process of another user or group from reading it."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def read_marker(folder: str | Path) -> dict[str, Any]:
    """The :data:`MARKER` of an exported folder.

    Raises:
        FileNotFoundError: if ``folder`` holds none (it was not written by ``seq2seq export``).
    """
    path = Path(folder) / MARKER
    if not path.is_file():
        checkpoints = sorted(p.name for p in Path(folder).glob("*.ckpt"))
        if checkpoints:  # a checkpoint folder: name a file of it
            pick = "last.ckpt" if "last.ckpt" in checkpoints else checkpoints[-1]
            raise FileNotFoundError(
                f"{folder} is a folder of checkpoints ({', '.join(checkpoints[:4])}"
                f"{', ...' if len(checkpoints) > 4 else ''}): give one of them, e.g. "
                f"{Path(folder) / pick}"
            )
        raise FileNotFoundError(
            f"{folder} is a folder without {MARKER}: not a model folder written by seq2seq "
            "export (give a .ckpt file or an exported CTranslate2 folder; a Hugging Face "
            "folder becomes a checkpoint with seq2seq import)"
        )
    return json.loads(path.read_text())


def source_record(source: ExportSource, fmt: str) -> dict[str, Any]:
    """The common part of :data:`MARKER`: format, checkpoint, settings, languages (the trained
    ``pairs`` as ``[src, tgt]`` lists, for the zero-shot warning of a CTranslate2 folder),
    versions, and a ``note`` of what the export does not carry (sampling)."""
    from seq2seq import __version__

    record = {
        "format": fmt,
        "checkpoint": str(source.path),
        "model_config": source.config,
        "decoding": source.decoding.to_dict(),
        "languages": list(source.languages) if source.languages else None,
        "pairs": [list(pair) for pair in source.pairs] if source.pairs else None,
        "seq2seq_version": __version__,
    }
    if source.decoding.sampling:
        record["note"] = (
            "the checkpoint samples (model.decoding.sampling), which the export does not carry: "
            f"it searches, with beam size {source.decoding.beam_size}"
        )
    return record
