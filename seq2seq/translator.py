"""Python API for translating with a trained checkpoint.

Example::

    from seq2seq.translator import Translator

    translator = Translator.from_checkpoint("checkpoints/multi30k_de_en/last.ckpt")
    translator.translate(["Ein Mann fährt Fahrrad."])  # -> ["A man is riding a bike."]
    translator.translate("Ein Mann fährt Fahrrad.")  # -> "A man is riding a bike."
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import torch

from seq2seq.checkpoint import check_model_checkpoint, load_checkpoint
from seq2seq.data.batching import collate
from seq2seq.module import (
    _NON_STRUCTURAL,
    CHECKPOINT_KEY,
    TranslationModule,
    check_decoding_settings,
)


class Translator:
    """Batched translation with a :class:`~seq2seq.module.TranslationModule`.

    Sentences are encoded with the module's SentencePiece model, sorted by length, cut into
    batches of at most ``max_tokens`` padded source tokens, decoded, and returned in input
    order. Sources longer than the model's ``max_positions`` are truncated (with a ``UserWarning``);
    a sentence with no token the model knows (empty, only spaces, or only characters outside
    the vocabulary) is translated as an empty string, scored 0.0 (``n_best`` such pairs in an
    n-best list).

    Args:
        module: a module with its tokenizer attached.
        device: where to run (``"cpu"``, ``"cuda"``, ...).
        max_tokens: padded source tokens per batch.
    """

    def __init__(
        self, module: TranslationModule, device: str | torch.device = "cpu", max_tokens: int = 4096
    ) -> None:
        if module.tokenizer is None:
            raise ValueError("the module has no tokenizer attached; load it from a checkpoint")
        self.module = module.to(device).eval()
        self.device = torch.device(device)
        self.max_tokens = max_tokens

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: str | torch.device | None = None,
        max_tokens: int = 4096,
        **decoding: Any,
    ) -> Translator:
        """Build a translator from a checkpoint alone (no data files needed).

        Args:
            path: a checkpoint written by ``seq2seq fit`` or ``seq2seq average``, or a folder
                of ``seq2seq export --format ctranslate2`` (then a
                :class:`~seq2seq.export.ctranslate2.CTranslate2Translator` is returned).
            device: ``None`` picks CUDA when available, else CPU.
            max_tokens: padded source tokens per batch.
            **decoding: overrides of decoding settings (``beam_size``, ``length_penalty``,
                ``length_penalty_form``, ``max_len_a``, ``max_len_b``, ``min_len``). The
                architecture (``d_model``, ``vocab_size``, ...) is the checkpoint's; one given
                here must equal it.

        Raises:
            FileNotFoundError: if the file does not exist.
            seq2seq.checkpoint.UnsafeCheckpointError: if it holds arbitrary pickled objects.
            seq2seq.checkpoint.CheckpointError: if it is not a checkpoint, or holds no model
                weights.
            ValueError: if it carries no tokenizer or model configuration; for an unknown
                setting in ``decoding``, an architecture setting other than the checkpoint's
                (``d_model: checkpoint 256 vs requested 64 (d_model=64 given to
                from_checkpoint)``), or a decoding setting the module refuses (e.g.
                ``model.max_len_a must be >= 0, got -1.0``).
        """
        if Path(path).is_dir():  # a folder of seq2seq export --format ctranslate2
            from seq2seq.export.ctranslate2 import CTranslate2Translator

            return CTranslate2Translator(path, device, max_tokens, **decoding)
        checkpoint = load_checkpoint(path)
        check_model_checkpoint(checkpoint, path)
        extra = checkpoint.get(CHECKPOINT_KEY, {})
        if "model_config" not in extra or "tokenizer" not in extra:
            raise ValueError(
                f"{path} carries no model configuration or tokenizer; it was not written by "
                "seq2seq (or was trained without a tokenizer attached)"
            )
        accepted = set(inspect.signature(TranslationModule.__init__).parameters) - {"self"}
        settings = {
            k: v for k, v in checkpoint.get("hyper_parameters", {}).items() if k in accepted
        }
        saved = extra["model_config"]
        settings.update(saved)
        unknown = set(decoding) - accepted
        if unknown:
            raise ValueError(f"unknown decoding settings: {sorted(unknown)}")
        # Checked here, in the caller's terms: the module's own check would speak of a config.
        differing = [
            f"{key}: checkpoint {saved[key]!r} vs requested {value!r}"
            for key, value in decoding.items()
            if key in saved and saved[key] != value and key not in _NON_STRUCTURAL
        ]
        if differing:
            given = ", ".join(f"{key}={decoding[key]!r}" for key in decoding if key in saved)
            raise ValueError(
                f"checkpoint was built with other model settings: {'; '.join(differing)} "
                f"({given} given to from_checkpoint); leave the architecture out, it is the "
                "checkpoint's"
            )
        settings.update(decoding)
        module = TranslationModule(**settings)
        module.on_load_checkpoint(checkpoint)
        module.load_state_dict(checkpoint["state_dict"])
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(module, device=device, max_tokens=max_tokens)

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
        if isinstance(sentences, bytes | bytearray):
            raise TypeError(
                f"sentences must be a str or a list of str, not {type(sentences).__name__}: "
                "decode the text first (text.decode('utf-8'))"
            )
        if isinstance(sentences, str):
            raise TypeError(
                "sentences must be a list of sentences, not a str (a string would be encoded "
                "character by character); pass a one-item list: encode([text])"
            )
        sentences = list(sentences)
        for i, sentence in enumerate(sentences):
            if not isinstance(sentence, str):
                raise TypeError(
                    f"sentences[{i}] is {type(sentence).__name__}, not a string: pass one str "
                    "per sentence ('' for an empty one)"
                )
        broken = [i for i, s in enumerate(sentences) if "\n" in s]
        if broken:
            others = len(broken) - 1
            more = f" (and {others} more {'entry' if others == 1 else 'entries'})" if others else ""
            raise ValueError(
                f"sentences[{broken[0]}]{more} holds a line break (\\n): pass one "
                "sentence per entry, e.g. text.splitlines(), not several lines in one string"
            )
        tokenizer = self.module.tokenizer
        limit = self.module.model_config["max_positions"]
        encoded, cut = [], []
        for i, ids in enumerate(tokenizer.encode(sentences)):
            if len(ids) + 1 > limit:
                cut.append((i + 1, len(ids) + 1))
                ids = ids[: limit - 1]
            encoded.append(ids + [tokenizer.eos_id])
        if len(cut) == 1:
            ((line, length),) = cut
            message = (
                f"input line {line} has {length} tokens (with EOS), more than the model's "
                f"max_positions={limit}; truncated to {limit}"
            )
        elif cut:
            line, length = max(cut, key=lambda c: c[1])
            lines = ", ".join(str(c[0]) for c in cut[:10]) + (", ..." if len(cut) > 10 else "")
            message = (
                f"{len(cut)} input lines (lines {lines}) have more than the model's "
                f"max_positions={limit} tokens (with EOS); truncated to {limit} (longest: line "
                f"{line}, {length} tokens)"
            )
        if cut:
            warnings.warn(message, UserWarning, stacklevel=3)
        return encoded

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
        **decoding: Any,
    ) -> str | list[tuple[str, float]] | list[str] | list[list[tuple[str, float]]]:
        """Translate one sentence, or a list of sentences keeping their order.

        Args:
            sentences: one source sentence (a ``str``), or a list (any sequence) of them, one
                per entry; newlines inside a sentence are not allowed.
            beam_size: ``None`` uses the module's ``beam_size``; 1 is greedy search.
            n_best: with 1, return one string per sentence; with more, a list of
                ``(text, score)`` pairs per sentence, best first (the score is the
                length-penalised log-probability; a sentence with no token the model knows
                gets ``n_best`` pairs ``("", 0.0)``).
            return_scores: with ``n_best`` 1, return a one-pair list ``[(text, score)]`` per
                sentence instead of the string.
            **decoding: this call's ``length_penalty``, ``length_penalty_form``,
                ``max_len_a``, ``max_len_b`` or ``min_len`` (default: the checkpoint's, or those
                given to :meth:`from_checkpoint`), as ``generate`` keyword arguments of a
                Hugging Face pipeline.

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
                holds a line break ...``), if ``n_best`` exceeds the beam size, or for an
                unknown or out-of-range decoding setting.
        """
        check_decoding_settings(decoding)  # also when there is nothing to translate
        single = isinstance(sentences, str)
        if single:
            if "\n" in sentences:
                raise ValueError(
                    "the sentence holds a line break (\\n): translate one sentence per call, "
                    "or several as a list, e.g. translate(text.splitlines())"
                )
            sentences = [sentences]
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
            batch = collate(
                [{"index": i, "src": encoded[i]} for i in chunk],
                pad_id=self.module.tokenizer.pad_id,
            )
            batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            hyps = self.module.translate_batch(
                batch, beam_size=beam_size, n_best=n_best, **decoding
            )
            for i, h in zip(chunk, hyps, strict=True):
                results[i] = h[0][0] if n_best == 1 and not return_scores else h
            start = end
        return results[0] if single else results
