"""Export to a Hugging Face Transformers folder (``AutoModelForSeq2SeqLM`` and
``AutoTokenizer`` load it offline; ``generate`` and ``pipeline("translation")`` work).

The class is the one whose computation is ours:

* ``positional="sinusoidal"``, Pre-LN (``norm_first``), final LayerNorms:
  ``PegasusForConditionalGeneration``;
* ``positional="sinusoidal"``, Post-LN: ``MarianMTModel``;
* ``positional="sinusoidal_fairseq"``, Pre-LN: ``M2M100ForConditionalGeneration``.

All share one embedding matrix between encoder, decoder and output, add fixed sinusoids, use
LayerNorm epsilon 1e-5 and take ``scale_embedding`` (embeddings times ``sqrt(d_model)`` or 1)
and ``activation_function`` (``silu`` for ours) as settings, as ours. Pegasus and Marian add
``final_logits_bias`` (our ``output_bias``); M2M-100 has none. Their sinusoid table lays the
features out sin-half | cos-half where ours interleaves ``sin, cos`` per frequency: the same
table up to a fixed permutation ``P`` of the ``d_model`` axis. LayerNorm and every linear map
commute with ``P`` (a LayerNorm's statistics ignore the order; a linear map reading the
residual stream takes ``W[:, P]``, one writing it ``W[P]``), so the exported model, with every
residual-stream axis permuted by ``P``, computes our logits exactly. fairseq's table is
M2M-100's own: no permutation there.

M2M-100 numbers positions from ``pad_token_id + 1`` (fairseq's rows ``p + 2`` need padding id
1), so its export lays the vocabulary out in fairseq's order, ``<s> <pad> </s> <unk>`` first
(:func:`vocabulary_order`): Hugging Face id ``hf_ids[i]`` holds our id ``i``, in the weights,
the ids of the config and ``vocab.json``.

The tokenizer is ``MarianTokenizer`` over the checkpoint's SentencePiece model
(``source.spm`` = ``target.spm``, ``vocab.json`` mapping each piece to its id in the model:
ours, but for M2M-100 as above); it appends EOS to sources, as our data module does. A
multilingual model's source starts with its target tag, as OPUS-MT's: ``>>fr<< Ein Mann.``
(``MarianTokenizer`` takes a leading ``>>xx<<`` as one token; the tags are special tokens, so
``skip_special_tokens`` drops them from outputs, as we do). The
generation config carries the checkpoint's beam size, length penalty, ``min_len``,
``no_repeat_ngram_size`` and ``repetition_penalty``, decoding from ``<s>``,
``early_stopping=False`` (our beam search's stopping rule) and the padding token suppressed
(after the log-softmax, as ours), with the unknown token where the checkpoint has
``disable_unk``.

``generate`` applies ``repetition_penalty`` as we do in greedy search and sampling (to the
logits), but its beam search applies it after its log-softmax, to log-probabilities, which it
does not renormalise: with a penalty, its beams may differ from ours (the field's documentation,
:class:`seq2seq.nn.DecodingConfig`, says which tokens each engine counts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from seq2seq.export.common import (
    ExportSource,
    check_output_folder,
    read_checkpoint,
    refuse,
    require,
    source_record,
    write_folder,
)

#: Our activations by the names of Hugging Face's ``ACT2FN`` (``silu``: ``x * sigmoid(x)``).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu"}


def unsupported(config: dict[str, Any]) -> list[tuple[str, str]]:
    """``(setting, why)`` for each setting that Pegasus/Marian/M2M-100 cannot represent."""
    problems = []
    fairseq = config["positional"] == "sinusoidal_fairseq"
    if config["positional"] not in ("sinusoidal", "sinusoidal_fairseq"):
        problems.append(
            ("positional", "Pegasus, Marian and M2M-100 have fixed sinusoidal positions only")
        )
    elif fairseq and not config["norm_first"]:
        problems.append(
            (
                "positional",
                "fairseq's table is exported as M2M100ForConditionalGeneration, which is Pre-LN "
                "(norm_first=True)",
            )
        )
    if fairseq and config["output_bias"]:
        problems.append(("output_bias", "M2M100ForConditionalGeneration has no final_logits_bias"))
    if config["tie_embeddings"] != "all":
        problems.append(
            (
                "tie_embeddings",
                "the exported classes share one matrix between source, target and output "
                "(tie_embeddings=all)",
            )
        )
    if config["activation"] not in ACTIVATIONS:
        problems.append(("activation", f"{', '.join(ACTIVATIONS)} only"))
    if config["n_heads"] <= 0 or config["d_model"] % 2:
        problems.append(("d_model", "the sinusoid layout needs an even d_model"))
    return problems


def interleave_permutation(d_model: int) -> torch.Tensor:
    """``P`` with ``x_hf = x_ours[..., P]``: our features ``0, 2, 4, ...`` (sines), then
    ``1, 3, 5, ...`` (cosines), the order of Hugging Face's sinusoid table."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def vocabulary_order(config: dict[str, Any]) -> list[int]:
    """``hf_ids``: the Hugging Face id of each of our ids. The identity, but for M2M-100
    (``positional="sinusoidal_fairseq"``), fairseq's order ``<s> <pad> </s> <unk>`` (fairseq's
    ``Dictionary``): our pad 0, unk 1, bos 2, eos 3 become 1, 3, 0, 2, the rest stay. An
    import that puts pad, unk, the lowest other id and eos first reads these ids back as
    ours (and exporting a model imported from M2M-100 gives back its ids)."""
    hf_ids = list(range(config["vocab_size"]))
    if config["positional"] == "sinusoidal_fairseq":
        hf_ids[:4] = [1, 3, 0, 2]
    return hf_ids


def _in_hf_order(rows: torch.Tensor, hf_ids: list[int]) -> torch.Tensor:
    """Rows indexed by our ids -> rows indexed by Hugging Face ids."""
    out = torch.empty_like(rows)
    out[torch.tensor(hf_ids)] = rows
    return out


def state_dict(source: ExportSource, final_norms: bool) -> dict[str, torch.Tensor]:
    """The weights of the Hugging Face model, keyed by its parameter names.

    Args:
        source: the checkpoint.
        final_norms: Pegasus/M2M-100 names (final LayerNorms) or Marian names.

    Returns:
        float32 tensors for ``model.shared`` (rows in :func:`vocabulary_order`), every layer,
        (Pegasus, M2M-100) ``layer_norm`` and, with ``output_bias``, ``final_logits_bias``
        ``(1, V)``.
    """
    config = source.config
    d = config["d_model"]
    fairseq = config["positional"] == "sinusoidal_fairseq"  # M2M-100's own table: no P
    p = torch.arange(d) if fairseq else interleave_permutation(d)
    hf_ids = vocabulary_order(config)
    w = source.weight
    out: dict[str, torch.Tensor] = {}

    def reads(name: str) -> torch.Tensor:  # a map that reads the residual stream
        return w(name)[:, p]

    def writes(prefix: str, name: str) -> None:  # a map that writes it
        out[f"{prefix}.weight"] = w(f"{name}.weight")[p]
        out[f"{prefix}.bias"] = w(f"{name}.bias")[p]

    def norm(prefix: str, name: str) -> None:
        out[f"{prefix}.weight"] = w(f"{name}.weight")[p]
        out[f"{prefix}.bias"] = w(f"{name}.bias")[p]

    def projections(prefix: str, names: list[str], weight: str, bias: str) -> None:
        for part, wt, bs in zip(
            names, reads(weight).split(d, dim=0), w(bias).split(d, dim=0), strict=True
        ):
            out[f"{prefix}.{part}_proj.weight"] = wt
            out[f"{prefix}.{part}_proj.bias"] = bs

    def feed_forward(prefix: str, name: str) -> None:
        out[f"{prefix}.fc1.weight"] = reads(f"{name}.fc1.weight")
        out[f"{prefix}.fc1.bias"] = w(f"{name}.fc1.bias")
        out[f"{prefix}.fc2.weight"] = w(f"{name}.fc2.weight")[p]
        out[f"{prefix}.fc2.bias"] = w(f"{name}.fc2.bias")[p]

    shared = source.vocab_rows("decoder.embed.weight")[:, p]
    out["model.shared.weight"] = _in_hf_order(shared, hf_ids)
    if config["output_bias"]:
        out["final_logits_bias"] = _in_hf_order(w("output_bias"), hf_ids)[None]
    for stack in ("encoder", "decoder"):
        n_layers = config[f"n_{stack}_layers"]
        for i in range(n_layers):
            ours, hf = f"{stack}.layers.{i}", f"model.{stack}.layers.{i}"
            projections(
                f"{hf}.self_attn",
                ["q", "k", "v"],
                f"{ours}.self_attn.qkv.weight",
                f"{ours}.self_attn.qkv.bias",
            )
            writes(f"{hf}.self_attn.out_proj", f"{ours}.self_attn.out")
            norm(f"{hf}.self_attn_layer_norm", f"{ours}.norm1")
            if stack == "decoder":
                cross = f"{ours}.cross_attn"
                out[f"{hf}.encoder_attn.q_proj.weight"] = reads(f"{cross}.q.weight")
                out[f"{hf}.encoder_attn.q_proj.bias"] = w(f"{cross}.q.bias")
                projections(
                    f"{hf}.encoder_attn", ["k", "v"], f"{cross}.kv.weight", f"{cross}.kv.bias"
                )
                writes(f"{hf}.encoder_attn.out_proj", f"{cross}.out")
                norm(f"{hf}.encoder_attn_layer_norm", f"{ours}.norm2")
            feed_forward(hf, f"{ours}.ff")
            norm(f"{hf}.final_layer_norm", f"{ours}.norm{3 if stack == 'decoder' else 2}")
        if final_norms:
            norm(f"model.{stack}.layer_norm", f"{stack}.norm")
    return out


def build_model(source: ExportSource):
    """The ``PegasusForConditionalGeneration`` (Pre-LN), ``MarianMTModel`` (Post-LN) or
    ``M2M100ForConditionalGeneration`` (fairseq's positions) of a checkpoint, in eval mode,
    with its generation config set from the checkpoint.

    Raises:
        ValueError: for a setting the class cannot represent (:func:`unsupported`).
        ModuleNotFoundError: without the ``export`` extra.
    """
    refuse(
        source,
        "Hugging Face Transformers",
        unsupported(source.config) + tokenizer_problems(source),
    )
    transformers = require("transformers", "seq2seq export --format huggingface")
    config, decoding = source.config, source.decoding
    tok = source.tokenizer
    hf_ids = vocabulary_order(config)
    pad, bos, eos = hf_ids[tok.pad_id], hf_ids[tok.bos_id], hf_ids[tok.eos_id]
    common = dict(
        vocab_size=config["vocab_size"],
        d_model=config["d_model"],
        encoder_layers=config["n_encoder_layers"],
        decoder_layers=config["n_decoder_layers"],
        encoder_attention_heads=config["n_heads"],
        decoder_attention_heads=config["n_heads"],
        encoder_ffn_dim=config["d_ff"],
        decoder_ffn_dim=config["d_ff"],
        activation_function=ACTIVATIONS[config["activation"]],
        dropout=config.get("dropout", 0.0),
        attention_dropout=config.get("attention_dropout", 0.0),
        activation_dropout=config.get("activation_dropout", 0.0),
        max_position_embeddings=config["max_positions"],
        scale_embedding=bool(config["scale_embedding"]),
        pad_token_id=pad,
        bos_token_id=bos,
        eos_token_id=eos,
        decoder_start_token_id=bos,
        forced_eos_token_id=None,  # a hypothesis at the length limit ends without EOS, as ours
        tie_word_embeddings=True,
    )
    m2m100 = config["positional"] == "sinusoidal_fairseq"
    if m2m100:
        no_layerdrop = dict(encoder_layerdrop=0.0, decoder_layerdrop=0.0)  # seq2seq has none
        hf_config = transformers.M2M100Config(**common, **no_layerdrop)
        model = transformers.M2M100ForConditionalGeneration(hf_config)
    elif config["norm_first"]:
        hf_config = transformers.PegasusConfig(**common)
        model = transformers.PegasusForConditionalGeneration(hf_config)
    else:
        hf_config = transformers.MarianConfig(
            **common, decoder_vocab_size=config["vocab_size"], share_encoder_decoder_embeddings=True
        )
        model = transformers.MarianMTModel(hf_config)
    weights = state_dict(source, final_norms=bool(config["norm_first"]))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    allowed = {"lm_head.weight"}  # tied to shared
    if not config["output_bias"]:
        allowed.add("final_logits_bias")  # zero
    allowed |= {k for k in missing if "embed_positions" in k or "embed_tokens" in k}
    if unexpected or set(missing) - allowed:
        raise RuntimeError(
            f"weights do not match {type(model).__name__}: missing {sorted(set(missing) - allowed)}"
            f", unexpected {sorted(unexpected)}"
        )
    if not m2m100:  # M2M-100 computes fairseq's table itself, ours to the bit
        from seq2seq.nn.layers import SinusoidalPositionalEncoding

        table = SinusoidalPositionalEncoding(config["d_model"], config["max_positions"]).table
        with torch.no_grad():
            for stack in (model.model.encoder, model.model.decoder):
                p = interleave_permutation(config["d_model"])
                stack.embed_positions.weight.copy_(table[:, p])
    model.tie_weights()
    generation = model.generation_config
    generation.decoder_start_token_id = bos
    generation.bos_token_id = bos
    generation.eos_token_id = eos
    generation.pad_token_id = pad
    generation.forced_eos_token_id = None
    generation.num_beams = decoding.beam_size
    generation.length_penalty = float(decoding.length_penalty)
    generation.repetition_penalty = float(decoding.repetition_penalty)
    # generate bans the n-grams of its decoder ids, the start token among them, which no
    # n-gram of ours holds: the same bans, after the log-softmax in beam search as ours
    generation.no_repeat_ngram_size = decoding.no_repeat_ngram_size
    generation.early_stopping = False
    generation.min_new_tokens = decoding.min_len or None
    generation.max_new_tokens = config["max_positions"]
    generation.max_length = None
    generation.suppress_tokens = [pad, hf_ids[tok.unk_id]] if decoding.disable_unk else [pad]
    return model.eval()


def tokenizer_problems(source: ExportSource) -> list[tuple[str, str]]:
    """``(setting, why)`` for a tokenizer that ``MarianTokenizer`` cannot stand for: that of
    an imported M2M-100 or NLLB model, whose language codes it would not add."""
    family = getattr(source.tokenizer, "family", None)
    if family in (None, "marian"):
        return []
    return [
        (
            "tokenizer",
            f"its imported {family} tokenizer (language codes before "
            "source and target), which MarianTokenizer cannot reproduce; export to "
            "ctranslate2, or use the model's original Hugging Face folder",
        )
    ]


def build_tokenizer(source: ExportSource, folder: Path):
    """A ``MarianTokenizer`` over the checkpoint's SentencePiece model(s), its files written to
    ``folder`` (``source.spm``, ``target.spm``, ``vocab.json`` with the model's ids,
    :func:`vocabulary_order`), saved there. An imported Marian model's tokenizer keeps its
    own two SentencePiece models and vocabulary (in our id order). A multilingual model's
    ``>>xx<<`` tags are special tokens: its sources are written ``>>fr<< text``."""
    transformers = require("transformers", "seq2seq export --format huggingface")
    tok = source.tokenizer
    imported = getattr(tok, "family", None) == "marian"
    (folder / "source.spm").write_bytes(tok.source_model if imported else tok.to_bytes())
    (folder / "target.spm").write_bytes(tok.target_model if imported else tok.to_bytes())
    pieces = tok.id_to_piece(list(range(source.config["vocab_size"])))
    hf_ids = vocabulary_order(source.config)
    vocab: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        vocab.setdefault(piece, hf_ids[i])  # ids without a piece read as unk's: unk wins
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    src, tgt = source.languages or (None, None)
    # Our >>xx<< tags as special tokens, so that decode(..., skip_special_tokens=True) drops
    # them as ours does; MarianTokenizer splits a leading tag off the source either way.
    tags = [] if imported else tok.id_to_piece(sorted(getattr(tok, "language_ids", ())))
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
        tokenizer = transformers.MarianTokenizer(
            additional_special_tokens=tags,
            source_spm=str(folder / "source.spm"),
            target_spm=str(folder / "target.spm"),
            vocab=str(folder / "vocab.json"),
            source_lang=src,
            target_lang=tgt,
            unk_token=pieces[tok.unk_id],
            eos_token=pieces[tok.eos_id],
            pad_token=pieces[tok.pad_id],
            bos_token=pieces[tok.bos_id],  # never added; skip_special_tokens drops it
            model_max_length=source.config["max_positions"],
        )
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def export_huggingface(ckpt_path: str | Path, output: str | Path) -> Path:
    """Write a Hugging Face Transformers folder for a checkpoint.

    Args:
        ckpt_path: a checkpoint written by ``seq2seq fit`` or ``seq2seq average``.
        output: the folder to write: absent, empty, or an earlier export's (replaced).

    Returns:
        The folder written.

    Raises:
        ValueError: for a setting the target class cannot represent, named before anything
            is written.
        FileExistsError: for an ``output`` that ``seq2seq export`` did not write.
        ModuleNotFoundError: without the ``export`` extra.
    """
    check_output_folder(output)
    source = read_checkpoint(ckpt_path)
    model = build_model(source)

    def build(folder: Path) -> None:
        from transformers.utils import logging as hf_logging

        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # "Writing model shards": one small file here
        try:
            model.save_pretrained(str(folder))
        finally:
            if shown:
                hf_logging.enable_progress_bar()
        build_tokenizer(source, folder)

    marker = source_record(source, "huggingface")
    marker["class"] = type(model).__name__
    notes = []
    if source.decoding.length_penalty_form != "fairseq":
        notes.append(
            "generate divides by len ** length_penalty; the checkpoint's gnmt form is not kept"
        )
    if source.decoding.repetition_penalty != 1.0 and source.decoding.beam_size > 1:
        notes.append(
            "generate's beam search applies repetition_penalty to log-probabilities, seq2seq's "
            "to logits: its beams may differ"
        )
    if notes:
        marker["note"] = "; ".join([*filter(None, [marker.get("note")]), *notes])
    return write_folder(Path(output), build, marker)


def generate_translations(
    model,
    tokenizer,
    sentences: list[str],
    beam_size: int | None = None,
    length_penalty: float | None = None,
    max_len_a: float | None = None,
    max_len_b: int | None = None,
    min_len: int | None = None,
    max_tokens: int = 4096,
    repetition_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
) -> list[str]:
    """Translate with an exported model's ``generate`` under our per-sentence length limits.

    ``generate`` takes one ``max_new_tokens`` per call, so sentences are grouped by their
    limit ``int(max_len_a * src_len + max_len_b)`` (``src_len`` with EOS, at most the model's
    ``max_position_embeddings``) and each group is cut into batches of at most ``max_tokens``
    padded source tokens.

    Args:
        model: the exported ``PegasusForConditionalGeneration`` or ``MarianMTModel``.
        tokenizer: its tokenizer.
        sentences: source sentences.
        beam_size, length_penalty, min_len, repetition_penalty, no_repeat_ngram_size: as
            the fields of :class:`seq2seq.nn.DecodingConfig` (see the module docstring for the
            difference of ``repetition_penalty`` in beam search); ``None``: the model's
            generation config's, which the export wrote from the checkpoint.
        max_len_a, max_len_b: as the fields (the generation config has no such limit);
            ``None``: the checkpoint's, from the ``seq2seq_export.json`` of the folder the
            model was loaded from, else the fields' defaults.
        max_tokens: padded source tokens per batch.

    Returns:
        One translation per sentence, in input order.
    """
    from seq2seq.export.common import MARKER, max_len, read_marker
    from seq2seq.nn import DecodingConfig

    folder = getattr(model, "name_or_path", "")  # the folder from_pretrained read, if any
    saved = {}
    if folder and (Path(folder) / MARKER).is_file():  # the limits the export carried
        saved = read_marker(folder).get("decoding", {})
    defaults = DecodingConfig()
    max_len_a = saved.get("max_len_a", defaults.max_len_a) if max_len_a is None else max_len_a
    max_len_b = saved.get("max_len_b", defaults.max_len_b) if max_len_b is None else max_len_b
    given = {
        "num_beams": beam_size,
        "length_penalty": length_penalty,
        "repetition_penalty": repetition_penalty,
        "no_repeat_ngram_size": no_repeat_ngram_size,
    }
    settings = {k: v for k, v in given.items() if v is not None}  # else the model's
    if min_len is not None:
        settings["min_new_tokens"] = min_len or None  # generate's None: no minimum
    limit = model.config.max_position_embeddings
    ids = tokenizer(list(sentences), truncation=True, max_length=limit)["input_ids"]
    limits = [max_len(len(x), max_len_a, max_len_b, limit) for x in ids]
    order = sorted(range(len(ids)), key=lambda i: (limits[i], len(ids[i])))
    results: list[str] = [""] * len(ids)
    start = 0
    while start < len(order):
        end = start + 1
        while (
            end < len(order)
            and limits[order[end]] == limits[order[start]]
            and (end - start + 1) * len(ids[order[end]]) <= max_tokens
        ):
            end += 1
        chunk = order[start:end]
        batch = tokenizer.pad({"input_ids": [ids[i] for i in chunk]}, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(
                **batch, max_new_tokens=limits[chunk[0]], do_sample=False, **settings
            )
        texts = tokenizer.batch_decode(out, skip_special_tokens=True)
        for i, text in zip(chunk, texts, strict=True):
            results[i] = text
        start = end
    return results
