"""Multilingual runs (``data.pairs``): the language pairs, their target-language tags, the
held-out sets of each pair, and the training set over every pair.

One model learns every pair. Where the pairs have more than one target language, each source
starts with the tag ``>>t<<`` of its target language ``t`` (Johnson et al. 2017; the OPUS-MT
convention), a user-defined piece of the joint SentencePiece model; a many-to-one run
(``[de-en, fr-en]``) needs no tag. Training draws each epoch's examples over the pairs with
temperature sampling (:func:`~seq2seq.data.batching.temperature_probs`); streamed, each item's
pair is drawn so (:mod:`seq2seq.data.mixed_stream`).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.utils.data import Dataset

from seq2seq.data.batching import temperature_probs
from seq2seq.data.corpus import CorpusSplit, SplitNotFoundError, locate_split, pair_folder
from seq2seq.data.dataset import Lengths, TokenizedDataset
from seq2seq.data.language_tags import target_tags
from seq2seq.data.mixed_stream import MixedStream
from seq2seq.data.multi30k import download_missing, downloadable, missing_files
from seq2seq.data.spm_files import SentencePieceSettings, load_or_train, load_or_train_pairs
from seq2seq.data.token_cache import ENCODE_CHUNK
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.user_symbols import check_model_symbols

#: A language pair ``(src_lang, tgt_lang)``.
Pair = tuple[str, str]

_FORM = '"<src>-<tgt>" of two language codes (e.g. de-en)'


def parse_pairs(pairs: Sequence[str] | None) -> list[Pair]:
    """``["de-en", "fr-en"]`` as ``[("de", "en"), ("fr", "en")]``; ``[]`` for None.

    Raises:
        ValueError: naming ``data.pairs`` and the entry, for an empty list, an entry that is
            not ``"<src>-<tgt>"`` with two different codes (without spaces or ``/``), or a
            pair listed twice.
    """
    if pairs is None:
        return []
    if isinstance(pairs, str):
        raise ValueError(f"data.pairs must be a list of pairs {_FORM}; got {pairs!r}.")
    if not pairs:
        raise ValueError(
            f"data.pairs is empty: list at least one pair {_FORM}, or set it to null for a "
            "bilingual run of data.src_lang -> data.tgt_lang."
        )
    parsed: list[Pair] = []
    for entry in pairs:
        codes = entry.split("-") if isinstance(entry, str) else []
        if len(codes) != 2 or not all(codes) or any(c.isspace() or c == "/" for c in entry):
            raise ValueError(f"data.pairs entry {entry!r} is not a pair {_FORM}.")
        if codes[0] == codes[1]:
            raise ValueError(
                f"data.pairs entry {entry!r} has the same language on both sides; a pair "
                "translates between two languages."
            )
        if tuple(codes) in parsed:
            raise ValueError(f"data.pairs lists {entry!r} twice.")
        parsed.append((codes[0], codes[1]))
    return parsed


def pair_name(pair: Pair) -> str:
    """``"de-en"`` for ``("de", "en")``."""
    return f"{pair[0]}-{pair[1]}"


def encode_languages(tokenizer: Any, pair: Pair, multilingual: bool) -> dict[str, str]:
    """The language keywords of ``tokenizer.encode`` for a pair's text: ``src_lang`` and
    ``tgt_lang`` in a multilingual run or with a tagged SentencePiece model (whose encoded
    sources then start with the target's tag), else none, so that a bilingual run encodes as
    it always has (an imported model with its own default languages included)."""
    if multilingual or (isinstance(tokenizer, Tokenizer) and tokenizer.languages):
        return {"src_lang": pair[0], "tgt_lang": pair[1]}
    return {}


def check_tags(tokenizer: Any, pairs: Sequence[Pair], where: str) -> None:
    """Raises ``ValueError`` if the pairs have several target languages and ``tokenizer``
    (described by ``where``, e.g. ``"data.tokenizer_path x.model"``) lacks the language of
    one: the model could not tell which language to translate into."""
    targets = sorted({tgt for _, tgt in pairs})
    missing = [tgt for tgt in targets if len(targets) > 1 and not tokenizer.language_name(tgt)]
    if missing:
        raise ValueError(
            f"data.pairs translate into {', '.join(targets)}, but {where} has no tag for "
            f"{', '.join(missing)} (its languages: {', '.join(tokenizer.languages) or 'none'}); "
            "unset data.tokenizer_path to train a joint model with every target's tag."
        )


class HeldOut(NamedTuple):
    """One held-out set: its key (``"val/de-en"``), pair, split and the name its lengths and
    warnings go by (the split in a bilingual run, as before; the key otherwise)."""

    key: str
    pair: Pair
    split: str
    name: str


def heldout_plan(
    stage: str,
    pairs: Sequence[Pair],
    val_split: str,
    test_splits: Sequence[str],
    by_pair: bool = False,
) -> list[HeldOut]:
    """The held-out sets of a stage, in dataloader order. Bilingual (one pair): ``val`` and
    ``test/<split>``; several pairs: ``val/<pair>`` and ``test/<pair>/<split>``, pair-major.

    Args:
        stage: ``"fit"`` or ``"validate"`` (validation sets), or ``"test"``.
        pairs: the run's pairs (one for a bilingual run).
        val_split, test_splits: the split names.
        by_pair: name one pair's sets by the pair too.

    Raises:
        ValueError: for another stage.
    """
    several = len(pairs) > 1 or by_pair
    if stage in ("fit", "validate"):
        keys = [f"val/{pair_name(p)}" if several else "val" for p in pairs]
        return [
            HeldOut(key, p, val_split, key if several else val_split)
            for key, p in zip(keys, pairs, strict=True)
        ]
    if stage == "test":
        plan = []
        for pair in pairs:
            for split in test_splits:
                key = f"test/{pair_name(pair)}/{split}" if several else f"test/{split}"
                plan.append(HeldOut(key, pair, split, key if several else split))
        return plan
    raise ValueError(f"No held-out sets for stage {stage!r}: use 'fit', 'validate' or 'test'.")


class PairsDataset(Dataset):
    """The training examples of every pair, one pair after the other: example ``i`` of pair
    ``k`` has the index ``offsets[k] + i``. Each dataset's examples carry its ``"pair"``.

    Args:
        datasets: one training set per pair (its examples carrying ``"pair"``).
        probs: (P,) float, each pair's sampling probability (for the batch sampler).
    """

    def __init__(self, datasets: Sequence[TokenizedDataset], probs: Sequence[float]) -> None:
        self.datasets = list(datasets)
        self.probs = np.asarray(probs, dtype=np.float64)
        self.offsets = np.cumsum([0, *(len(d) for d in self.datasets)])

    @property
    def groups(self) -> np.ndarray:
        """(N,) int64: the pair index of each example."""
        sizes = np.diff(self.offsets)
        return np.repeat(np.arange(len(self.datasets), dtype=np.int64), sizes)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        indices = np.asarray(list(indices), dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"index out of range for {len(self)} examples")
        owner = np.searchsorted(self.offsets, indices, side="right") - 1
        examples: list[Any] = [None] * len(indices)
        for k in np.unique(owner).tolist():  # one read per pair, the batch's order kept
            where = np.flatnonzero(owner == k)
            local = (indices[where] - self.offsets[k]).tolist()
            for position, example in zip(where, self.datasets[k].__getitems__(local), strict=True):
                examples[position] = example
        return examples


def pairs_training_set(
    parts: Sequence[tuple[TokenizedDataset, Lengths]], pairs: Sequence[Pair], temperature: float
) -> tuple[PairsDataset, Lengths]:
    """The training set over every pair and its lengths, from each pair's filtered set (in
    ``pairs`` order), sampled with :func:`temperature_probs` at ``temperature``; each pair's
    kept pairs and sampling probability are logged in one line."""
    counts = [len(dataset) for dataset, _ in parts]
    probs = temperature_probs(counts, temperature)
    shares = ", ".join(
        f"{pair_name(pair)} {n} pairs (p={q:.3f})"
        for pair, n, q in zip(pairs, counts, probs, strict=True)
    )
    rank_zero_info(f"Sampling training pairs with data.pair_temperature={temperature}: {shares}.")
    lengths = tuple(np.concatenate([part[1][side] for part in parts]) for side in (0, 1))
    return PairsDataset([dataset for dataset, _ in parts], probs), lengths


def mixed_training_stream(
    corpora: Sequence[CorpusSplit], pairs: Sequence[Pair], temperature: float, seed: int
) -> MixedStream:
    """Every pair's training split as one stream sampled at ``temperature`` (see
    :mod:`seq2seq.data.mixed_stream`); each pair's sentence pairs are counted first (read
    through where no metadata records them) and logged in one line with their probability."""
    rank_zero_info("Counting the training pairs of every pair (streaming samples them by size).")
    sizes = [corpus.count(ENCODE_CHUNK) for corpus in corpora]
    probs = temperature_probs(sizes, temperature)
    shares = ", ".join(
        f"{pair_name(pair)} {n} pairs (p={q:.3f})"
        for pair, n, q in zip(pairs, sizes, probs, strict=True)
    )
    rank_zero_info(
        f"Streaming training pairs with data.pair_temperature={temperature}: {shares}; "
        f"{sum(sizes)} drawn per epoch."
    )
    return MixedStream(corpora, [pair_name(pair) for pair in pairs], sizes, probs, seed)


class PairsMixin:
    """The language pairs of a :class:`~seq2seq.data.datamodule.TranslationDataModule`: their
    held-out sets and keys, where their splits are, the Multi30k files they miss, and the
    tokenizer over them. It reads the data module's settings (``pairs``, ``src_lang``,
    ``data_dir``, ...), ``_pairs`` (the run's pairs, one for a bilingual run) and its sets."""

    heldout_by_pair: bool = False
    """Whether one pair's held-out sets go by the pair too (``val/de-en``,
    ``test/de-en/<split>``), as a run of several pairs names them: set where ``validate`` or
    ``test`` scores one of a multilingual checkpoint's pairs, so that its scores and files
    are named as that run's are."""

    # ------------------------------------------------------------------ pairs and keys
    @property
    def multilingual(self) -> bool:
        """Whether the run has several language pairs (``pairs``)."""
        return self.pairs is not None

    @property
    def language_pairs(self) -> list[tuple[str, str]]:
        """``[(src_lang, tgt_lang), ...]``: the run's pairs (one for a bilingual run)."""
        return list(self._pairs)

    @property
    def pair_names(self) -> list[str]:
        """``["de-en", ...]``: the run's pairs by name (one for a bilingual run)."""
        return [pair_name(pair) for pair in self._pairs]

    def heldout_keys(self, stage: str) -> list[str]:
        """The key of each held-out dataloader of ``stage`` (``"fit"``/``"validate"`` or
        ``"test"``), in order: bilingual ``["val"]`` / ``["test/<split>", ...]``; several
        pairs ``["val/de-en", ...]`` / ``["test/de-en/<split>", ...]`` (pair-major)."""
        return [held.key for held in self._plan(stage)]

    def heldout_tgt_lang(self, key: str) -> str:
        """The target language of the held-out set ``key`` (:meth:`heldout_keys`).

        Raises:
            KeyError: for a key the run has no set of (several pairs).
        """
        if not self.multilingual:
            return self.tgt_lang
        langs = {h.key: h.pair[1] for stage in ("fit", "test") for h in self._plan(stage)}
        if key not in langs:
            raise KeyError(f"No held-out set {key!r}; the sets: {', '.join(langs)}.")
        return langs[key]

    def heldout_dataset(self, key: str) -> TokenizedDataset | None:
        """The held-out set ``key`` (:meth:`heldout_keys`) once set up, else None."""
        if key.startswith("test/"):
            return self.test_sets.get(key.removeprefix("test/"))
        return self.val_sets.get(key)

    def _plan(self, stage: str) -> list[HeldOut]:
        return heldout_plan(
            stage, self._pairs, self.val_split, self.test_set_names, self.heldout_by_pair
        )

    def _languages(self, pair: Pair, tokenizer: Tokenizer | None = None) -> dict[str, str]:
        """``tokenizer.encode``'s language keywords for the text of ``pair``."""
        tokenizer = self.tokenizer if tokenizer is None else tokenizer
        return encode_languages(tokenizer, pair, self.multilingual)

    # ------------------------------------------------------------------ locating data
    def _all_splits(self) -> list[str]:
        return [self.train_split, self.val_split, *self.test_set_names]

    def _stage_splits(self, stage: str | None) -> list[str]:
        """The held-out splits a Lightning stage reads (``setup`` raises for a missing one)."""
        if stage in ("fit", "validate"):
            return [self.val_split]
        if stage == "test":
            return list(self.test_set_names)
        return []

    def _locate(self, split: str, pair: Pair | None = None) -> CorpusSplit:
        """The split of ``pair`` (default: ``src_lang``-``tgt_lang``), in its pair folder
        (:func:`~seq2seq.data.corpus.pair_folder`) or ``data_dir``, or in ``hf_dataset``."""
        src, tgt = pair or (self.src_lang, self.tgt_lang)
        folder = pair_folder(self.data_dir, src, tgt)
        try:
            return locate_split(folder, split, src, tgt, self.hf_dataset, self.hf_config)
        except SplitNotFoundError as err:
            root = Path(self.data_dir)
            if self.hf_dataset is not None or folder != root or not root.is_dir():
                raise
            names = [f"{src}-{tgt}", f"{tgt}-{src}"]
            folders = [p.name for p in root.iterdir() if p.is_dir() and "-" in p.name]
            alike = difflib.get_close_matches(names[0], folders, 1, 0.8)
            alike = alike or difflib.get_close_matches(names[1], folders, 1, 0.8)
            hint = f" (did you mean {root / alike[0]}?)" if alike else ""
            advice = f" {err.advice}." if err.advice else ""
            raise FileNotFoundError(
                f"{err.problem}.{advice} Nor is there a pair folder {root / names[0]} "
                f"or {names[1]}{hint}."
            ) from None

    def _download_missing(self, training: bool = True, stage: str | None = None) -> None:
        """Downloads the Multi30k files that cannot be found of the splits ``stage`` reads
        (every configured split for ``None``), for every pair: the training split when
        ``training``, the held-out splits of :meth:`_stage_splits`; only into a Multi30k folder
        (see :mod:`seq2seq.data.multi30k`). ``fit`` therefore fetches no test set."""
        if not self.download or self.hf_dataset is not None:
            return
        splits = self._all_splits() if stage is None else self._stage_splits(stage)
        if stage is not None and training:
            splits = [self.train_split, *splits]
        if not training:
            splits = [split for split in splits if split != self.train_split]
        wanted: dict[Path, list[str]] = {}  # per folder: one download names every file
        for pair in self._pairs:
            folder = pair_folder(self.data_dir, *pair)
            wanted.setdefault(folder, []).extend(missing_files(
                folder, list(dict.fromkeys(splits)), self.train_split,
                partial(self._locate, pair=pair), pair,
            ))  # fmt: skip
        for folder, files in wanted.items():
            download_missing(folder, files)

    def _fetched(self, pair: Pair, split: str) -> bool:
        """Whether the Multi30k download fetches the missing ``split`` of ``pair`` when
        ``test`` runs."""
        locate = partial(self._locate, pair=pair)
        return (
            self.download
            and self.hf_dataset is None
            and downloadable(split, self.train_split, locate, pair)
        )

    def _training_stream(self) -> CorpusSplit | MixedStream:
        """The training split to stream: one pair's, or every pair's as a mixed stream."""
        corpora = [self._locate(self.train_split, pair) for pair in self._pairs]
        if not self.multilingual:
            return corpora[0]
        return mixed_training_stream(corpora, self._pairs, self.pair_temperature, self.seed)

    # ------------------------------------------------------------------ tokenizer
    def _prepare_tokenizer(self) -> Tokenizer:
        """Loads the SentencePiece model, training it on the training split if it is missing
        (see :mod:`seq2seq.data.spm_files`): with several pairs one joint model over every
        language, with a tag per target language where there are several."""
        named = self.tokenizer_path is not None and Path(self.tokenizer_path).is_file()
        settings = SentencePieceSettings(
            vocab_size=self.vocab_size,
            model_type=self.spm_model_type,
            character_coverage=self.character_coverage,
            byte_fallback=self.byte_fallback,
            input_sentence_size=self.spm_input_sentence_size,
            seed=self.seed,
            streaming=self.streaming,
            user_symbols=tuple(self.user_symbols),
        )
        if named or not self.multilingual:
            train = None if named else self._locate(self.train_split)
            return load_or_train(
                train, settings, self.cache_dir, self.tokenizer_path, chunk_size=ENCODE_CHUNK
            )
        trains = [self._locate(self.train_split, pair) for pair in self._pairs]
        return load_or_train_pairs(
            trains, settings, self.cache_dir, self.tokenizer_path, target_tags(self._pairs),
            chunk_size=ENCODE_CHUNK,
        )  # fmt: skip

    def _checked_tokenizer(self) -> Tokenizer:
        """:attr:`tokenizer` (a checkpoint's) or :meth:`_prepare_tokenizer`'s, refused
        (:func:`~seq2seq.data.pairs.check_tags`, :func:`~.user_symbols.check_model_symbols`) if
        it lacks a target language's tag or splits a user symbol."""
        tokenizer = self._prepare_tokenizer() if self.tokenizer is None else self.tokenizer
        if self.tokenizer is not None:
            where = "the checkpoint's tokenizer"
        else:
            where = f"data.tokenizer_path {self.tokenizer_path}"
        check_tags(tokenizer, self._pairs, where)
        check_model_symbols(tokenizer, self.user_symbols, where)
        return tokenizer
