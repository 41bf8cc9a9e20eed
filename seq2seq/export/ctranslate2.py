"""Export to CTranslate2, and translation through an exported CTranslate2 folder.

The folder is built with CTranslate2's own specification API
(``ctranslate2.specs.TransformerSpec.from_config``, ``validate``, ``optimize``, ``save``) from
the checkpoint's weights. It reproduces :class:`seq2seq.nn.Transformer` exactly:

* token embeddings times ``sqrt(d_model)`` (or times 1 without ``scale_embedding``) plus the
  position table, written out explicitly: our interleaved sinusoids (CTranslate2's built-in
  table lays sin and cos out in halves), fairseq's rows ``p + 2`` for
  ``sinusoidal_fairseq`` (what CTranslate2's own M2M-100 converter writes), or the learned
  one;
* Pre-LN with final LayerNorms, or Post-LN without them; LayerNorm epsilon 1e-5;
* relu, gelu (erf) or silu (CTranslate2's ``SWISH``, as its Marian converter maps
  ``swish``), and the output bias as the projection's bias (its converters'
  ``final_logits_bias``);
* sources end with EOS (``add_source_eos``), decoding starts from ``<s>``;
* the fused ``[q; k; v]`` and ``[k; v]`` projections are CTranslate2's own layout.

The SentencePiece model travels in the folder (``sentencepiece.model``), with the checkpoint's
decoding settings in ``seq2seq_export.json``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.data.tokenizer import Tokenizer, check_sentences, source_ids
from seq2seq.data.vocabulary import load_tokenizer
from seq2seq.export.common import (
    SENTENCEPIECE_FILE,
    ExportSource,
    max_len,
    read_checkpoint,
    read_marker,
    refuse,
    require,
    source_record,
    write_folder,
)
from seq2seq.nn.decoding import DecodingConfig
from seq2seq.text_decoding import requested_languages
from seq2seq.text_scoring import TranslationScore, check_pairs, target_ids, translation_score

#: ``--quantization`` values: CTranslate2's weight types (``none`` keeps float32).
QUANTIZATIONS = (
    "none",
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)

LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which seq2seq.nn uses

#: Our activations by the names of CTranslate2's ``common_spec.Activation``.
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH"}  # GELU: erf form, as F.gelu


def unsupported(config: dict[str, Any]) -> list[tuple[str, str]]:
    """``(setting, why)`` for each setting of ``config`` that the CTranslate2 Transformer
    cannot represent exactly."""
    problems = []
    if config["positional"] == "rotary":
        problems.append(
            (
                "positional",
                "rotary positions in a Transformer encoder-decoder are not exported "
                "(export sinusoidal or learned positions)",
            )
        )
    if config["activation"] not in ACTIVATIONS:
        problems.append(("activation", f"CTranslate2 takes {', '.join(ACTIVATIONS)} here"))
    return problems


def _linear(spec, weight, bias=None) -> None:
    spec.weight = weight.numpy()
    if bias is not None:
        spec.bias = bias.numpy()


def _norm(spec, source: ExportSource, name: str) -> None:
    spec.gamma = source.weight(f"{name}.weight").numpy()
    spec.beta = source.weight(f"{name}.bias").numpy()


def _attention(spec, source: ExportSource, name: str, self_attention: bool) -> None:
    """Our ``qkv`` (self) or ``q`` + ``kv`` (cross) projections, already fused in
    CTranslate2's order, and the output projection."""
    w = source.weight
    if self_attention:
        _linear(spec.linear[0], w(f"{name}.qkv.weight"), w(f"{name}.qkv.bias"))
    else:
        _linear(spec.linear[0], w(f"{name}.q.weight"), w(f"{name}.q.bias"))
        _linear(spec.linear[1], w(f"{name}.kv.weight"), w(f"{name}.kv.bias"))
    _linear(spec.linear[-1], w(f"{name}.out.weight"), w(f"{name}.out.bias"))


def _ffn(spec, source: ExportSource, name: str) -> None:
    w = source.weight
    _linear(spec.linear_0, w(f"{name}.fc1.weight"), w(f"{name}.fc1.bias"))
    _linear(spec.linear_1, w(f"{name}.fc2.weight"), w(f"{name}.fc2.bias"))


def _positions(source: ExportSource, prefix: str) -> np.ndarray:
    """``(max_positions, D)`` float32 table added to the (scaled) embeddings of the
    ``prefix`` stack, row ``p`` for position ``p``: the one
    :class:`seq2seq.nn.layers.SinusoidalPositionalEncoding` (sin and cos interleaved) or
    :class:`~seq2seq.nn.layers.FairseqSinusoidalPositionalEncoding` (fairseq's rows ``2 ..``)
    computes, or the learned one."""
    from seq2seq.nn.config import TransformerConfig
    from seq2seq.nn.layers import positional_encoding

    config = source.config
    if config["positional"] == "learned":
        return source.weight(f"{prefix}.positions.weight").numpy()
    table = positional_encoding(TransformerConfig.from_dict(config)).table
    return table.numpy().astype(np.float32)


def build_spec(source: ExportSource):
    """The ``ctranslate2.specs.TransformerSpec`` of a checkpoint, filled and validated.

    Raises:
        ValueError: for a setting CTranslate2 cannot represent (:func:`unsupported`).
        ModuleNotFoundError: without the ``export`` extra.
    """
    refuse(source, "CTranslate2", unsupported(source.config))
    require("ctranslate2", "seq2seq export --format ctranslate2")
    from ctranslate2.specs import common_spec, transformer_spec

    config = source.config
    activation = common_spec.Activation[ACTIVATIONS[config["activation"]]]
    spec = transformer_spec.TransformerSpec.from_config(
        (config["n_encoder_layers"], config["n_decoder_layers"]),
        config["n_heads"],
        pre_norm=config["norm_first"],
        activation=activation,
    )
    for stack, cross in ((spec.encoder, False), (spec.decoder, True)):
        prefix = "decoder" if cross else "encoder"
        embeddings = stack.embeddings if cross else stack.embeddings[0]
        embeddings.weight = source.vocab_rows(f"{prefix}.embed.weight").numpy()
        # True: times sqrt(d_model), as seq2seq.nn does; False: times 1.
        stack.scale_embeddings = bool(config["scale_embedding"])
        stack.position_encodings.encodings = _positions(source, prefix)
        if config["norm_first"]:
            _norm(stack.layer_norm, source, f"{prefix}.norm")
        for i, layer in enumerate(stack.layer):
            name = f"{prefix}.layers.{i}"
            _attention(layer.self_attention, source, f"{name}.self_attn", self_attention=True)
            _norm(layer.self_attention.layer_norm, source, f"{name}.norm1")
            if cross:
                _attention(layer.attention, source, f"{name}.cross_attn", self_attention=False)
                _norm(layer.attention.layer_norm, source, f"{name}.norm2")
            _ffn(layer.ffn, source, f"{name}.ff")
            _norm(layer.ffn.layer_norm, source, f"{name}.norm{3 if cross else 2}")
    spec.decoder.projection.weight = source.vocab_rows("output.weight").numpy()
    if config["output_bias"]:  # (V,), over the real vocabulary already
        spec.decoder.projection.bias = source.weight("output_bias").numpy()

    pieces = source.tokenizer.id_to_piece(list(range(config["vocab_size"])))
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    tok = source.tokenizer
    spec.config.unk_token = pieces[tok.unk_id]
    spec.config.bos_token = pieces[tok.bos_id]
    spec.config.eos_token = pieces[tok.eos_id]
    spec.config.decoder_start_token = pieces[tok.bos_id]  # decoding starts from <s>
    spec.config.add_source_eos = True  # our data module ends every source with EOS
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.validate()
    return spec


def export_ctranslate2(
    ckpt_path: str | Path, output: str | Path, quantization: str | None = None
) -> Path:
    """Write a CTranslate2 model folder for a checkpoint.

    Args:
        ckpt_path: a checkpoint written by ``seq2seq fit`` or ``seq2seq average``.
        output: the folder to write: absent, empty, or an earlier export's (replaced).
        quantization: one of :data:`QUANTIZATIONS` (``None``/``"none"``: float32 weights).

    Returns:
        The folder written.

    Raises:
        ValueError: for a setting CTranslate2 cannot represent, named before anything is
            written, or an unknown quantization.
        FileExistsError: for an ``output`` that ``seq2seq export`` did not write.
        ModuleNotFoundError: without the ``export`` extra.
    """
    quantization = None if quantization in (None, "none") else quantization
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"--quantization {quantization}: choose from {', '.join(QUANTIZATIONS)}")
    from seq2seq.export.common import check_output_folder

    check_output_folder(output)
    source = read_checkpoint(ckpt_path)
    spec = build_spec(source)
    spec.optimize(quantization=quantization)  # aliases the tied matrices, then quantizes

    def build(folder: Path) -> None:
        (folder / SENTENCEPIECE_FILE).write_bytes(source.tokenizer.to_bytes())
        spec.save(str(folder))

    marker = source_record(source, "ctranslate2")
    marker["quantization"] = quantization or "float32"
    return write_folder(Path(output), build, marker)


class CTranslate2Translator:
    """Translation through an exported CTranslate2 folder, with the options and outputs of
    :class:`seq2seq.translator.Translator`.

    Sources are encoded with the folder's SentencePiece model (EOS appended by CTranslate2,
    cut to ``max_positions`` with the same warning), sorted by length and cut into batches of
    at most ``max_tokens`` source tokens. CTranslate2 takes one ``max_decoding_length`` per
    batch: each batch runs under the largest length limit of its sentences (``max_len =
    int(max_len_a * src_len + max_len_b)``, EOS included, at most ``max_positions``), and a
    sentence whose hypothesis reaches its own, lower limit is translated again under that limit
    alone (with others of the same limit). Greedy results are thus those of one call per limit;
    a beam search can still differ where a sentence's search ran past its own limit without its
    hypotheses reaching it. The padding token is never generated. A line with no piece the
    model knows comes back empty, scored 0.

    Differences that remain (both from CTranslate2's search, not the model): a beam search
    ends when ``beam_size * patience`` hypotheses have finished, where ours ends when no open
    beam can still beat the ``beam_size``-th finished one (Hugging Face's
    ``early_stopping=False``); the two agree exactly with ``length_penalty=0``. CTranslate2
    removes banned tokens before its softmax, ours after it: an early EOS under ``min_len``
    changes the reported scores by its probability, and the padding token is banned only in a
    batch where CTranslate2 chose it (run again), so that other scores stay exact.

    Target prefixes, ``no_repeat_ngram_size``, ``repetition_penalty`` and ``disable_unk`` go to
    CTranslate2's own ``target_prefix``, ``no_repeat_ngram_size``, ``repetition_penalty`` (which
    penalises the generated tokens, prefix included, on the logits: ours) and ``disable_unk``
    (a ban before its softmax, as above: greedy texts are ours, but scores are higher where
    the unknown token had some probability, and beams can differ). Sampling is refused:
    CTranslate2 draws from one random generator per process, so its samples would depend on the
    batch and could not repeat ours.

    Args:
        folder: a folder written by ``seq2seq export --format ctranslate2``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; ``None`` picks CUDA when available.
        max_tokens: source tokens per batch.
        compute_type: CTranslate2's compute type (``"default"``: the saved weights' type).
        intra_threads: CPU threads per translation (0: CTranslate2's default).
        patience: CTranslate2's beam patience factor (see above). 2 (CTranslate2's default
            is 1) lets a beam run on until ``2 * beam_size`` hypotheses have finished, closer
            to our rule: on test_2016_flickr it gave 996 of 1,000 beam-5 outputs identical to
            ours, 1 gave 989 (``benchmarks/README.md``), at about the same speed.
        **decoding: overrides of the folder's decoding settings (fields of
            :class:`~seq2seq.nn.DecodingConfig`).

    Attributes:
        decoding: the folder's decoding settings with the overrides.

    Raises:
        FileNotFoundError: if ``folder`` was not written by ``seq2seq export``.
        ValueError: for another export format, an unknown decoding setting, a value out of
            range (DecodingConfig's message), or one CTranslate2 has no equivalent of
            (``length_penalty_form="gnmt"``, sampling).
        ModuleNotFoundError: without the ``export`` extra.
    """

    def __init__(
        self,
        folder: str | Path,
        device: str | None = None,
        max_tokens: int = 4096,
        compute_type: str = "default",
        intra_threads: int = 0,
        patience: float = 2.0,
        **decoding: Any,
    ) -> None:
        folder = Path(folder)
        marker = read_marker(folder)
        if marker.get("format") != "ctranslate2":
            raise ValueError(
                f"{folder} holds a {marker.get('format')} export; translate needs a "
                "CTranslate2 folder (seq2seq export --format ctranslate2)"
            )
        ct2 = require("ctranslate2", "translating with a CTranslate2 folder")
        _check_known(decoding, DecodingConfig.field_names())
        # Folders exported before a setting existed take its default.
        self.decoding = DecodingConfig.from_dict(marker["decoding"]).replace(**decoding)
        _check_form(self.decoding.length_penalty_form)
        _check_no_sampling(decoding)
        if self.decoding.sampling:  # the checkpoint's own: the folder searches instead
            self.decoding = self.decoding.replace(sampling=False)
            warnings.warn(
                "the checkpoint samples (model.decoding.sampling), which CTranslate2 does not "
                f"offer here: {folder} searches, with beam size {self.decoding.beam_size}",
                stacklevel=2,
            )
        self.model_config = marker["model_config"]
        self.tokenizer = load_tokenizer(folder / SENTENCEPIECE_FILE)
        if device is None:
            device = "cuda" if ct2.get_cuda_device_count() > 0 else "cpu"
        kind, _, index = str(device).partition(":")
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"--device {device}: CTranslate2 runs on cpu or cuda[:N] only")
        self.device = device
        self.max_tokens = max_tokens
        self.patience = patience
        self.model = ct2.Translator(
            str(folder),
            device=kind,
            device_index=int(index or 0),
            compute_type=compute_type,
            intra_threads=intra_threads,
        )
        pairs = marker.get("pairs")  # folders exported before it was written: not known
        self.pairs = None if not pairs else tuple((src, tgt) for src, tgt in pairs)
        self._pieces = self.tokenizer.id_to_piece(list(range(self.model_config["vocab_size"])))
        self._ids = {piece: i for i, piece in enumerate(self._pieces)}

    @property
    def beam_size(self) -> int:
        """The beam size used when ``translate`` is given none."""
        return self.decoding.beam_size

    @property
    def settings(self) -> dict[str, Any]:
        """:attr:`decoding` as a dictionary of its fields."""
        return self.decoding.to_dict()

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Source ids without EOS (CTranslate2 appends it), cut so that with EOS they fit
        ``max_positions``; cut lines are named in one ``UserWarning`` as
        :meth:`seq2seq.translator.Translator.encode` names them."""
        return self._encode(sentences)

    def _encode(
        self,
        sentences: Sequence[str],
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        first_line: int = 1,
    ) -> list[list[int]]:
        """:meth:`encode`; its warning points at the code that called :meth:`encode` or
        :meth:`translate`. A target-language tag goes first (``tgt_lang``)."""
        limit = self.model_config["max_positions"]
        languages = {"tgt_lang": tgt_lang, "src_lang": src_lang, "first_line": first_line}
        return source_ids(self.tokenizer, sentences, limit, stacklevel=4, **languages)

    def translate(
        self,
        sentences: str | Sequence[str],
        beam_size: int | None = None,
        n_best: int = 1,
        return_scores: bool = False,
        prefixes: Sequence[str] | str | None = None,
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        first_line: int = 1,
        **decoding: Any,
    ):
        """Translate one sentence or a list of them, as
        :meth:`seq2seq.translator.Translator.translate` does (same arguments and results;
        ``prefixes`` and a forced target-language token go to CTranslate2's
        ``target_prefix``, a ``>>xx<<`` tag to the source; the folder's trained ``pairs``
        give the same zero-shot warning).

        Raises:
            ValueError: if ``n_best`` exceeds the beam size, for an unknown decoding setting or
                one out of range (DecodingConfig's message), for ``length_penalty_form="gnmt"``
                (CTranslate2 divides by ``len ** length_penalty`` only), for sampling, or for
                ``prefixes`` of another length than ``sentences``, or a ``tgt_lang`` the model
                has no token for.
        """
        tgt_lang, src_lang, language = requested_languages(
            self.tokenizer, self.pairs, tgt_lang, src_lang
        )  # before any work
        _check_known(decoding, set(DecodingConfig.field_names()) - {"beam_size"})
        if beam_size is not None:
            decoding = {**decoding, "beam_size": beam_size}
        settings = self.decoding.replace(**decoding)
        _check_form(settings.length_penalty_form)
        _check_no_sampling(decoding)
        beam = settings.beam_size
        if n_best > beam:
            raise ValueError(f"n_best ({n_best}) exceeds the beam size ({beam})")
        single = isinstance(sentences, str)
        if single and isinstance(prefixes, str):
            prefixes = [prefixes]
        encoded = self._encode([sentences] if single else sentences, tgt_lang, src_lang, first_line)
        forced = _prefix_ids(self.tokenizer, prefixes, len(encoded), tgt_lang)
        if forced is None and language[1]:  # e.g. NLLB's target-language code
            forced = [list(language[1]) for _ in encoded]
        limits = [
            max_len(
                len(ids) + 1,
                settings.max_len_a,
                settings.max_len_b,
                self.model_config["max_positions"],
            )
            for ids in encoded
        ]
        order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i]), limits[i]))
        results: list[Any] = [None] * len(encoded)

        def translate(chunk: list[int], limit: int) -> list[int]:
            """One CTranslate2 call with the length limit ``limit``; the sentences of
            ``chunk`` whose hypotheses reached their own, lower limit (to be run again)."""
            chunk_prefixes = None if forced is None else [forced[i] for i in chunk]
            hyps, lengths = self._translate_chunk(
                [encoded[i] for i in chunk], limit, beam, n_best, settings, chunk_prefixes
            )
            for i, h in zip(chunk, hyps, strict=True):
                results[i] = h[0][0] if n_best == 1 and not return_scores else h
            return [
                i
                for i, n in zip(chunk, lengths, strict=True)
                if limits[i] < limit and n >= limits[i] - 1
            ]

        # One limit per call, the largest of its batch: batches of many lengths run several
        # times faster than one per length (test_2016_flickr, greedy: ~4x on 2 threads).
        shared = [i for i in order if limits[i] >= settings.min_len]  # min_len is per batch
        again = [i for i in order if limits[i] < settings.min_len]
        for chunk in self._batches(shared, encoded):
            again += translate(chunk, max(limits[i] for i in chunk))
        # A sentence that reached its own limit is translated again under it, with others of
        # the same limit, so that the limit cuts it where ours would.
        again.sort(key=lambda i: (len(encoded[i]), limits[i]))
        for limit in sorted({limits[i] for i in again}):
            for chunk in self._batches([i for i in again if limits[i] == limit], encoded):
                translate(chunk, limit)
        return results[0] if single else results

    def score(
        self,
        sources: str | Sequence[str],
        targets: str | Sequence[str],
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        first_line: int = 1,
    ) -> TranslationScore | list[TranslationScore]:
        """The log-probability of each given translation through CTranslate2's
        ``score_batch``, as :meth:`seq2seq.translator.Translator.score` gives it (same
        arguments, results and errors)."""
        if isinstance(sources, str) and isinstance(targets, str):  # one pair: its score alone
            return self.score([sources], [targets], tgt_lang, src_lang, first_line)[0]
        tgt_lang, src_lang, language = requested_languages(
            self.tokenizer, self.pairs, tgt_lang, src_lang
        )  # before any work
        sources, targets = check_pairs(sources, targets)
        encoded = self._encode(sources, tgt_lang, src_lang, first_line)
        limit = self.model_config["max_positions"]
        tgt_ids, kept = target_ids(self.tokenizer, targets, tgt_lang, limit, first_line)
        pieces = self._pieces
        found = self.model.score_batch(
            [[pieces[i] for i in encoded[k]] for k in kept],
            [[pieces[i] for i in tgt_ids[k]] for k in kept],
            max_batch_size=self.max_tokens,
            batch_type="tokens",
            max_input_length=0,  # sources are cut to max_positions already
        )
        results = [TranslationScore(math.nan, (), ()) for _ in sources]
        forced = len(language[1])  # the target-language code, not scored
        for k, result in zip(kept, found, strict=True):
            results[k] = translation_score(self.tokenizer, tgt_ids[k], result.log_probs, forced)
        return results

    def _batches(self, order: list[int], encoded: list[list[int]]) -> Iterator[list[int]]:
        """``order`` (sorted by length) cut into runs of at most ``max_tokens`` padded source
        tokens (EOS included), at least one sentence each."""
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * (len(encoded[order[end]]) + 1) <= (
                self.max_tokens
            ):
                end += 1
            yield order[start:end]
            start = end

    def _translate_chunk(
        self,
        sources: list[list[int]],
        limit: int,
        beam: int,
        n_best: int,
        settings: DecodingConfig,
        prefixes: list[list[int]] | None = None,
    ) -> tuple[list[list[tuple[str, float]]], list[int]]:
        """One CTranslate2 call for sources under the length limit ``limit`` (``prefixes``:
        target ids forced first, per source): the ``n_best`` (text, score) pairs of each, and
        the token count of each one's longest hypothesis (0 for a line translated empty)."""
        tok = self.tokenizer
        special = {tok.pad_id, tok.eos_id, tok.unk_id, tok.space_id}
        special |= getattr(tok, "language_ids", frozenset())
        output: list[list[tuple[str, float]]] = [[("", 0.0)] * n_best for _ in sources]
        lengths = [0] * len(sources)
        known = [i for i, ids in enumerate(sources) if any(t not in special for t in ids)]
        if not known:
            return output, lengths
        batch = [[self._pieces[t] for t in sources[i]] for i in known]
        options = dict(
            beam_size=beam,
            patience=self.patience,
            num_hypotheses=n_best,
            length_penalty=settings.length_penalty,
            max_decoding_length=limit,
            min_decoding_length=min(settings.min_len, limit),
            max_input_length=0,  # encode() already cut to max_positions
            return_scores=True,
            no_repeat_ngram_size=settings.no_repeat_ngram_size,
            repetition_penalty=settings.repetition_penalty,
            disable_unk=settings.disable_unk,
        )
        if prefixes is not None and any(prefixes[i] for i in known):
            options["target_prefix"] = [
                [self._pieces[t] for t in prefixes[i]] or None for i in known
            ]
            # our max_len is at least len(prefix) + 1; one limit serves the batch
            longest = max(len(prefixes[i]) for i in known)
            options["max_decoding_length"] = max(limit, longest + 1)
        translated = self.model.translate_batch(batch, **options)
        pad = self._pieces[tok.pad_id]
        if any(pad in hyp for result in translated for hyp in result.hypotheses):
            # CTranslate2 bans tokens before its softmax, which would change every score by
            # the padding token's probability; so only a batch that chose it is run again.
            translated = self.model.translate_batch(batch, suppress_sequences=[[pad]], **options)
        for i, result in zip(known, translated, strict=True):
            ids = [[self._ids[p] for p in hyp] for hyp in result.hypotheses]
            texts = tok.decode(ids)
            output[i] = list(zip(texts, map(float, result.scores), strict=True))
            lengths[i] = max(map(len, ids))
        return output, lengths


def _prefix_ids(
    tokenizer: Tokenizer,
    prefixes: Sequence[str] | str | None,
    count: int,
    tgt_lang: str | None = None,
) -> list[list[int]] | None:
    """Target ids of each prefix (without EOS, with a forced language token), as the
    Translator encodes them."""
    if prefixes is None:
        return None
    if not isinstance(prefixes, str):
        prefixes = check_sentences(prefixes, "prefixes")
    if isinstance(prefixes, str) or len(prefixes) != count:
        given = "a str" if isinstance(prefixes, str) else f"{len(prefixes)} entries"
        raise ValueError(f"prefixes holds {given} for {count} sentences; give one per sentence")
    texts = [text.strip() for text in prefixes]
    return tokenizer.encode(texts, side="target", tgt_lang=tgt_lang)


def _check_no_sampling(given: dict) -> None:
    """Refuses sampling asked for in ``given``, naming the setting that asked for it (a
    checkpoint's own ``model.sampling``, recorded in the folder, is not: translating the folder
    searches)."""
    asked = [name for name in (*DecodingConfig.SAMPLING_FIELDS, "sampling") if name in given]
    if asked and (asked != ["sampling"] or given["sampling"]):
        name = asked[0]
        raise ValueError(
            f"{name}: sampling is not offered through CTranslate2 (its draws come from one "
            "random generator per process, so they would depend on the batch); sample with "
            "the checkpoint itself"
        )


def _check_known(given: dict, known) -> None:
    """Raises ValueError naming the keys of ``given`` that are not ``known`` settings."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"unknown decoding settings: {unknown}")


def _check_form(form: str) -> None:
    if form != "fairseq":
        raise ValueError(
            f"length_penalty_form {form!r} has no CTranslate2 equivalent: CTranslate2 divides "
            "scores by len ** length_penalty (the 'fairseq' form) only"
        )
