"""What :class:`~seq2seq.data.datamodule.TranslationDataModule` checks before it spends
compute: its numeric settings when it is built, and the inputs a stage reads before
SentencePiece is trained or a split tokenised."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from seq2seq.data.corpus import CorpusSplit
from seq2seq.data.pairs import parse_pairs
from seq2seq.data.spm_errors import SPM_CHARACTER_COVERAGE
from seq2seq.data.tokenizer import MIN_VOCAB_SIZE
from seq2seq.data.user_symbols import check_user_symbols


def check_settings(
    *,
    max_tokens: int,
    eval_max_tokens: int | None,
    bucket_size: int | None,
    vocab_size: int,
    max_positions: int,
    max_length_ratio: float,
    num_workers: int,
    seed: int,
    character_coverage: float,
    pad_to_multiple_of: int,
    stream_pool_size: int,
    pairs: Sequence[str] | None = None,
    pair_temperature: float = 1.0,
    hf_config: str | None = None,
    user_symbols: Sequence[str] = (),
) -> None:
    """Raises ``ValueError`` for the first ``data.*`` setting out of its range, naming it
    (``data.bucket_size must be >= 1 or null, got 0.``): ``max_tokens``, ``eval_max_tokens``,
    ``bucket_size``, ``pad_to_multiple_of`` and ``stream_pool_size`` below 1, ``vocab_size``
    below 5, ``max_positions`` below 2, ``max_length_ratio`` below 1, ``num_workers`` or
    ``seed`` below 0, ``character_coverage`` outside [0.98, 1], ``pairs`` as
    :func:`~seq2seq.data.pairs.parse_pairs` refuses them, ``pair_temperature`` not above 0;
    with several pairs also an ``hf_config`` naming one pair (``"de-en"``: every pair reads
    the same dataset); ``user_symbols`` as :func:`~.user_symbols.check_user_symbols` refuses
    them."""
    for name, value in (("max_tokens", max_tokens), ("eval_max_tokens", eval_max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"data.{name} must be >= 1, got {value}.")
    if bucket_size is not None and bucket_size < 1:
        raise ValueError(f"data.bucket_size must be >= 1 or null, got {bucket_size}.")
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"data.vocab_size must be > {MIN_VOCAB_SIZE - 1}, got {vocab_size}: the "
            "vocabulary holds the 4 special pieces (pad, unk, bos, eos) and at least one "
            "piece per character of the training corpus."
        )
    if max_positions < 2:
        raise ValueError(
            f"data.max_positions must be >= 2, got {max_positions}: a sequence holds at "
            "least one token and its EOS (or BOS)."
        )
    if not max_length_ratio >= 1:  # the ratio of the longer side to the shorter one
        raise ValueError(f"data.max_length_ratio must be >= 1, got {max_length_ratio}.")
    for name, value in (("num_workers", num_workers), ("seed", seed)):
        if value < 0:
            raise ValueError(f"data.{name} must be >= 0, got {value}.")
    low, high = SPM_CHARACTER_COVERAGE
    if not low <= character_coverage <= high:
        raise ValueError(
            f"data.character_coverage must be in [{low}, {high}] (SentencePiece's range), "
            f"got {character_coverage}."
        )
    check_user_symbols(user_symbols)
    if pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}.")
    if stream_pool_size < 1:
        raise ValueError(f"stream_pool_size must be >= 1, got {stream_pool_size}.")
    several = len(parse_pairs(pairs)) > 1
    if not pair_temperature > 0:
        raise ValueError(f"data.pair_temperature must be > 0, got {pair_temperature}.")
    if several and hf_config is not None and hf_config.count("-") == 1:
        raise ValueError(
            f"data.hf_config {hf_config!r} holds one language pair, but data.pairs has several: "
            "with data.hf_dataset every pair reads the same dataset, its languages as fields; "
            "set data.hf_config to a configuration with every language, or null."
        )


def check_inputs(
    stage: str | None,
    held_out: Sequence[str],
    test_splits: Sequence[str],
    locate: Callable[[str], CorpusSplit],
    fetched: Callable[[str], bool],
    predict_file: str | None,
) -> None:
    """Raises for a missing input of ``stage``, so that a typo in the config fails before
    training rather than after it, and for a held-out or test split in text, TSV or JSONL
    whose files are misaligned or hold a malformed line (read to their end here, before
    SentencePiece is trained: held-out sets are small).

    Args:
        stage: the Lightning stage (``"fit"``, ``"test"``, ...) or None.
        held_out: the held-out splits the stage reads; each must be found.
        test_splits: the test splits; for ``fit``, each must be found unless ``fetched``.
        locate: finds a split by name (raises ``FileNotFoundError`` if it is missing).
        fetched: whether the Multi30k download brings a missing split when ``test`` runs.
        predict_file: for ``fit``, a file that must exist unless None.

    Raises:
        FileNotFoundError: naming the missing split or file.
        ValueError: as :meth:`~seq2seq.data.corpus.CorpusSplit.iter_chunks`, naming the file.
    """
    for split in held_out:
        _read_through(locate(split))
    if stage != "fit":
        return
    for split in test_splits:
        try:
            _read_through(locate(split))
        except FileNotFoundError:
            if not fetched(split):
                raise
    check_predict_file(predict_file, stage)


def check_predict_file(predict_file: str | None, stage: str | None) -> None:
    """Raises FileNotFoundError naming ``data.predict_file`` when it is set but names no file
    (``fit`` reads it at the end, ``predict`` first: both check it before any work)."""
    if predict_file is not None and not Path(predict_file).is_file():
        what = "is not a file" if Path(predict_file).exists() else "does not exist"
        fix = " or set --data.predict_file null to train without it" if stage == "fit" else ""
        raise FileNotFoundError(f"data.predict_file {predict_file} {what}; fix the path{fix}.")


def _read_through(corpus: CorpusSplit) -> None:
    """Reads a split in text, TSV or JSONL to its end (other formats hold no lines to
    misalign)."""
    if corpus.format in ("text", "tsv", "jsonl"):
        for _ in corpus.iter_chunks():
            pass


def check_model_fits(module: object, vocab_size: int, max_positions: int) -> None:
    """Raises ``ValueError`` if the model that ``module`` (the trainer's LightningModule, or
    ``None``) trains has another ``vocab_size`` than the data module's, or a smaller
    ``max_positions``: from Python the two are set apart (the command line links them), and
    the mismatch is found here, before SentencePiece is trained or a split tokenised, not after."""
    config = getattr(module, "config", None)
    model_vocab = getattr(config, "vocab_size", None)
    if model_vocab is not None and model_vocab != vocab_size:
        raise ValueError(
            f"the model's vocab_size is {model_vocab} but the data module's is {vocab_size}: "
            "the SentencePiece model must have as many pieces as the model's embeddings; give "
            "TranslationModule and TranslationDataModule the same vocab_size"
        )
    model_positions = getattr(config, "max_positions", None)
    if model_positions is not None and model_positions < max_positions:
        raise ValueError(
            f"the model's max_positions is {model_positions} but the data module's is "
            f"{max_positions}: batches would hold longer sequences than the model accepts; give "
            "TranslationDataModule a max_positions of at most the model's"
        )
