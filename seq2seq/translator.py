"""Python API for translating with a trained checkpoint, without Lightning.

Example::

    from seq2seq.translator import Translator

    translator = Translator.from_checkpoint("checkpoints/multi30k_de_en/last.ckpt")
    translator.translate(["Ein Mann fährt Fahrrad."])  # -> ["A man is riding a bike."]
    translator.translate("Ein Mann fährt Fahrrad.")  # -> "A man is riding a bike."

A checkpoint holds the :class:`~seq2seq.nn.TransformerConfig`, the SentencePiece model
(:mod:`seq2seq.checkpoint.format`) and the :class:`~seq2seq.nn.DecodingConfig`:
:meth:`Translator.from_checkpoint` builds a
:class:`~seq2seq.checkpoint.models.CheckpointModel` from them and its weights, and decodes
through :func:`seq2seq.text_decoding.decode_batch`; given several checkpoints, it decodes with
their :class:`~seq2seq.nn.Ensemble`. Importing this module
imports neither Lightning nor the data pipeline (``datasets``, ``pyarrow``); the tokenizer
is imported when a checkpoint is read.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, overload

import torch

from seq2seq.checkpoint.models import (
    CheckpointModel,
    check_ensemble_paths,
    check_ensemble_weights,
    load_model,
)
from seq2seq.data.tokenizer import check_sentences, source_ids
from seq2seq.machine import emulated_bfloat16
from seq2seq.nn import DecodingConfig, Ensemble, fast
from seq2seq.text_decoding import (
    apply_overrides,
    decode_batch,
    requested_languages,
    sampling_rules,
    source_batch,
)
from seq2seq.text_scoring import (
    TranslationScore,
    check_pairs,
    forced_batch,
    pair_batches,
    target_ids,
    token_log_probs,
    translation_score,
)

__all__ = ["Translator", "decoding_dtype"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DTYPE_NAMES = DTYPES | {"fp32": torch.float32, "bf16": torch.bfloat16}
"""The names :func:`decoding_dtype` takes."""


def decoding_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``torch.float32`` or ``torch.bfloat16`` from their names (``"bf16"``, ``"fp32"`` too) or
    themselves.

    Raises:
        ValueError: for any other type, naming the choices.
    """
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    raise ValueError(f"dtype {dtype}: decoding runs in float32 or bfloat16")


class Translator:
    """Batched translation with a Transformer and its tokenizer.

    Sentences are encoded with the SentencePiece model, sorted by length, cut into batches of
    at most ``max_tokens`` padded source tokens, decoded, and returned in input order. Sources
    longer than the model's ``max_positions`` are truncated (with a ``UserWarning``); a
    sentence with no token the model knows (empty, only spaces, or only characters outside
    the vocabulary) is translated as an empty string, scored 0.0 (``n_best`` such pairs in an
    n-best list). On CPU it has glibc keep freed memory for reuse for the rest of the process
    (the ``heap`` trick, :func:`seq2seq.nn.fast.keep_freed_heap`; ``SEQ2SEQ_FAST=0`` leaves
    glibc's defaults).

    Args:
        module: a :class:`~seq2seq.checkpoint.models.CheckpointModel` (what
            :meth:`from_checkpoint` builds), or any object with ``model``, ``tokenizer`` and
            ``decoding`` such as a ``TranslationModule`` with its tokenizer attached.
        device: where to run (``"cpu"``, ``"cuda"``, ...).
        max_tokens: padded source tokens per batch.
        dtype: ``"float32"`` (default) or ``"bfloat16"``: decode under
            ``torch.autocast(dtype=torch.bfloat16)`` with the float32 weights, as
            ``--trainer.precision bf16-mixed`` trains (fast on GPUs and on CPUs with
            AVX512-BF16 or AMX; BLEU within 0.1 of float32 on test_2016_flickr, greedy and beam 5:
            ``benchmarks/README.md``, ``cpu_bf16.py``).

    Raises:
        ValueError: for another ``dtype``, or a ``module`` without a tokenizer.

    Attributes:
        module: the :class:`~seq2seq.checkpoint.models.CheckpointModel` translating.
        model: its Transformer (an :class:`~seq2seq.nn.Ensemble` of several checkpoints'
            Transformers).
        tokenizer: its SentencePiece model.
        dtype: ``torch.float32`` or ``torch.bfloat16``, the type decoding computes in.
        pairs: the ``(src, tgt)`` language pairs the checkpoint was trained on (``None``: not
            known), which :meth:`translate` warns outside of.
    """

    def __init__(
        self,
        module: Any,
        device: str | torch.device = "cpu",
        max_tokens: int = 4096,
        dtype: str | torch.dtype = "float32",
    ):
        self.dtype = decoding_dtype(dtype)
        if module.tokenizer is None:
            raise ValueError("the module has no tokenizer attached; load it from a checkpoint")
        if not isinstance(module, CheckpointModel):
            module = CheckpointModel(module.model, module.tokenizer, module.decoding)
        self.module = module.to(device).eval()
        self.model = self.module.model
        self.tokenizer = self.module.tokenizer
        self.device = torch.device(device)
        if self.device.type == "cpu":  # decoding's allocations stay in the process (fast.py)
            fast.keep_freed_heap()
            if self.dtype == torch.bfloat16:
                message = emulated_bfloat16("dtype 'bfloat16'", "dtype 'float32'")
                if message:
                    warnings.warn(message, stacklevel=2)
        self.max_tokens = max_tokens
        self.pairs: tuple[tuple[str, str], ...] | None = getattr(self.module, "pairs", None)

    @property
    def decoding(self) -> DecodingConfig:
        """The decoding settings used where a call gives none (the checkpoint's)."""
        return self.module.decoding

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | Sequence[str | Path],
        device: str | torch.device | None = None,
        max_tokens: int = 4096,
        dtype: str | torch.dtype = "float32",
        **decoding: Any,
    ) -> Translator:
        """A translator of a checkpoint alone (no data files, no Lightning), or of several
        decoding as an :class:`~seq2seq.nn.Ensemble` (the mean of their per-step
        log-probabilities, as ``fairseq-generate --path a.pt:b.pt``).

        Args:
            path: a checkpoint of ``seq2seq fit`` or ``average``; a ``seq2seq export --format
                ctranslate2`` folder (a :class:`~seq2seq.export.ctranslate2.CTranslate2Translator`
                is returned); or a list of checkpoint files, which may differ in architecture
                but must carry the same SentencePiece model (byte for byte) and language pair.
            device: ``None`` picks CUDA when available, else CPU.
            max_tokens: padded source tokens per batch.
            dtype: ``"float32"`` or ``"bfloat16"``, as for :class:`Translator`; a
                CTranslate2 folder takes its compute type from ``export --quantization``.
            **decoding: :class:`~seq2seq.nn.DecodingConfig` fields overriding the (first)
                checkpoint's, under :func:`~seq2seq.text_decoding.sampling_rules`; an
                architecture field given here must equal the checkpoint's.

        Raises:
            FileNotFoundError, seq2seq.checkpoint.CheckpointError (its ``UnsafeCheckpointError``,
            ``IncompatibleCheckpointsError`` naming both files of an ensemble): as their names
            say. ValueError: naming the setting, for one that is unknown, out of range or
            another architecture than the checkpoint's; naming the file, for one without
            tokenizer or model configuration, a file named twice or a folder in an ensemble
            (two files of the same weights: ``IncompatibleCheckpointsError``).
        """
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        if not paths:
            raise ValueError("from_checkpoint needs a checkpoint (or a list of them)")
        if len(paths) == 1 and Path(paths[0]).is_dir():  # seq2seq export --format ctranslate2
            from seq2seq.export.ctranslate2 import CTranslate2Translator

            if decoding_dtype(dtype) != torch.float32:
                raise ValueError(
                    f"dtype {dtype}: a CTranslate2 folder ({paths[0]}) computes in the type it "
                    "was exported with (seq2seq export --quantization)"
                )
            return CTranslate2Translator(paths[0], device, max_tokens, **decoding)
        if len(paths) > 1:
            check_ensemble_paths(paths)
        fields = set(DecodingConfig.field_names())
        given = sampling_rules({k: v for k, v in decoding.items() if k in fields})
        decoding = {k: v for k, v in decoding.items() if k not in fields} | given
        loaded: list[CheckpointModel] = []
        reference: tuple[str | Path, dict[str, Any]] | None = None
        for file in paths:
            model, identity = load_model(file, decoding, reference)
            loaded.append(model)
            reference = reference or (file, identity)  # the first checkpoint's
        first = loaded[0]
        sampling_rules(given, sampling=first.decoding.sampling)  # a beam for one that samples
        if len(loaded) > 1:  # the first checkpoint's tokenizer and decoding settings
            check_ensemble_weights(paths, loaded)
            first = CheckpointModel(
                Ensemble([m.model for m in loaded]), first.tokenizer, first.decoding, first.pairs
            )
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(first, device, max_tokens, dtype)

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Source token ids ending with EOS, truncated to ``max_positions``.

        Truncated sentences are reported together in one ``UserWarning`` naming how many, their
        lines (1-based, the first ten) and the longest (``seq2seq translate`` prints it as a
        ``seq2seq: warning: ...`` line).

        Args:
            sentences: source sentences, one per entry.

        Returns:
            One list of token ids per sentence, in input order.

        Raises:
            TypeError: if ``sentences`` is a single string (pass ``[text]``; unlike
                :meth:`translate`, ``encode`` takes lists only) or bytes, or one of its
                entries is not a string (naming its 0-based index).
            ValueError: if an entry holds a line break (``\\n``), naming its 0-based index.
        """
        return self._encode(sentences)

    def _encode(
        self,
        sentences: Sequence[str],
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        first_line: int = 1,
    ) -> list[list[int]]:
        """:meth:`encode`; its warning points at the code that called :meth:`encode` or
        :meth:`translate`. ``tgt_lang``: the target language a source tag selects;
        ``src_lang``: the source language (NLLB's source code)."""
        limit = self.model.max_positions
        languages = {"tgt_lang": tgt_lang, "src_lang": src_lang, "first_line": first_line}
        ids = source_ids(self.tokenizer, sentences, limit, stacklevel=4, **languages)
        return [row + [self.tokenizer.eos_id] for row in ids]

    @overload
    def translate(
        self,
        sentences: str,
        beam_size: int | None = None,
        n_best: int = 1,
        return_scores: bool = False,
        **decoding: Any,
    ) -> str | list[tuple[str, float]]: ...

    @overload
    def translate(
        self,
        sentences: Sequence[str],
        beam_size: int | None = None,
        n_best: int = 1,
        return_scores: bool = False,
        **decoding: Any,
    ) -> list[str] | list[list[tuple[str, float]]]: ...

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
    ) -> str | list[tuple[str, float]] | list[str] | list[list[tuple[str, float]]]:
        """Translate one sentence, or a list of sentences keeping their order.

        Args:
            sentences: one source sentence (a ``str``, no newline), or an iterable of them.
            beam_size: ``None`` uses the checkpoint's; 1 is greedy search.
            n_best: above 1 (or with ``return_scores``), ``(text, score)`` pairs per sentence,
                best first; the score is the length-penalised log-probability.
            prefixes: target text forced first, one per sentence (``""``: none), without EOS;
                the translation starts with it and its score includes it.
            tgt_lang: the target language as the model's tokens name it (``"fr"`` for our
                ``>>fr<<``, NLLB ``"fra_Latn"``); needed where there are several.
            src_lang: the source language (NLLB's code); outside :attr:`pairs`: a warning.
            first_line: the first sentence's number in the warning on sentences cut.
            **decoding: this call's :class:`~seq2seq.nn.DecodingConfig` fields (``seed`` for
                ``sampling_seed``), under :func:`~seq2seq.text_decoding.sampling_rules`; with
                sampling, ``n_samples`` pairs per sentence above 1, in sample order.

        Returns:
            Per sentence in input order (``list[str]``, or lists of pairs); a str's alone.

        Raises:
            TypeError: for bytes, no iterable, or an entry that is no string (its index).
            ValueError: naming the entry or the setting: a line break; a setting unknown, out
                of range or against the sampling rules; ``n_best`` above the beam size;
                ``prefixes`` not one per sentence; a missing or unknown ``tgt_lang``."""
        tgt_lang, src_lang, (_, tgt_prefix) = requested_languages(
            self.tokenizer, self.pairs, tgt_lang, src_lang
        )  # before any work
        if "seed" in decoding:  # the seed of sampling, sampling_seed in the settings
            decoding["sampling_seed"] = decoding.pop("seed")
        if beam_size is not None:
            decoding["beam_size"] = beam_size
        overrides = sampling_rules(decoding, n_best, self.decoding.sampling)
        config = apply_overrides(self.decoding, overrides)  # also with nothing to translate
        n_out = config.n_samples if config.sampling else n_best
        single = isinstance(sentences, str)
        if not single and not isinstance(sentences, Sequence):
            if not isinstance(sentences, Iterable):
                raise TypeError(
                    f"sentences must be a str or a list of str, not {type(sentences).__name__}"
                )
            sentences = list(sentences)  # a generator, ...
        if single:
            if "\n" in sentences:
                raise ValueError(
                    "the sentence holds a line break (\\n): translate one sentence per call, "
                    "or several as a list, e.g. translate(text.splitlines())"
                )
            sentences = [sentences]
            if isinstance(prefixes, str):
                prefixes = [prefixes]
        forced = self._encode_prefixes(prefixes, len(sentences), tgt_lang)
        encoded = self._encode(sentences, tgt_lang, src_lang, first_line)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        results: list[Any] = [None] * len(encoded)
        start = 0
        while start < len(order):
            end = start + 1
            while (
                end < len(order) and (end - start + 1) * len(encoded[order[end]]) <= self.max_tokens
            ):
                end += 1
            chunk = order[start:end]
            batch = source_batch([encoded[i] for i in chunk], self.tokenizer.pad_id, self.device)
            if forced is not None:  # (else decode_batch forces the language token alone)
                batch["prefix"] = [forced[i] for i in chunk]
                batch["unscored_prefix"] = len(tgt_prefix)  # the language token
            with self._autocast():
                hyps = decode_batch(
                    self.model, self.tokenizer, batch, config, n_best,
                    tgt_lang=tgt_lang, scores=return_scores,
                )  # fmt: skip
            for i, h in zip(chunk, hyps, strict=True):
                results[i] = h[0][0] if n_out == 1 and not return_scores else h
            start = end
        return results[0] if single else results

    def score(
        self,
        sources: str | Sequence[str],
        targets: str | Sequence[str],
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        first_line: int = 1,
    ) -> TranslationScore | list[TranslationScore]:
        """The model's log-probability of each given translation, teacher-forced
        (:mod:`seq2seq.text_scoring` says what is scored and what is not).

        Args:
            sources: source sentences (a list of str), or one sentence (a str).
            targets: one translation per source (``""``: its end alone is scored); a str
                with a str ``sources``.
            tgt_lang, src_lang: as for :meth:`translate`.
            first_line: the first pair's number in the warnings that name lines.

        Returns:
            One :class:`~seq2seq.text_scoring.TranslationScore` per pair, in input order (for
            one sentence and its translation given as two str, that pair's alone). A
            source above ``max_positions`` is cut with a warning, as :meth:`translate` cuts
            it; a target too long scores ``nan`` (:func:`~seq2seq.text_scoring.target_ids`).

        Raises:
            TypeError: for a str with a list, no list, or an entry that is no str (naming it).
            ValueError: for lists of different lengths, a line break, or a missing or unknown
                ``tgt_lang``.
        """
        if isinstance(sources, str) and isinstance(targets, str):  # one pair: its score alone
            return self.score([sources], [targets], tgt_lang, src_lang, first_line)[0]
        tgt_lang, src_lang, (_, tgt_prefix) = requested_languages(
            self.tokenizer, self.pairs, tgt_lang, src_lang
        )  # before any work
        sources, targets = check_pairs(sources, targets)
        encoded = self._encode(sources, tgt_lang, src_lang, first_line)
        tok = self.tokenizer
        tgt_ids, kept = target_ids(tok, targets, tgt_lang, self.model.max_positions, first_line)
        results = [TranslationScore(math.nan, (), ()) for _ in sources]
        batches = pair_batches(
            [len(encoded[i]) for i in kept],
            [len(tgt_ids[i]) + 1 for i in kept],
            self.max_tokens,
            self.model.vocab_size,
        )
        for rows in batches:
            chunk = [kept[j] for j in rows]
            pairs = [encoded[i] for i in chunk], [tgt_ids[i] for i in chunk]
            batch = forced_batch(*pairs, tok, self.device)
            with self._autocast():
                scores = token_log_probs(self.model, batch)
            for i, token_scores in zip(chunk, scores, strict=True):
                results[i] = translation_score(tok, tgt_ids[i], token_scores, len(tgt_prefix))
        return results

    def _autocast(self) -> torch.autocast:
        """bfloat16 autocast over the float32 weights with ``dtype="bfloat16"``, else off."""
        bf16 = self.dtype == torch.bfloat16
        return torch.autocast(self.device.type, torch.bfloat16, enabled=bf16)

    def _encode_prefixes(
        self, prefixes: Sequence[str] | str | None, count: int, tgt_lang: str | None = None
    ) -> list[list[int]] | None:
        """Target ids of each prefix, without EOS but with the target-language token where the
        model forces one (``None`` when no prefix is given).

        Raises:
            TypeError: for a str given with a list of sentences, or an entry that is no str.
            ValueError: for another number of prefixes than sentences, or a line break.
        """
        if prefixes is None:
            return None
        if isinstance(prefixes, str):
            raise TypeError("prefixes must be a list of str (one per sentence) for a list")
        prefixes = check_sentences(prefixes, "prefixes")
        if len(prefixes) != count:
            raise ValueError(
                f"prefixes holds {len(prefixes)} entries for {count} sentences; give one "
                "per sentence ('' for none)"
            )
        texts = [text.strip() for text in prefixes]
        ids = self.tokenizer.encode(texts, side="target", tgt_lang=tgt_lang)
        limit = self.model.max_positions - 1
        too_long = [i for i, row in enumerate(ids) if len(row) > limit]
        if too_long:
            raise ValueError(
                f"prefixes[{too_long[0]}] has {len(ids[too_long[0]])} tokens; at most "
                f"max_positions - 1 = {limit} fit"
            )
        return ids
