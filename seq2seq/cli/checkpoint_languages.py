"""The languages of a checkpoint against the config's: ``data.src_lang``/``data.tgt_lang`` or
the ``data.pairs`` of a multilingual run, compared for ``validate``/``test``/``predict`` and
resume (:func:`other_languages`), and checked when ``fit --init_from`` starts a run on
pairs the checkpoint was not trained on (:func:`check_target_tags`,
:func:`report_new_languages`); some of a checkpoint's pairs scored alone
(:func:`scored_subset`), or the one that ``predict`` translates (:func:`chosen_pairs`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from jsonargparse import Namespace
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from seq2seq.checkpoint.format import (
    CHECKPOINT_KEY,
    IMPORTED_FROM,
    language_pairs,
    pair_names,
    split_pair,
)
from seq2seq.checkpoint.restore import tokenizer_from_checkpoint

SAMPLE_SENTENCES = 1000
"""Training sentences of a language new to an ``--init_from`` checkpoint on which its share of
unknown pieces is measured."""

Pairs = tuple[tuple[str, str], ...]


def configured_pairs(data: dict | Namespace) -> Pairs | None:
    """The ``(src, tgt)`` pairs of a config's ``data`` settings: ``data.pairs`` where set,
    else ``(data.src_lang, data.tgt_lang)``; ``None`` where they are not given."""
    if not hasattr(data, "get"):
        return None
    pairs = data.get("pairs")
    if pairs:
        return tuple(split_pair(str(pair)) for pair in pairs)
    mine = (data.get("src_lang"), data.get("tgt_lang"))
    return None if None in mine else (mine,)


def saved_pair_setting(checkpoint: dict) -> list[str] | None:
    """The checkpoint's ``data.pairs`` as saved (``None``: a bilingual run)."""
    pairs = (checkpoint.get("datamodule_hyper_parameters") or {}).get("pairs")
    return list(pairs) if pairs else None


def other_languages(checkpoint: dict, data: dict | Namespace) -> str | None:
    """``"de->en (data.src_lang de, data.tgt_lang en), not en->de as configured"`` when the
    checkpoint's language pair differs from the config's ``data`` settings; ``"on the pairs
    de-en, fr-en (data.pairs), not de-en as configured"`` where either names ``data.pairs``
    (compared as sets); else ``None``."""
    saved, mine = language_pairs(checkpoint), configured_pairs(data)
    if saved is None or mine is None or set(saved) == set(mine):
        return None
    bilingual = not saved_pair_setting(checkpoint) and not data.get("pairs")
    if bilingual and len(saved) == len(mine) == 1:
        (src, tgt), (my_src, my_tgt) = saved[0], mine[0]
        return (
            f"{src}->{tgt} (data.src_lang {src}, data.tgt_lang {tgt}), not "
            f"{my_src}->{my_tgt} as configured"
        )
    return f"on the pairs {pair_names(saved)} (data.pairs), not {pair_names(mine)} as configured"


def scored_subset(checkpoint: dict, data: dict | Namespace) -> Pairs | None:
    """``validate``/``test``: the configured ``data.pairs`` where they are some, not all, of the
    checkpoint's pairs (scored alone, as fairseq's ``generate`` scores one direction of a
    multilingual model), else ``None``. Only ``data.pairs`` chooses: ``data.src_lang`` and
    ``data.tgt_lang`` have defaults, which would pick a subset nobody asked for."""
    saved = language_pairs(checkpoint)
    if not saved or not hasattr(data, "get") or not data.get("pairs"):
        return None
    mine = configured_pairs(data)
    return mine if mine and set(mine) < set(saved) else None


def chosen_pairs(
    subcommand: str, path: str, checkpoint: dict, data: dict | Namespace
) -> Pairs | None:
    """The pairs of a multilingual checkpoint that ``validate``/``test`` score
    (:func:`scored_subset`) or ``predict`` translates: for ``predict`` the configured
    direction (``data.pairs`` of one pair, else ``data.src_lang``/``data.tgt_lang``) into one
    of the checkpoint's target languages (one of its pairs, or zero-shot); else ``None``.

    Raises:
        ValueError: ``predict`` of several pairs, or into a language that the checkpoint does
            not translate into, naming its pairs and ``data.pairs``.
    """
    if subcommand in ("validate", "test"):
        return scored_subset(checkpoint, data)
    saved, mine = language_pairs(checkpoint), configured_pairs(data)
    if subcommand != "predict" or not saved or len(saved) < 2 or not mine:
        return None
    if len(mine) > 1 or mine[0][1] not in {tgt for _, tgt in saved}:
        if len(mine) > 1:
            what = f"data.pairs lists {pair_names(mine)}"
        else:
            what = f"not {pair_names(mine)} as configured: it does not translate into {mine[0][1]}"
        raise ValueError(
            f"{path} translates the pairs {pair_names(saved)} ({what}); predict translates one "
            f"direction: choose it with --data.pairs '[{pair_names(saved[:1])}]' (or "
            "data.src_lang and data.tgt_lang)"
        )
    return mine  # one of its pairs, or a zero-shot direction into one of its targets


def use_chosen_pairs(subcommand: str, path: str, checkpoint: dict, subset: Pairs, config) -> None:
    """Notes the pairs :func:`chosen_pairs` chose; the data module of one pair is bilingual
    (a tagged model's tokenizer still tags), ``model.tgt_lang`` its target (sacreBLEU's
    tokenizer choice)."""
    data = config["data"]
    if rank_zero_only.rank == 0:
        does = "translates" if subcommand == "predict" else "scores"
        given = "data.pairs" if data.get("pairs") else "data.src_lang, data.tgt_lang"
        new = set(subset) - set(language_pairs(checkpoint) or ())
        print(
            f"seq2seq: {'warning' if new else 'note'}: {path} was trained on the pairs "
            f"{pair_names(language_pairs(checkpoint))}; {subcommand} {does} "
            f"{pair_names(subset)} ({given}){', zero-shot' if new else ''}",
            file=sys.stderr,
        )
    if len(subset) == 1:
        data["src_lang"], data["tgt_lang"] = subset[0]
        if "pairs" in data:
            data["pairs"] = [pair_names(subset)]
        config["model"]["tgt_lang"] = subset[0][1]


def _imported(checkpoint: dict) -> bool:
    return IMPORTED_FROM in (checkpoint.get(CHECKPOINT_KEY) or {})


def check_target_tags(path: str, checkpoint: dict, data: dict | Namespace) -> None:
    """``fit --init_from``: refuses configured pairs whose target languages need a ``>>xx<<``
    tag (several targets, or a checkpoint with tags) that the checkpoint's SentencePiece
    model lacks: the run keeps that model, whose pieces cannot grow. Imported checkpoints,
    whose language tokens follow their family's rules, are not checked.

    Raises:
        ValueError: naming the missing tags, the checkpoint's and ``data.pairs``.
    """
    mine = configured_pairs(data)
    if not mine or _imported(checkpoint):
        return
    tags = tuple(getattr(tokenizer_from_checkpoint(checkpoint), "languages", ()))
    targets = sorted({tgt for _, tgt in mine})
    missing = [tgt for tgt in targets if tgt not in tags] if tags or len(targets) > 1 else []
    if missing:
        lacking = ", ".join(f">>{tgt}<<" for tgt in missing)
        have = ", ".join(f">>{tag}<<" for tag in tags) or "none"
        raise ValueError(
            f"--init_from {path}: its vocabulary has no {lacking} tag for the target "
            f"language{'s' if len(missing) > 1 else ''} of data.pairs [{pair_names(mine)}] "
            f"(its tags: {have}), and its SentencePiece model cannot grow; train from scratch "
            "with the new pairs (data.pairs, without --init_from)"
        )


def new_languages(checkpoint: dict, pairs: Sequence[tuple[str, str]] | None) -> list[str]:
    """The languages of ``pairs`` that the checkpoint was not trained on (sorted); none where
    it records no pairs (an imported checkpoint)."""
    saved = None if _imported(checkpoint) else language_pairs(checkpoint)
    if not saved or not pairs:
        return []
    seen = {lang for pair in saved for lang in pair}
    return sorted({lang for pair in pairs for lang in pair} - seen)


def report_new_languages(path: str, checkpoint: dict, datamodule, tokenizer) -> None:
    """``fit --init_from`` on languages the checkpoint was not trained on (nor its
    SentencePiece model, which the run keeps): one line on stderr saying so, with the share
    of their pieces that are ``<unk>`` (:func:`~seq2seq.data.tokenizer.unknown_rate`) on up
    to :data:`SAMPLE_SENTENCES` training sentences each (left out where the training text
    cannot be read yet: the data module reports that)."""
    mine = data_module_pairs(datamodule)
    new = new_languages(checkpoint, mine)
    if not new:
        return
    from seq2seq.data.tokenizer import unknown_rate

    rates = []
    for lang in new:
        try:
            texts = training_sentences(datamodule, mine, lang, SAMPLE_SENTENCES)
        except (OSError, ValueError):
            texts = []
        if texts:
            rate = unknown_rate(tokenizer, texts)
            rates.append(f"{lang} {rate:.1%} of pieces unknown in {len(texts)} training sentences")
    data = {"src_lang": mine[0][0], "tgt_lang": mine[0][1]}
    data["pairs"] = [f"{src}-{tgt}" for src, tgt in mine] if len(mine) > 1 else None
    measured = f" ({'; '.join(rates)})" if rates else ""
    print(
        f"seq2seq: warning: --init_from {path} was trained {other_languages(checkpoint, data)}; "
        f"fit trains it on the configured pairs with its SentencePiece model, which has no "
        f"pieces learnt from {', '.join(new)}: their text is encoded with its existing "
        f"pieces{measured}",
        file=sys.stderr,
    )


def data_module_pairs(datamodule) -> Pairs | None:
    """The ``(src, tgt)`` pairs a data module trains on (``None`` for another object)."""
    pairs = getattr(datamodule, "language_pairs", None)
    if pairs:
        return tuple(map(tuple, pairs))
    src, tgt = getattr(datamodule, "src_lang", None), getattr(datamodule, "tgt_lang", None)
    return None if src is None or tgt is None else ((src, tgt),)


def training_sentences(datamodule, pairs: Sequence[tuple[str, str]], lang: str, limit: int):
    """Up to ``limit`` training sentences of ``lang``, from the first of ``pairs`` that has it,
    where the data module finds it (in the pair's folder,
    :func:`~seq2seq.data.corpus.pair_folder`).

    Raises:
        OSError, ValueError: as :func:`seq2seq.data.corpus.locate_split` and its reading.
    """
    from seq2seq.data.corpus import locate_split, pair_folder

    src, tgt = next(pair for pair in pairs if lang in pair)
    corpus = locate_split(
        pair_folder(datamodule.data_dir, src, tgt),
        datamodule.train_split,
        src,
        tgt,
        datamodule.hf_dataset,
        datamodule.hf_config,
    )
    for sources, targets in corpus.iter_chunks(limit):
        return list(sources if lang == src else targets)
    return []
