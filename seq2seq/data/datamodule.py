"""TranslationDataModule: corpus -> SentencePiece -> cached token ids -> token-budget batches."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import lightning as L
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch.utils.data import DataLoader

from seq2seq.data.batching import TokenBudgetBatchSampler, collate, split_costs, split_over_budget
from seq2seq.data.checks import check_inputs, check_model_fits, check_predict_file, check_settings
from seq2seq.data.corpus import CorpusSplit
from seq2seq.data.dataset import Lengths, TokenizedDataset, heldout_set, predict_set, training_set
from seq2seq.data.pairs import (
    HeldOut,
    Pair,
    PairsDataset,
    PairsMixin,
    pairs_training_set,
    parse_pairs,
)
from seq2seq.data.resume import (
    NOT_RESUMABLE,
    batching_differences,
    batching_settings,
    data_changes,
    data_record,
    resume_refusal,
    sampler_position,
    stream_position,
)
from seq2seq.data.streaming import StreamingLoader, StreamingPairs
from seq2seq.data.token_cache import ENCODE_CHUNK, cached_split
from seq2seq.data.tokenizer import BOS_ID, PAD_ID, Tokenizer

# Start of Lightning's warning about drop_last and custom batch samplers in prediction.
_CUSTOM_SAMPLER = "You are using a custom batch sampler `TokenBudgetBatchSampler` for prediction"


class TranslationDataModule(PairsMixin, L.LightningDataModule):
    """Parallel corpus to batches: download, SentencePiece, tokenised cache, token budgets.

    ``prepare_data`` (once per node) downloads Multi30k if it is missing, trains a joint
    source+target SentencePiece model on the training split (or reuses an existing model
    file), and tokenises every split into the Arrow cache under ``cache_dir``
    (:mod:`seq2seq.data.token_cache`), so later runs skip tokenisation. ``setup`` (every
    process) loads the tokenizer and the cached splits, and filters the training pairs.

    Training pairs are filtered (:func:`~seq2seq.data.batching.filter_training_pairs`; the
    counts are logged). Held-out sets (validation, test, predict) never are: sequences longer
    than ``max_positions`` are truncated with a warning, and batches carry the raw source and
    reference lines (``src_text``, ``ref_text``) for scoring.

    Batches come from :class:`TokenBudgetBatchSampler`, which shards them across
    data-parallel ranks itself (rank and world size are taken from the attached trainer):
    run the Trainer with ``use_distributed_sampler=False``.

    Streaming (``streaming=True``), for training corpora larger than memory or disk: the
    training split is read as a stream, never cached, in pools of ``stream_pool_size`` pairs
    (pools, ranks and workers: :mod:`seq2seq.data.streaming`). An epoch ends when the stream
    does, so the training loader has no length (use step-based schedules and an integer
    ``val_check_interval``). Held-out sets are cached as without streaming. Several pairs
    stream as one, each item's pair drawn with ``pair_temperature`` (an epoch: as many items
    as the pairs hold together; :mod:`seq2seq.data.mixed_stream`).

    Resuming (either way) mid-epoch continues with exactly the batches not yet trained on;
    the rules for other batching settings or data than the checkpoint's: :mod:`.resume`.

    Several language pairs (``pairs``, :mod:`seq2seq.data.pairs`): one joint SentencePiece
    model (with a tag per target language where there are several), one training set over
    every pair sampled with ``pair_temperature``, and held-out sets per pair
    (:meth:`heldout_keys`); batches carry ``"pair"``. A pair's splits are read from
    ``data_dir/<src>-<tgt>/`` (or ``<tgt>-<src>/``) where it exists, else from ``data_dir``
    (a bilingual run too), or from ``hf_dataset`` with the pair's languages as fields.

    Args:
        data_dir: Folder of the corpus (see :func:`seq2seq.data.corpus.locate_split` for the
            accepted layouts: aligned text files, TSV, JSONL, Parquet, ``save_to_disk``).
        src_lang: Source language code, as used in file names and dataset fields.
        tgt_lang: Target language code. The same code as ``src_lang`` is warned about (both
            sides would be read from the same files), not refused.
        train_split: Name of the training split.
        val_split: Name of the validation split.
        test_splits: Names of the test splits, reported separately; default
            ``["test_2016_flickr"]``.
        hf_dataset: Read splits from this Hugging Face dataset (Hub name or ``save_to_disk``
            folder) instead of ``data_dir``.
        hf_config: Configuration of ``hf_dataset`` on the Hub (e.g. ``"de-en"``); with
            several ``pairs``, one that holds every language (every pair reads it).
        pairs: Language pairs ``"<src>-<tgt>"`` of a multilingual run (e.g. ``[de-en,
            fr-en]``), in this order; null: the bilingual run ``src_lang``-``tgt_lang``. One
            pair is a bilingual run (``src_lang`` and ``tgt_lang`` are taken from it).
        pair_temperature: Temperature of the sampling over pairs (> 0): a pair's share of
            each epoch is proportional to its size^(1/T); 1: to its size, larger: flatter
            (fairseq uses 5).
        predict_file: Source-language text file to translate with ``predict`` (from
            ``src_lang`` into ``tgt_lang``); every line, empty ones included, gives one example.
        vocab_size: Number of SentencePiece pieces; the model's embedding size. At least
            5: the 4 special pieces (pad, unk, bos, eos) and at least one piece per character
            of the training corpus (SentencePiece's ``unigram`` and ``bpe`` models also need
            the word-boundary piece ``▁``, so at least 6 for them).
        spm_model_type: SentencePiece algorithm: ``"unigram"`` or ``"bpe"``.
        character_coverage: Fraction of characters SentencePiece covers; the rest map to
            ``<unk>`` (or bytes with ``byte_fallback``). SentencePiece accepts 0.98 to 1.
        byte_fallback: Spell unknown characters as UTF-8 byte pieces.
        spm_input_sentence_size: Train SentencePiece on a random sample of this many
            sentences (0: all), for large corpora; with several pairs N/L of each of the L
            languages (0: as many as the smallest has). With ``streaming``: on the first
            this many pairs of the stream (0: 500,000).
        user_symbols: Strings SentencePiece keeps as one piece wherever they occur, e.g.
            ``[<BT>]`` to tag back-translated sources (Caswell et al. 2019); the model of
            ``tokenizer_path``, a checkpoint or ``--init_from`` must keep them so.
        tokenizer_path: SentencePiece model file to use (trained there if missing). Default:
            ``<cache_dir>/spm_<src><tgt>_<type>_<vocab_size>_<hash>.model``, the hash covering
            the training files and SentencePiece settings.
        cache_dir: Folder for the SentencePiece model and the tokenised Arrow cache.
        max_tokens: Token budget of a training batch (sentences x longest sequence). A pair
            that needs more on its own (the longer of source + EOS and target + BOS) forms a
            batch of its own, over the budget; a warning per split says how many pairs do.
        eval_max_tokens: Token budget of a held-out batch; default ``max_tokens``. Held-out
            sentences above it are batched, and warned about, in the same way.
        bucket_size: Sort training examples within random buckets of this size (>= 1)
            instead of globally (``None``; see :class:`TokenBudgetBatchSampler`).
        max_positions: Longest sequence, in tokens with EOS/BOS, the model accepts (>= 2).
        max_length_ratio: Drop training pairs whose longer side has more than this many
            times the tokens of the shorter side (>= 1).
        num_workers: DataLoader worker processes (0: batches are built in the main process).
        seed: Seed of the batch shuffling (epoch ``e`` uses ``seed + e``) and of
            SentencePiece training (>= 0).
        download: Download Multi30k files that are missing from ``data_dir``.
        subword_alpha: If > 0, training examples are re-segmented on every access with
            SentencePiece sampling (subword regularisation) using this alpha; batching still
            uses the cached lengths, so a batch may exceed ``max_tokens`` slightly.
        pad_to_multiple_of: Round the padded source and target lengths of every batch up to
            a multiple of this (see :func:`~seq2seq.data.batching.collate`), e.g. 8 for the
            tensor cores of a GPU. Batches then hold up to ``pad_to_multiple_of - 1`` extra
            padding positions per sentence beyond ``max_tokens``.
        streaming: Stream the training split instead of tokenising it into a cache (see
            above); for corpora that do not fit in memory.
        stream_pool_size: With ``streaming``, pairs per pool: the window within which
            training pairs are shuffled, tokenised and held in memory at a time (per
            DataLoader worker).

    Raises:
        ValueError: When built, before any data is read, for a numeric setting out of its
            range (the ranges: :func:`~seq2seq.data.checks.check_settings`).
    """

    def __init__(
        self,
        data_dir: str = "data/multi30k",
        src_lang: str = "de",
        tgt_lang: str = "en",
        train_split: str = "train",
        val_split: str = "val",
        test_splits: list[str] | None = None,
        hf_dataset: str | None = None,
        hf_config: str | None = None,
        predict_file: str | None = None,
        vocab_size: int = 8000,
        spm_model_type: str = "unigram",
        character_coverage: float = 1.0,
        byte_fallback: bool = False,
        spm_input_sentence_size: int = 0,
        user_symbols: list[str] | None = None,
        tokenizer_path: str | None = None,
        cache_dir: str = "data/cache",
        max_tokens: int = 4096,
        eval_max_tokens: int | None = None,
        bucket_size: int | None = None,
        max_positions: int = 256,
        max_length_ratio: float = 3.0,
        num_workers: int = 0,
        seed: int = 1,
        download: bool = True,
        subword_alpha: float = 0.0,
        pad_to_multiple_of: int = 1,
        streaming: bool = False,
        stream_pool_size: int = 100_000,
        pairs: list[str] | None = None,
        pair_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.data_dir = Path(data_dir)
        parsed = parse_pairs(pairs)  # refused (with the other settings) below
        if len(parsed) == 1:  # a bilingual run
            src_lang, tgt_lang = parsed[0]
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.pairs: list[str] | None = list(pairs) if len(parsed) > 1 else None
        """The pairs of a multilingual run; None for a bilingual one (a one-pair list too)."""
        self.pair_temperature = pair_temperature
        self._pairs: list[Pair] = parsed if len(parsed) > 1 else [(src_lang, tgt_lang)]
        self.train_split, self.val_split = train_split, val_split
        self.test_set_names: list[str] = (
            list(test_splits) if test_splits is not None else ["test_2016_flickr"]
        )
        self.hf_dataset, self.hf_config = hf_dataset, hf_config
        self.predict_file = predict_file
        self.vocab_size, self.spm_model_type = vocab_size, spm_model_type
        self.character_coverage, self.byte_fallback = character_coverage, byte_fallback
        self.spm_input_sentence_size = spm_input_sentence_size
        self.user_symbols: list[str] = list(user_symbols or [])
        self.tokenizer_path = tokenizer_path
        self.cache_dir = Path(cache_dir)
        self.max_tokens = max_tokens
        self.eval_max_tokens = eval_max_tokens or max_tokens
        self.bucket_size = bucket_size
        self.max_positions, self.max_length_ratio = max_positions, max_length_ratio
        self.num_workers, self.seed, self.download = num_workers, seed, download
        self.subword_alpha = subword_alpha
        # Refused before any data is read (not once SentencePiece is trained, the corpus
        # tokenised and the first loader built, where these settings are first used).
        check_settings(
            max_tokens=max_tokens,
            eval_max_tokens=eval_max_tokens,
            bucket_size=bucket_size,
            vocab_size=vocab_size,
            max_positions=max_positions,
            max_length_ratio=max_length_ratio,
            num_workers=num_workers,
            seed=seed,
            character_coverage=character_coverage,
            user_symbols=self.user_symbols,
            pad_to_multiple_of=pad_to_multiple_of,
            stream_pool_size=stream_pool_size,
            pairs=pairs,
            pair_temperature=pair_temperature,
            hf_config=hf_config,
        )
        self.pad_to_multiple_of = pad_to_multiple_of
        if src_lang == tgt_lang and self.pairs is None:  # several pairs: for predict only
            rank_zero_warn(
                f"--data.src_lang and --data.tgt_lang are both {src_lang!r}: source and target "
                "are read from the same files (or dataset field), so the model learns to copy; "
                "set them to the corpus's two languages unless this is intended."
            )
        self.streaming = streaming
        self.stream_pool_size = stream_pool_size

        self.tokenizer: Tokenizer | None = None
        self.train_set: TokenizedDataset | PairsDataset | StreamingPairs | None = None
        self.val_set: TokenizedDataset | None = None
        """The validation set (of the first pair, with several)."""
        self.val_sets: dict[str, TokenizedDataset] = {}
        """Validation sets by key (:meth:`heldout_keys`)."""
        self.test_sets: dict[str, TokenizedDataset] = {}
        """Test sets by split name; with several pairs by ``<pair>/<split>``."""
        self.predict_set: TokenizedDataset | None = None
        self.tokenized_splits: list[str] = []
        """Splits this instance tokenised itself (not found in the cache), in order."""
        self._lengths: dict[str, Lengths] = {}
        self._train_sampler: TokenBudgetBatchSampler | None = None
        self._pending_sampler_state: dict[str, int] | None = None
        self._pending_stream_state: dict[str, Any] | None = None
        self._over_budget_warned: set[str] = set()  # splits warned about by _sampler
        # The option that sets the held-out budget, for messages.
        self._eval_budget_option = "max_tokens" if eval_max_tokens is None else "eval_max_tokens"

    # ------------------------------------------------------------------ tokenised cache
    def _tokenized(self, corpus: CorpusSplit, tokenizer: Tokenizer) -> datasets.Dataset:
        """The split as an Arrow table of ids, from the cache or freshly tokenised (see
        :func:`seq2seq.data.token_cache.cached_split`), encoded with its pair's languages."""
        training = corpus.split == self.train_split
        languages = self._languages((corpus.src_lang, corpus.tgt_lang), tokenizer)
        table, written = cached_split(
            corpus, tokenizer, self.cache_dir, self.streaming, training, languages
        )
        if written:
            self.tokenized_splits.append(corpus.split)
        return table

    # ------------------------------------------------------------------ Lightning hooks
    def prepare_data(self) -> None:
        """Downloads missing Multi30k files, trains SentencePiece, tokenises every split of
        every pair. Missing inputs are reported first, before any long work: the splits the
        stage reads (validation for ``fit``/``validate``, test sets for ``test``), for ``fit``
        also the test sets and predict file (:func:`~seq2seq.data.checks.check_inputs`), for
        ``predict`` the predict file; other held-out splits without files are skipped.

        Raises:
            FileNotFoundError: If the training split or an input the stage needs is missing.
            ValueError: If the training split is empty or SentencePiece cannot reach
                ``vocab_size`` (see :meth:`Tokenizer.train`), or a given tokenizer lacks the
                tag of a target language.
            ConnectionError: If a download fails.
        """
        trainer = getattr(self, "trainer", None)
        stage = str(trainer.state.fn.value) if trainer is not None and trainer.state.fn else None
        if stage == "predict":
            check_predict_file(self.predict_file, stage)
            if self.tokenizer is not None:
                return  # only the predict file is read, in setup()
        training = stage in ("fit", None) or self.tokenizer is None
        if self.tokenizer is None and self.tokenizer_path is None:  # this one trains it
            check_model_fits(getattr(trainer, "lightning_module", None), self.vocab_size,
                             self.max_positions)  # fmt: skip
        self._download_missing(training, stage)
        for pair in self._pairs:  # a missing split is named before long work, training's first
            if training:
                self._locate(self.train_split, pair)
            check_inputs(
                stage, self._stage_splits(stage), self.test_set_names,
                partial(self._locate, pair=pair), partial(self._fetched, pair), self.predict_file,
            )  # fmt: skip
        tokenizer = self._checked_tokenizer()
        for split, pair in itertools.product(self._all_splits(), self._pairs):
            if split == self.train_split and not training:
                continue
            try:
                corpus = self._locate(split, pair)
            except FileNotFoundError:
                if split == self.train_split:
                    raise
                continue
            if split != self.train_split or not self.streaming:
                self._tokenized(corpus, tokenizer)

    def setup(self, stage: str | None = None) -> None:
        """Loads the tokenizer and the datasets a stage needs.

        Args:
            stage: ``"fit"`` (train + val), ``"validate"``, ``"test"``, ``"predict"``, or
                None for all of them (predict only when ``predict_file`` is set).

        Raises:
            FileNotFoundError: If a needed split or the predict file is missing.
            ValueError: If the training split is empty or every training pair is filtered
                out, a held-out set is empty, or ``predict`` is run without ``predict_file``.
        """
        self.tokenizer = self._checked_tokenizer()
        if stage in ("fit", None):
            self._setup_train()
        if stage in ("fit", "validate", None):
            self.val_sets = {held.key: self._heldout(held) for held in self._plan("validate")}
            self.val_set = next(iter(self.val_sets.values()))
        if stage in ("test", None):
            self.test_sets = {
                held.key.removeprefix("test/"): self._heldout(held) for held in self._plan("test")
            }
        if stage == "predict" or (stage is None and self.predict_file is not None):
            self._setup_predict()

    def _setup_train(self) -> None:
        if self.streaming:
            world_size, rank = self._replicas()
            self.train_set = StreamingPairs(
                self._training_stream(),
                self.tokenizer,
                max_tokens=self.max_tokens,
                max_positions=self.max_positions,
                max_length_ratio=self.max_length_ratio,
                pool_size=self.stream_pool_size,
                seed=self.seed,
                num_replicas=world_size,
                rank=rank,
                bucket_size=self.bucket_size,
                subword_alpha=self.subword_alpha,
                pad_to_multiple_of=self.pad_to_multiple_of,
                chunk_size=ENCODE_CHUNK,
                languages=[self._languages(pair) for pair in self._pairs],
            )
            if self._pending_stream_state is not None:
                self.train_set.load_state_dict(self._pending_stream_state)
                self._pending_stream_state = None
            return
        parts = []
        for index, pair in enumerate(self._pairs):
            corpus = self._locate(self.train_split, pair)
            parts.append(
                training_set(
                    self._tokenized(corpus, self.tokenizer),
                    corpus.describe(),
                    self.tokenizer,
                    self.max_positions,
                    self.max_length_ratio,
                    self.subword_alpha,
                    self._languages(pair),
                    index if self.multilingual else None,
                )  # fmt: skip
            )
        if self.multilingual:
            parts = [pairs_training_set(parts, self._pairs, self.pair_temperature)]
        self.train_set, self._lengths[self.train_split] = parts[0]

    def _heldout(self, held: HeldOut) -> TokenizedDataset:
        table = self._tokenized(self._locate(held.split, held.pair), self.tokenizer)
        pair = self._pairs.index(held.pair) if self.multilingual else None
        dataset, self._lengths[held.name] = heldout_set(table, held.name, self.max_positions, pair)
        return dataset

    def _setup_predict(self) -> None:
        if self.predict_file is None:
            raise ValueError("Set `data.predict_file` to the source-language file to translate.")
        targets = sorted({tgt for _, tgt in self._pairs})
        if len(targets) > 1:  # data.tgt_lang has a default: say which direction it chose
            rank_zero_warn(
                f"the model translates into {', '.join(targets)}; predict translates "
                f"{self.src_lang}->{self.tgt_lang} (data.src_lang, data.tgt_lang): give both "
                "for another direction"
            )
        self.predict_set, self._lengths["predict"] = predict_set(
            self.predict_file, self.tokenizer, self.max_positions,
            self._languages((self.src_lang, self.tgt_lang)),
        )  # fmt: skip

    # ------------------------------------------------------------------ loaders
    def _replicas(self) -> tuple[int, int]:
        """``(world_size, global_rank)`` of the attached trainer, or ``(1, 0)``."""
        if self.trainer is None:
            return 1, 0
        return self.trainer.world_size, self.trainer.global_rank

    def _fitting(self) -> bool:
        """Whether the attached trainer is running ``fit`` (training or validating)."""
        state = getattr(self.trainer, "state", None)
        return state is not None and state.fn == "fit"

    def _fit_epoch(self) -> int | None:
        """The trainer's current epoch while fitting, else None."""
        return self.trainer.current_epoch if self._fitting() else None

    def _fit_processed(self) -> int | None:
        """The training batches the trainer has processed in all while fitting, else None."""
        if not self._fitting():
            return None
        return self.trainer.fit_loop.epoch_loop.batch_progress.total.processed

    def _loader(self, dataset: TokenizedDataset, sampler: Iterable[list[int]]) -> DataLoader:
        # A generator of its own: each new iterator draws its workers' base seed from it, not
        # from the global generator, so starting an epoch or a validation leaves the global
        # random state (dropout masks) as it was, and a resumed run draws the same masks.
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=partial(
                collate,
                pad_id=PAD_ID,
                bos_id=BOS_ID if self.tokenizer is None else self.tokenizer.bos_id,
                pad_to_multiple_of=self.pad_to_multiple_of,
            ),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _sampler(self, split: str, train: bool) -> TokenBudgetBatchSampler:
        """The batch sampler of the set ``split`` (its name in :attr:`_lengths`); over several
        pairs, each epoch's examples are drawn with the pairs' sampling probabilities."""
        costs, tie_breaker = split_costs(*self._lengths[split], self.max_positions)
        over_pairs = {}
        if train and isinstance(self.train_set, PairsDataset):
            over_pairs = {"groups": self.train_set.groups, "group_probs": self.train_set.probs}
        world_size, rank = self._replicas()
        budget = self.max_tokens if train else self.eval_max_tokens
        if split not in self._over_budget_warned:  # once per split
            self._over_budget_warned.add(split)
            option = "max_tokens" if train else self._eval_budget_option
            warning = split_over_budget(costs, budget, option, split, train, self.predict_file)
            if warning:
                rank_zero_warn(warning)
        return TokenBudgetBatchSampler(
            costs,
            budget,
            shuffle=train,
            seed=self.seed,
            num_replicas=world_size,
            rank=rank,
            bucket_size=self.bucket_size if train else None,
            even_batches=train,
            tie_breaker=tie_breaker,
            **over_pairs,
        )

    def _require(self, dataset, stage: str):
        if dataset is None:
            raise RuntimeError(f"Call setup({stage!r}) before asking for its dataloader.")
        return dataset

    def train_dataloader(self) -> DataLoader:
        """Shuffled token-budget batches of the filtered training split, this rank's share;
        under the trainer's ``overfit_batches``, the first epoch's in every epoch (Lightning
        turns off the shuffling of its own samplers only).

        With ``streaming``, a :class:`~seq2seq.data.streaming.StreamingLoader` without a
        length, whose epoch follows the trainer's (or advances after each full pass).
        """
        dataset = self._require(self.train_set, "fit")
        if isinstance(dataset, StreamingPairs):
            dataset.num_replicas, dataset.rank = self._replicas()
            return StreamingLoader(
                dataset,
                num_workers=self.num_workers,
                epoch_source=self._fit_epoch,
                processed_source=self._fit_processed,
            )
        sampler = self._sampler(self.train_split, train=True)
        if self._pending_sampler_state is not None:
            sampler.load_state_dict(self._pending_sampler_state)
            self._pending_sampler_state = None
        self._train_sampler = sampler
        overfit = getattr(self.trainer, "overfit_batches", 0)  # also for stand-in trainers
        if overfit:  # the first epoch's plan every epoch, of which Lightning takes the start
            return self._loader(dataset, list(sampler))
        return self._loader(dataset, sampler)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """Length-sorted batches of the validation split, this rank's share; with several
        pairs one loader per pair, in :meth:`heldout_keys` order."""
        dataset = self._require(self.val_set, "validate")
        if not self.multilingual:
            (held,) = self._plan("validate")  # its name: the split's, or the pair's key
            return self._loader(dataset, self._sampler(held.name, train=False))
        return [
            self._loader(self.val_sets[held.key], self._sampler(held.name, train=False))
            for held in self._plan("validate")
        ]

    def test_dataloader(self) -> list[DataLoader]:
        """One loader per test split (per pair and test split, pair-major, with several
        pairs), in :meth:`heldout_keys` order."""
        if not self.test_sets:
            self._require(None, "test")
        return [
            self._loader(self.heldout_dataset(held.key), self._sampler(held.name, train=False))
            for held in self._plan("test")
        ]

    def predict_dataloader(self) -> DataLoader:
        """Batches of ``predict_file`` (no targets); ``index`` is the 0-based line number."""
        dataset = self._require(self.predict_set, "predict")
        # Lightning warns that it cannot set drop_last on a custom batch sampler; held-out
        # samplers yield every sentence (tests/test_batching.py), so the warning is noise.
        warnings.filterwarnings("ignore", message=_CUSTOM_SAMPLER)
        return self._loader(dataset, self._sampler("predict", train=False))

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """The training position, so a run resumed mid-epoch skips the batches it has seen
        (see :mod:`seq2seq.data.resume`).

        Returns:
            ``{"batching": {...}, "data": {...}}`` (:func:`~seq2seq.data.resume.batching_settings`,
            :func:`~seq2seq.data.resume.data_record`) plus, once a position is known,
            ``"train_sampler"`` (the sampler's state) or, with streaming, ``"train_stream"``.
        """
        progress = self.trainer.fit_loop.epoch_loop.batch_progress if self._fitting() else None
        if self.streaming:
            pairs = self.train_set if isinstance(self.train_set, StreamingPairs) else None
            pending = self._pending_stream_state
            position = stream_position(pairs, pending, progress, self._fit_epoch())
        else:
            position = sampler_position(self._train_sampler, self._pending_sampler_state, progress)
        batching = batching_settings(vars(self))
        return {**position, "batching": batching, "data": data_record(self._lengths)}

    resume_refusal = staticmethod(resume_refusal)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the training position saved by :meth:`state_dict`; Lightning's warning
        that the loader "is not resumable" is silenced, as the epoch continues with the unseen
        batches. When fitting (or without a trainer), the batching settings and the data are
        first checked against the checkpoint's (the rules: :mod:`seq2seq.data.resume`).

        Raises:
            ValueError: If :func:`~seq2seq.data.resume.resume_refusal` refuses them (another
                ``data.seed`` or, streaming, ``data.stream_pool_size`` than the saved
                position's), naming the option and both values.
        """
        stream, position = state_dict.get("train_stream"), state_dict.get("train_sampler")
        if self.trainer is None or self._fitting():
            settings = batching_settings(vars(self))
            refusal = resume_refusal(state_dict, settings)
            if refusal:
                raise ValueError(refusal)
            changes = data_changes(state_dict, self._lengths, self.train_split)
            for warning in batching_differences(state_dict, settings, self.streaming) + changes:
                rank_zero_warn(warning)
        if stream or position:
            warnings.filterwarnings("ignore", message=NOT_RESUMABLE, category=PossibleUserWarning)
        if stream:
            if isinstance(self.train_set, StreamingPairs):
                self.train_set.load_state_dict(stream)
            else:
                self._pending_stream_state = dict(stream)
        if position:
            if self._train_sampler is not None:
                self._train_sampler.load_state_dict(position)
            else:
                self._pending_sampler_state = dict(position)
