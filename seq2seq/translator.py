"""Python API for translating with a trained checkpoint, without Lightning.

Example::

    from seq2seq.translator import Translator

    translator = Translator.from_checkpoint("checkpoints/multi30k_de_en/last.ckpt")
    translator.translate(["Ein Mann fährt Fahrrad."])  # -> ["A man is riding a bike."]
    translator.translate("Ein Mann fährt Fahrrad.")  # -> "A man is riding a bike."

A checkpoint holds the :class:`~seq2seq.nn.TransformerConfig` and the SentencePiece model
(:mod:`seq2seq.checkpoint.format`): :meth:`Translator.from_checkpoint` builds the
:class:`~seq2seq.nn.Transformer` from them and its weights, and decodes with
:func:`~seq2seq.nn.greedy_search` / :func:`~seq2seq.nn.beam_search` /
:func:`~seq2seq.nn.sample`; given several checkpoints, it decodes with their
:class:`~seq2seq.nn.Ensemble`. Importing this module
imports neither Lightning nor the data pipeline (``datasets``, ``pyarrow``); the tokenizer
is imported when a checkpoint is read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import torch

from seq2seq.checkpoint.format import (
    DECODING_DEFAULTS,
    DECODING_SETTINGS,
    SAMPLING_SETTINGS,
)
from seq2seq.checkpoint.models import check_ensemble_paths, load_model
from seq2seq.data.tokenizer import Tokenizer, source_ids
from seq2seq.nn import Ensemble, Transformer, beam_search, greedy_search, sample

__all__ = [
    "TranslationModel",
    "Translator",
    "check_decoding_settings",
    "decode_batch",
    "sampling_requested",
    "source_batch",
]


def check_decoding_settings(decoding: Mapping[str, Any]) -> None:
    """Raises ValueError naming the keys of ``decoding`` that are no
    :data:`DECODING_SETTINGS`."""
    unknown = sorted(set(decoding) - set(DECODING_SETTINGS))
    if unknown:
        raise ValueError(
            f"unknown decoding settings {unknown}; choose from {list(DECODING_SETTINGS)}"
        )


def check_decoding_values(settings: Mapping[str, Any], prefix: str = "") -> None:
    """Raises ValueError naming the setting (``{prefix}max_len_a must be >= 0, got -1.0``) for
    a ``beam_size`` or ``n_samples`` below 1, a negative ``max_len_a``, ``max_len_b``,
    ``min_len``, ``no_repeat_ngram_size`` or ``sampling_topk`` (a negative limit would
    silently cut every output short), a ``sampling_topp`` outside (0, 1], a ``temperature``
    that is not a finite number above 0, or a ``seed`` that is not an integer."""
    for name in ("beam_size", "n_samples"):
        if settings.get(name) is not None and settings[name] < 1:
            raise ValueError(f"{prefix}{name} must be >= 1, got {settings[name]}")
    for name in ("max_len_a", "max_len_b", "min_len", "no_repeat_ngram_size", "sampling_topk"):
        if name in settings and settings[name] < 0:
            raise ValueError(f"{prefix}{name} must be >= 0, got {settings[name]}")
    topp = settings.get("sampling_topp")
    if topp is not None and not 0.0 < topp <= 1.0:
        raise ValueError(f"{prefix}sampling_topp must lie in (0, 1] (1 = off), got {topp}")
    temperature = settings.get("temperature")
    if temperature is not None and not 0.0 < temperature < float("inf"):
        raise ValueError(f"{prefix}temperature must be a finite number > 0, got {temperature}")
    seed = settings.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"{prefix}sampling_seed must be an integer, got {seed!r}")


def sampling_requested(decoding: dict[str, Any]) -> dict[str, Any]:
    """``decoding`` with ``sampling=True`` added when it gives one of the
    :data:`~seq2seq.checkpoint.format.SAMPLING_SETTINGS` but not ``sampling`` itself (asking
    for a top-k or a temperature asks for sampling).

    Raises:
        ValueError: for ``sampling=False`` together with a sampling setting.
    """
    given = [name for name in SAMPLING_SETTINGS if name in decoding]
    if given and decoding.get("sampling") is False:
        raise ValueError(f"{given[0]} applies to sampling, but sampling=False was given")
    return {**decoding, "sampling": True} if given and "sampling" not in decoding else decoding


def source_batch(
    sources: Sequence[Sequence[int]], pad_id: int, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Right-padded source ids and their mask, as ``seq2seq.data.collate`` makes them.

    Args:
        sources: token ids of each sentence (ending with EOS).
        pad_id: padding id.
        device: where the tensors go.

    Returns:
        ``"src"`` ``(B, S)`` long and ``"src_mask"`` ``(B, 1, 1, S)`` bool (True at real
        tokens).
    """
    longest = max(len(ids) for ids in sources)
    src = torch.full((len(sources), longest), pad_id, dtype=torch.long)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    lengths = torch.tensor([len(ids) for ids in sources])
    mask = (torch.arange(longest)[None, :] < lengths[:, None])[:, None, None, :]
    return {"src": src.to(device), "src_mask": mask.to(device)}


def _nothing_known(tokenizer: Tokenizer, src: torch.Tensor) -> list[bool]:
    """Per row of ``(B, S)`` source ids: whether it holds no piece the model knows (only
    padding, EOS, unknown pieces and bare word boundaries: an empty or blank line, or one
    of characters outside the vocabulary such as U+2060)."""
    tok = tokenizer
    known = src.ne(tok.pad_id) & src.ne(tok.eos_id) & src.ne(tok.unk_id)
    known &= src.ne(tok.space_id)
    return (~known.any(dim=1)).tolist()


@torch.no_grad()
def decode_batch(
    model: Transformer,
    tokenizer: Tokenizer,
    batch: Mapping[str, Any],
    beam_size: int,
    n_best: int,
    settings: Mapping[str, Any],
) -> list[list[tuple[str, float]]]:
    """Decode a batch of sources into detokenized text (greedy for ``beam_size`` 1).

    Args:
        model: the Transformer, in the mode the caller chose (eval for translation).
        tokenizer: its SentencePiece model.
        batch: ``src`` ``(B, S)`` long and ``src_mask`` ``(B, 1, 1, S)`` bool.
        beam_size: beam size; 1 is greedy search.
        n_best: hypotheses per sentence (at most ``beam_size``).
        settings: every one of :data:`DECODING_SETTINGS`. With ``sampling`` true, the
            sentences are sampled (:func:`~seq2seq.nn.sample`, ``beam_size`` unused),
            ``n_samples`` per sentence; otherwise the sampling settings are unused.

    ``batch`` may hold ``"prefix"``: one list of target ids per sentence (possibly empty),
    forced at the start of its hypotheses (the text returned starts with it).

    Returns:
        For each sentence, ``n_best`` pairs of (text, score), best first, or with sampling
        ``n_samples`` pairs in sample order; a source with no piece the model knows gets as
        many pairs ``("", 0.0)``.

    Raises:
        ValueError: if the beam size is below 1, ``n_best`` exceeds it (with sampling: is
            neither 1 nor ``n_samples``), a setting is out of range or unknown, or a prefix
            is malformed.
    """
    check_decoding_values({"beam_size": beam_size, **settings})
    settings = dict(settings)
    sampling = settings.pop("sampling", False)
    drawn = {name: settings.pop(name) for name in SAMPLING_SETTINGS if name in settings}
    if "sampling_seed" in drawn:
        drawn["seed"] = drawn.pop("sampling_seed")
    n_samples = drawn.get("n_samples", 1)
    if sampling and n_best not in (1, n_samples):
        raise ValueError(
            f"n_best ({n_best}) applies to beam search; sampling returns n_samples "
            f"({n_samples}) hypotheses per sentence"
        )
    if not sampling and n_best > beam_size:
        raise ValueError(f"n_best ({n_best}) exceeds the beam size ({beam_size})")
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    src, src_mask = batch["src"], batch["src_mask"]
    settings["prefix"] = batch.get("prefix")
    if sampling:
        results = sample(model, src, src_mask, bos, eos, **drawn, **settings)
        n_best = n_samples
    elif beam_size == 1:
        results = greedy_search(model, src, src_mask, bos, eos, **settings)
    else:
        results = beam_search(
            model, src, src_mask, bos, eos, beam_size=beam_size, n_best=n_best, **settings
        )
    output = []
    for hyps, no_token in zip(results, _nothing_known(tokenizer, src), strict=True):
        if no_token:  # nothing to translate: an empty line, not an invented sentence
            output.append([("", 0.0)] * n_best)
            continue
        texts = tokenizer.decode([h.tokens for h in hyps[:n_best]])
        output.append([(text, float(h.score)) for text, h in zip(texts, hyps, strict=False)])
    return output


class _Settings(dict):
    """A dict whose keys read as attributes too (``settings.beam_size``), as Lightning's
    ``hparams``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class TranslationModel:
    """A :class:`~seq2seq.nn.Transformer` with its tokenizer and decoding settings: what
    translating needs, without the training module.

    It offers the parts of ``TranslationModule`` that decoding code reads (``model``,
    ``tokenizer``, ``hparams``, ``model_config``, ``device``, :meth:`translate_batch`).

    Args:
        model: the Transformer.
        tokenizer: its SentencePiece model.
        settings: ``beam_size`` and the :data:`DECODING_SETTINGS` (missing ones take
            :data:`DECODING_DEFAULTS`).

    Raises:
        ValueError: for an unknown setting or an out-of-range value.
    """

    def __init__(
        self, model: Transformer, tokenizer: Tokenizer, settings: Mapping[str, Any] | None = None
    ) -> None:
        settings = dict(settings or {})
        unknown = sorted(set(settings) - set(DECODING_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown decoding settings: {unknown}")
        check_decoding_values(settings, prefix="model.")
        self.model = model
        self.tokenizer = tokenizer
        self.hparams = _Settings({**DECODING_DEFAULTS, **settings})

    @property
    def model_config(self) -> dict[str, Any]:
        """The architecture, :meth:`TransformerConfig.to_dict` of the model's config."""
        return self.model.config.to_dict()

    @property
    def device(self) -> torch.device:
        """Where the weights are."""
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> TranslationModel:
        self.model.to(device)
        return self

    def eval(self) -> TranslationModel:
        self.model.eval()
        return self

    def translate_batch(
        self, batch: Mapping[str, Any], beam_size: int | None = None, n_best: int = 1, **decoding
    ) -> list[list[tuple[str, float]]]:
        """:func:`decode_batch` with these settings, overridden by this call's ``beam_size``
        and ``decoding`` (:data:`DECODING_SETTINGS`).

        Raises:
            ValueError: as :func:`decode_batch`, and for an unknown decoding setting.
        """
        check_decoding_settings(decoding)
        settings = {name: self.hparams[name] for name in DECODING_SETTINGS} | decoding
        beam = self.hparams.beam_size if beam_size is None else beam_size
        return decode_batch(self.model, self.tokenizer, batch, beam, n_best, settings)


class Translator:
    """Batched translation with a Transformer and its tokenizer.

    Sentences are encoded with the SentencePiece model, sorted by length, cut into batches of
    at most ``max_tokens`` padded source tokens, decoded, and returned in input order. Sources
    longer than the model's ``max_positions`` are truncated (with a ``UserWarning``); a
    sentence with no token the model knows (empty, only spaces, or only characters outside
    the vocabulary) is translated as an empty string, scored 0.0 (``n_best`` such pairs in an
    n-best list).

    Args:
        module: a :class:`TranslationModel` (what :meth:`from_checkpoint` builds), or any
            object with ``model``, ``tokenizer`` and ``hparams`` such as a
            ``TranslationModule`` with its tokenizer attached.
        device: where to run (``"cpu"``, ``"cuda"``, ...).
        max_tokens: padded source tokens per batch.

    Attributes:
        module: the :class:`TranslationModel` translating.
        model: its Transformer (an :class:`~seq2seq.nn.Ensemble` of several checkpoints'
            Transformers).
        tokenizer: its SentencePiece model.
    """

    def __init__(self, module: Any, device: str | torch.device = "cpu", max_tokens: int = 4096):
        if module.tokenizer is None:
            raise ValueError("the module has no tokenizer attached; load it from a checkpoint")
        if not isinstance(module, TranslationModel):
            names = ("beam_size", *DECODING_SETTINGS)
            settings = {k: module.hparams[k] for k in names if k in module.hparams}
            module = TranslationModel(module.model, module.tokenizer, settings)
        self.module = module.to(device).eval()
        self.model = self.module.model
        self.tokenizer = self.module.tokenizer
        self.device = torch.device(device)
        self.max_tokens = max_tokens

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | Sequence[str | Path],
        device: str | torch.device | None = None,
        max_tokens: int = 4096,
        **decoding: Any,
    ) -> Translator:
        """Build a translator from a checkpoint alone (no data files, no Lightning), or from
        several checkpoints decoding as an ensemble.

        The :class:`~seq2seq.nn.Transformer` is built from the checkpoint's model
        configuration and loaded with its weights; the decoding settings are the
        checkpoint's hyperparameters, overridden by ``decoding``.

        With several checkpoints, each model is built from its own checkpoint and they decode
        as one :class:`~seq2seq.nn.Ensemble` (the mean of their per-step log-probabilities, as
        ``fairseq-generate --path a.pt:b.pt`` and OpenNMT-py's ensemble decoder). They may
        differ in architecture, but must carry the same SentencePiece model (byte for byte)
        and, where they record one, the same language pair. The decoding settings
        (``beam_size``, ``length_penalty``, ...) are the first checkpoint's, overridden by
        ``decoding``.

        Args:
            path: a checkpoint written by ``seq2seq fit`` or ``seq2seq average``, or a folder
                of ``seq2seq export --format ctranslate2`` (then a
                :class:`~seq2seq.export.ctranslate2.CTranslate2Translator` is returned); or a
                list of checkpoint files for an ensemble (a one-file list is that checkpoint
                alone).
            device: ``None`` picks CUDA when available, else CPU.
            max_tokens: padded source tokens per batch.
            **decoding: overrides of decoding settings (``beam_size``, ``length_penalty``,
                ``length_penalty_form``, ``max_len_a``, ``max_len_b``, ``min_len``,
                ``no_repeat_ngram_size``, ``sampling`` and the sampling settings of
                :meth:`translate`, a sampling setting turning sampling on). The
                architecture (``d_model``, ``vocab_size``, ...) is the checkpoint's; one given
                here must equal it (that of every checkpoint of an ensemble).

        Raises:
            FileNotFoundError: if a file does not exist.
            seq2seq.checkpoint.UnsafeCheckpointError: if it holds arbitrary pickled objects.
            seq2seq.checkpoint.CheckpointError: if it is not a checkpoint, or holds no model
                weights.
            seq2seq.checkpoint.IncompatibleCheckpointsError: (a ``CheckpointError``) naming
                both files, if a checkpoint of an ensemble carries another SentencePiece model
                (or none) or translates another language pair than the first.
            ValueError: if it carries no tokenizer or model configuration; for an unknown
                setting in ``decoding``, an architecture setting other than the checkpoint's
                (``d_model: checkpoint 256 vs requested 64 (d_model=64 given to
                from_checkpoint)``), or an out-of-range decoding setting (e.g.
                ``model.max_len_a must be >= 0, got -1.0``); for an empty list, a file named
                twice, or a folder (an exported CTranslate2 model, which decodes alone) in an
                ensemble.
        """
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        if not paths:
            raise ValueError("from_checkpoint needs a checkpoint (or a list of them)")
        if len(paths) == 1 and Path(paths[0]).is_dir():  # seq2seq export --format ctranslate2
            from seq2seq.export.ctranslate2 import CTranslate2Translator

            return CTranslate2Translator(paths[0], device, max_tokens, **decoding)
        if len(paths) > 1:
            check_ensemble_paths(paths)
        decoding = {k: v for k, v in decoding.items() if k not in DECODING_DEFAULTS} | (
            sampling_requested({k: v for k, v in decoding.items() if k in DECODING_DEFAULTS})
        )
        models, tokenizer, settings = [], None, {}
        reference: tuple[str | Path, dict[str, Any]] | None = None
        for file in paths:
            model, model_tokenizer, model_settings, identity = load_model(file, decoding, reference)
            models.append(model)
            if reference is None:  # the first checkpoint's tokenizer and decoding settings
                reference, tokenizer, settings = (file, identity), model_tokenizer, model_settings
        model = models[0] if len(models) == 1 else Ensemble(models)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(TranslationModel(model, tokenizer, settings), device, max_tokens)

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

    def _encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """:meth:`encode`; its warning points at the code that called :meth:`encode` or
        :meth:`translate`."""
        ids = source_ids(self.tokenizer, sentences, self.model.max_positions, stacklevel=4)
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
        **decoding: Any,
    ) -> str | list[tuple[str, float]] | list[str] | list[list[tuple[str, float]]]:
        """Translate one sentence, or a list of sentences keeping their order.

        Args:
            sentences: one source sentence (a ``str``), or a list (any sequence) of them, one
                per entry; newlines inside a sentence are not allowed.
            beam_size: ``None`` uses the checkpoint's ``beam_size``; 1 is greedy search.
            n_best: with 1, return one string per sentence; with more, a list of
                ``(text, score)`` pairs per sentence, best first (the score is the
                length-penalised log-probability; a sentence with no token the model knows
                gets ``n_best`` pairs ``("", 0.0)``).
            return_scores: with ``n_best`` 1, return a one-pair list ``[(text, score)]`` per
                sentence instead of the string.
            prefixes: target-side text forced at the start of each translation, one per
                sentence (``""`` for none; a str for a single sentence). They are encoded with
                the SentencePiece model without EOS, so a prefix ending mid-word is tokenised
                as a word of its own ("Ein Ma" becomes the pieces of "Ein" and "Ma"); the
                translation starts with the prefix's text and continues after it, and its
                score includes the prefix tokens' log-probabilities.
            **decoding: this call's ``length_penalty``, ``length_penalty_form``,
                ``max_len_a``, ``max_len_b``, ``min_len``, ``no_repeat_ngram_size`` (ban
                repeated n-grams of this size, 0 = off) or sampling settings (default: the
                checkpoint's, or those given to :meth:`from_checkpoint`), as ``generate``
                keyword arguments of a Hugging Face pipeline. ``sampling=True`` samples
                instead of searching (:func:`~seq2seq.nn.sample`): ``sampling_topk`` (0 =
                off), ``sampling_topp`` (in (0, 1], 1 = off), ``temperature`` (> 0),
                ``n_samples`` per sentence and ``seed`` (``sampling_seed``, an integer: the
                same seed gives the same samples; a sentence's samples depend only on it and
                on the sentence, not on the rest of the list). Giving any of these asks for
                sampling. With ``n_samples`` above 1 each sentence gets a list of ``n_samples``
                ``(text, score)`` pairs, in sample order, the score the model's own
                length-penalised log-probability (temperature 1, no cut).

        Returns:
            For a list, one translation (or n-best list) per input sentence, in input order:
            ``list[str]``, or ``list[list[tuple[str, float]]]`` with ``n_best`` > 1 or
            ``return_scores``. For a single ``str``, that one sentence's result alone: a
            ``str``, or its ``list[tuple[str, float]]`` (as Hugging Face pipelines return one
            result for one input).

        Raises:
            TypeError: if ``sentences`` is bytes (decode it first), or one of its entries is
                not a string (naming its 0-based index).
            ValueError: if an entry holds a line break (``\\n``), naming its 0-based index
                (``sentences[0] holds a line break ...``; for a single string, ``the sentence
                holds a line break ...``), if ``n_best`` exceeds the beam size, for an
                unknown or out-of-range decoding setting (naming it and its value), for
                sampling together with a ``beam_size`` above 1 or an ``n_best`` above 1, or
                for ``prefixes`` of another length than ``sentences``.
        """
        if "seed" in decoding:  # the seed of sampling, sampling_seed in the settings
            decoding["sampling_seed"] = decoding.pop("seed")
        check_decoding_settings(decoding)  # also when there is nothing to translate
        decoding = sampling_requested(decoding)
        check_decoding_values(decoding)
        sampling = decoding.get("sampling", self.module.hparams.get("sampling", False))
        if sampling and beam_size is not None and beam_size > 1:
            raise ValueError(
                f"beam_size={beam_size} with sampling: sampling draws, it does not search; "
                "leave beam_size out (or give 1)"
            )
        if sampling and n_best > 1:
            raise ValueError(
                f"n_best={n_best} with sampling: give n_samples={n_best} for that many "
                "samples per sentence"
            )
        n_out = decoding.get("n_samples", self.module.hparams.get("n_samples", 1))
        n_out = n_out if sampling else n_best
        single = isinstance(sentences, str)
        if single:
            if "\n" in sentences:
                raise ValueError(
                    "the sentence holds a line break (\\n): translate one sentence per call, "
                    "or several as a list, e.g. translate(text.splitlines())"
                )
            sentences = [sentences]
            if isinstance(prefixes, str):
                prefixes = [prefixes]
        forced = self._encode_prefixes(prefixes, len(sentences))
        encoded = self._encode(sentences)
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
            if forced is not None:
                batch["prefix"] = [forced[i] for i in chunk]
            hyps = self.module.translate_batch(
                batch, beam_size=beam_size, n_best=n_best, **decoding
            )
            for i, h in zip(chunk, hyps, strict=True):
                results[i] = h[0][0] if n_out == 1 and not return_scores else h
            start = end
        return results[0] if single else results

    def _encode_prefixes(
        self, prefixes: Sequence[str] | str | None, count: int
    ) -> list[list[int]] | None:
        """Target ids of each prefix, without EOS (``None`` when no prefix is given).

        Raises:
            TypeError: for a str given with a list of sentences, or an entry that is no str.
            ValueError: for another number of prefixes than sentences, or a line break.
        """
        if prefixes is None:
            return None
        if isinstance(prefixes, str):
            raise TypeError("prefixes must be a list of str (one per sentence) for a list")
        prefixes = list(prefixes)
        if len(prefixes) != count:
            raise ValueError(
                f"prefixes holds {len(prefixes)} entries for {count} sentences; give one "
                "per sentence ('' for none)"
            )
        for i, text in enumerate(prefixes):
            if not isinstance(text, str):
                raise TypeError(f"prefixes[{i}] is {type(text).__name__}, not a string")
            if "\n" in text:
                raise ValueError(f"prefixes[{i}] holds a line break (\\n)")
        ids = self.tokenizer.encode([text.strip() for text in prefixes])
        limit = self.model.max_positions - 1
        too_long = [i for i, row in enumerate(ids) if len(row) > limit]
        if too_long:
            raise ValueError(
                f"prefixes[{too_long[0]}] has {len(ids[too_long[0]])} tokens; at most "
                f"max_positions - 1 = {limit} fit"
            )
        return ids
