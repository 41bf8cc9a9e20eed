"""From a Transformer, its tokenizer and a :class:`~seq2seq.nn.DecodingConfig` to text.

The one place that turns a batch of source ids into detokenized hypotheses
(:func:`decode_batch`), shared by ``TranslationModule`` (validation, test, predict) and the
:class:`~seq2seq.translator.Translator`, with the rules that a caller's decoding overrides
obey (:func:`apply_overrides`). No Lightning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from seq2seq.checkpoint.format import pair_names
from seq2seq.data.language_tags import is_language_code, same_language
from seq2seq.nn import DecodingConfig, Transformer, beam_search, greedy_search, sample
from seq2seq.spelling import did_you_mean

if TYPE_CHECKING:
    from seq2seq.data.tokenizer import Tokenizer

__all__ = [
    "apply_overrides",
    "as_config",
    "decode_batch",
    "default_target_prefix",
    "keyword",
    "language_prefixes",
    "sampling_rules",
    "source_batch",
    "untagged_target",
    "zero_shot_warning",
]


def keyword(name: str, value: Any = None) -> str:
    """A setting as the Python API spells it: ``beam_size`` or ``beam_size=3``."""
    return name if value is None else f"{name}={value!r}"


def sampling_rules(
    overrides: Mapping[str, Any],
    n_best: int = 1,
    sampling: bool = False,
    spell: Callable[..., str] = keyword,
) -> dict[str, Any]:
    """The sampling rules, stated here once: giving one of
    :attr:`DecodingConfig.SAMPLING_FIELDS` asks for sampling, and sampling refuses an
    explicit ``beam_size`` above 1 and an ``n_best`` above 1 (it draws ``n_samples``).

    Args:
        overrides: decoding fields given by the caller.
        n_best: hypotheses per sentence asked for.
        sampling: whether the settings overridden sample already (a checkpoint's own).
        spell: how the message names a setting and its value (``--beam_size 3`` for the
            command line); the API's keywords by default.

    Returns:
        ``overrides``, with ``sampling=True`` where a sampling field asks for it.

    Raises:
        ValueError: naming the settings, for ``sampling`` false with a sampling field, or
            for sampling with a beam size or ``n_best`` above 1.
    """
    given = [name for name in DecodingConfig.SAMPLING_FIELDS if name in overrides]
    if given and overrides.get("sampling") is False:
        raise ValueError(
            f"{spell(given[0])} applies to sampling, but {spell('sampling', False)} was given"
        )
    if given and "sampling" not in overrides:
        overrides = {**overrides, "sampling": True}
    if not overrides.get("sampling", sampling):
        return dict(overrides)
    beam = overrides.get("beam_size")
    asked = spell(given[0] if given else "sampling")
    if beam is not None and beam > 1:
        searching = "" if given or "sampling" in overrides else f", or {spell('sampling', False)}"
        raise ValueError(
            f"{spell('beam_size', beam)} with {asked}: sampling draws, it does not search; "
            f"leave {spell('beam_size')} out (or give 1){searching}"
        )
    if n_best > 1:
        raise ValueError(
            f"{spell('n_best', n_best)} with sampling: give {spell('n_samples', n_best)} for "
            "that many samples per sentence"
        )
    return dict(overrides)


def apply_overrides(
    config: DecodingConfig, overrides: Mapping[str, Any], spell: Callable[..., str] = keyword
) -> DecodingConfig:
    """``config`` with some fields replaced; ``None`` values leave a field as it is.

    Raises:
        ValueError: for a name that is no field, or a value out of range (DecodingConfig's
            message, the setting named by ``spell``: ``--max_len_a must be >= 0, got -1.0``).
    """
    fields = list(DecodingConfig.field_names())
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        hints = "".join(did_you_mean(name, fields) for name in unknown)
        raise ValueError(f"unknown decoding settings: {unknown}{hints}; choose from {fields}")
    changes = {name: value for name, value in overrides.items() if value is not None}
    try:
        return config.replace(**changes)
    except ValueError as err:
        name, _, rest = str(err).partition(" ")
        raise ValueError(f"{spell(name)} {rest}" if name in changes else str(err)) from None


def as_config(
    decoding: DecodingConfig | Mapping[str, Any] | None, spell: Callable[..., str] = keyword
) -> DecodingConfig:
    """``decoding`` itself, the config of a mapping of its fields (a checkpoint's plain
    dictionary), or the defaults for ``None``.

    Raises:
        ValueError: as :func:`apply_overrides`.
    """
    if isinstance(decoding, DecodingConfig):
        return decoding
    return apply_overrides(DecodingConfig(), decoding or {}, spell)


def language_prefixes(
    tokenizer: Tokenizer, tgt_lang: str | None = None, src_lang: str | None = None
) -> tuple[list[int], list[int]]:
    """The ids that select the target language: ``(source prefix, target prefix)``, as the
    tokenizer's ``language_prefix`` gives them.

    NLLB and M2M-100 (:class:`~seq2seq.data.vocabulary.VocabularyTokenizer`) force the target
    language as the first decoder token; Marian and a SentencePiece model with tags
    (:class:`~seq2seq.data.tokenizer.Tokenizer`) put ``>>xx<<`` at the start of the source. A
    tokenizer without language tokens gives ``([], [])``.

    Args:
        tokenizer: the model's tokenizer.
        tgt_lang: the target language as the model names it; ``None``: the tokenizer's own
            (a model of ours with tags has none, and needs one).
        src_lang: the source language (NLLB and M2M-100 codes; ignored by tags).

    Raises:
        ValueError: for a ``tgt_lang`` the model has no token for, naming those it has; for
            none on a model of ours with tags (naming its languages), or any ``tgt_lang``
            on a SentencePiece model without tags.
    """
    return tokenizer.language_prefix(tgt_lang, src_lang)


def untagged_target(
    tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]] | None, tgt_lang: str | None
) -> str | None:
    """``tgt_lang``, or ``None`` where it names the one target language of a model without
    language tokens (a bilingual model's own: there is nothing to select, so it is no error).

    Args:
        tokenizer: the model's tokenizer (its ``languages``: those with tokens).
        pairs: the ``(src, tgt)`` pairs the model was trained on; ``None``: not known.
        tgt_lang: the caller's target language.

    Raises:
        ValueError: naming the model's one target language, for another ``tgt_lang`` on a
            model without language tokens whose pairs are known; naming the targets, for no
            ``tgt_lang`` to an imported NLLB or M2M-100 model trained into several.
    """
    targets = {tgt for _, tgt in pairs or ()}
    family = getattr(tokenizer, "family", None)
    if tgt_lang is None and len(targets) > 1 and family not in (None, "marian"):
        # An imported model's default target (NLLB's, from its import) is no choice among
        # the several its run trained; ours and Marian's tag the source (refused or warned).
        raise ValueError(
            f"this model was trained into {', '.join(sorted(targets))}: choose the target "
            "language (tgt_lang / --tgt_lang)"
        )
    if tgt_lang is None or getattr(tokenizer, "languages", ()) or len(targets) != 1:
        return tgt_lang
    if _is_one_of(tgt_lang, list(targets)):  # en, or eng
        return None
    (only,) = targets
    raise ValueError(
        f"tgt_lang={tgt_lang!r}: this model has no target-language tokens; it translates into "
        f"{only} alone (give {only} or leave tgt_lang out)"
    )


def source_language(
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]] | None,
    src_lang: str | None,
    tgt_lang: str | None,
) -> str | None:
    """``src_lang``; where it is not given to an imported NLLB or M2M-100 model (whose source
    code is part of the input) trained on known ``pairs``, the one source language of the
    pairs into ``tgt_lang`` (``None``: the model's one target), instead of the default
    source of its import; else ``None`` (the tokenizer's default).

    Raises:
        ValueError: naming the sources, where several pairs lead into ``tgt_lang``.
    """
    if src_lang is not None or not pairs or getattr(tokenizer, "family", None) in (None, "marian"):
        return src_lang
    into = {tgt for _, tgt in pairs} if tgt_lang is None else None
    sources = sorted(
        {src for src, tgt in pairs if (tgt in into if into else _is_one_of(tgt_lang, [tgt]))}
    )
    if len(sources) > 1:
        target = tgt_lang or next(iter(into))
        raise ValueError(
            f"this model was trained from {', '.join(sources)} into {target}: name the source "
            "language (src_lang / --src_lang)"
        )
    return sources[0] if sources else None


def requested_languages(
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]] | None,
    tgt_lang: str | None,
    src_lang: str | None,
) -> tuple[str | None, str | None, tuple[list[int], list[int]]]:
    """The languages a translation request selects, checked before any work: ``tgt_lang``
    (:func:`untagged_target`), ``src_lang`` (:func:`source_language`) and their
    :func:`language_prefixes`; a direction outside the trained ``pairs`` is warned about
    (:func:`zero_shot_warning`).

    Raises:
        ValueError: as those functions.
    """
    tgt_lang = untagged_target(tokenizer, pairs, tgt_lang)
    src_lang = source_language(tokenizer, pairs, src_lang, tgt_lang)
    prefixes = language_prefixes(tokenizer, tgt_lang, src_lang)
    zero_shot = zero_shot_warning(pairs, src_lang, tgt_lang)
    if zero_shot:
        warnings.warn(zero_shot, UserWarning, stacklevel=3)  # at the translate call
    return tgt_lang, src_lang, prefixes


def default_target_prefix(tokenizer: Tokenizer, tgt_lang: str | None = None) -> list[int]:
    """The target ids forced where a batch gives none: an imported NLLB or M2M-100 model's
    code of ``tgt_lang`` (``None``: its default target language); none for tokenizers that
    tag the source (ours, Marian's), whose batches carry the tag already."""
    if getattr(tokenizer, "family", None) in (None, "marian"):
        return []
    return language_prefixes(tokenizer, tgt_lang)[1]


def _is_one_of(lang: str, names: Sequence[str]) -> bool:
    """Whether ``lang`` is the language of one of ``names`` (by any of its codes)."""
    try:
        return same_language(lang, names) is not None
    except ValueError:  # the language of several of them
        return True


def zero_shot_warning(
    pairs: Sequence[tuple[str, str]] | None, src_lang: str | None, tgt_lang: str | None
) -> str | None:
    """``"de->fr was not trained (pairs: de-en, en-de, fr-en); translating zero-shot"`` when
    ``src_lang`` is given and ``(src_lang, tgt_lang)`` is none of the trained ``pairs``, else
    ``None`` (also where the pairs are not known, or ``src_lang`` is not given). A ``src_lang``
    that is none of the pairs' languages is named as a likely misspelling. Without
    ``tgt_lang``, the target is the pairs' one target language."""
    if not pairs or src_lang is None:
        return None
    if tgt_lang is None:
        targets = {tgt for _, tgt in pairs}
        if len(targets) != 1:
            return None  # the tokenizer asks for tgt_lang
        (tgt_lang,) = targets
    # Any code of a pair's language is that language (NLLB's deu_Latn for a pair's de).
    if any(_is_one_of(src_lang, [src]) and _is_one_of(tgt_lang, [tgt]) for src, tgt in pairs):
        return None
    languages = sorted({lang for pair in pairs for lang in pair})
    unknown = ""
    if not _is_one_of(src_lang, languages):
        unknown = f"; {src_lang} is none of its languages ({', '.join(languages)})"
        unknown += "" if is_language_code(src_lang) else ", nor a language code: misspelt?"
    return (
        f"{src_lang}->{tgt_lang} was not trained (pairs: {pair_names(sorted(pairs))}){unknown}; "
        "translating zero-shot"
    )


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
    padding, EOS, unknown pieces, bare word boundaries and language tokens: an empty or blank
    line, or one of characters outside the vocabulary such as U+2060)."""
    tok = tokenizer
    known = src.ne(tok.pad_id) & src.ne(tok.eos_id) & src.ne(tok.unk_id)
    known &= src.ne(tok.space_id)
    languages = sorted(getattr(tok, "language_ids", ()))
    if languages:  # one test for NLLB's 202 codes, not one per code
        known &= ~torch.isin(src, torch.tensor(languages, device=src.device))
    return (~known.any(dim=1)).tolist()


def _search(
    model: Transformer,
    batch: Mapping[str, Any],
    tokenizer: Tokenizer,
    config: DecodingConfig,
    n_best: int,
    scores: bool,
):
    """The search (or sampling) that ``config`` asks for: the one call of
    :mod:`seq2seq.nn.search` and :mod:`seq2seq.nn.sampling`."""
    src, src_mask = batch["src"], batch["src_mask"]
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    options = {
        "prefix": batch.get("prefix"),
        "unscored_prefix": batch.get("unscored_prefix", 0),
        "unk_id": tokenizer.unk_id,
    }
    if config.sampling:
        return sample(model, src, src_mask, bos, eos, config, **options)
    if config.beam_size == 1:
        return greedy_search(model, src, src_mask, bos, eos, config, **options, scores=scores)
    return beam_search(model, src, src_mask, bos, eos, config, n_best=n_best, **options)


@torch.no_grad()
def decode_batch(
    model: Transformer,
    tokenizer: Tokenizer,
    batch: Mapping[str, Any],
    config: DecodingConfig,
    n_best: int = 1,
    tgt_lang: str | None = None,
    scores: bool = True,
) -> list[list[tuple[str, float]]]:
    """Decode a batch of sources into detokenized text, as ``config`` says.

    Args:
        model: the Transformer (or Ensemble), in the mode the caller chose.
        tokenizer: its SentencePiece model.
        batch: ``src`` ``(B, S)`` long and ``src_mask`` ``(B, 1, 1, S)`` bool; optionally
            ``"prefix"`` (target ids forced first, per sentence) and ``"unscored_prefix"``, as
            the searches take them. Without a prefix, :func:`default_target_prefix` is forced,
            unscored (as Hugging Face's ``forced_bos_token_id``).
        config: the decoding settings.
        n_best: hypotheses per sentence (at most ``config.beam_size``; with sampling, 1 or
            ``config.n_samples``, which is what is returned).
        tgt_lang: the target language whose prefix is forced without a ``"prefix"``
            (``None``: the tokenizer's own); a source-side tag is already in ``src``.
        scores: ``False``: greedy search skips its log-softmax and scores ``nan``.

    Returns:
        For each sentence, ``n_best`` pairs of (text, score), best first (fewer where the
        bans leave fewer with a finite score; ``n_samples`` in
        sample order with sampling); a source with no piece the model knows gets as many
        pairs ``("", 0.0)``.

    Raises:
        ValueError: for an ``n_best`` out of these bounds, or a malformed prefix.
    """
    if config.sampling and n_best not in (1, config.n_samples):
        raise ValueError(
            f"n_best ({n_best}) applies to beam search; sampling returns n_samples "
            f"({config.n_samples}) hypotheses per sentence"
        )
    if not config.sampling and n_best > config.beam_size:
        raise ValueError(
            f"n_best ({n_best}) exceeds the beam size ({config.beam_size}); pass "
            f"beam_size={n_best} or more"
        )
    if batch.get("prefix") is None:
        forced = default_target_prefix(tokenizer, tgt_lang)
        if forced:  # e.g. NLLB's target-language code, the first decoder token
            batch = {**batch, "prefix": [forced] * batch["src"].size(0)}
            batch["unscored_prefix"] = len(forced)
    results = _search(model, batch, tokenizer, config, n_best, scores)
    n_out = config.n_samples if config.sampling else n_best
    output = []
    for hyps, no_token in zip(results, _nothing_known(tokenizer, batch["src"]), strict=True):
        if no_token:  # nothing to translate: an empty line, not an invented sentence
            output.append([("", 0.0)] * n_out)
            continue
        texts = tokenizer.decode([h.tokens for h in hyps[:n_out]])
        output.append([(text, float(h.score)) for text, h in zip(texts, hyps, strict=False)])
    return output
