"""The rules that greedy search, beam search and sampling share, stated once.

:func:`~seq2seq.nn.search.greedy_search`, :func:`~seq2seq.nn.search.beam_search` and
:func:`~seq2seq.nn.sampling.sample` take a :class:`~seq2seq.nn.decoding.DecodingConfig` (its
fields say what each setting means) and follow these conventions. Shapes as in
:mod:`seq2seq.nn.attention`; ``N`` is the number of decoder rows (``B`` sentences, ``B * K``
beams or ``B * n_samples`` draws).

* Rows. A search is batched and vectorised over its ``N`` rows: the step loop has no Python
  loop over sentences. Finished sentences leave the batch at once, with their cache rows
  (:class:`RowBatch`), and the loop stops as soon as every sentence is finished.
* Length. ``max_len = min(int(max_len_a * src_len + max_len_b), max_positions)`` per
  sentence, with ``src_len`` its unpadded length, at least 1 (:func:`max_lengths`). A
  hypothesis holds at most ``max_len`` tokens; one that reaches it without EOS is finished
  there.
* End. A hypothesis ends at its first EOS, which is never extended. EOS is banned while fewer
  than ``min_len`` tokens have been generated (the maximum length wins over ``min_len``). The
  padding token is never generated.
* Score. The length is the number of generated tokens, EOS included; the score is the summed
  token log-probability divided by :func:`length_penalty_value` of the length.
* Independence. The output of a sentence does not depend on the rest of the batch nor on its
  padding (up to floating-point rounding of batched matrix products).
* ``prefix`` (optional): one list of target ids per sentence (possibly empty). While a
  hypothesis is inside its sentence's prefix every other token is banned, so the search goes
  on after the prefix. Prefix tokens count as generated: the returned tokens start with them,
  the score includes their log-probabilities, they are part of the history that the n-gram
  ban and the repetition penalty read, and ``max_len`` is at least ``len(prefix) + 1``. The
  first ``unscored_prefix`` tokens of every prefix (a target-language token such as NLLB's)
  are forced with log-probability 0 instead, as Hugging Face's ``forced_bos_token_id`` forces
  them: they count in the length but not in the score.
* ``no_repeat_ngram_size = n``: a token that would complete an n-gram already in the
  hypothesis (its prefix included, BOS not) is banned, as fairseq's
  ``--no-repeat-ngram-size`` and Hugging Face's ``no_repeat_ngram_size``. Should that ban
  every token of a row, EOS stays allowed, even before ``min_len``.
* ``repetition_penalty`` (the field documents which tokens it counts and how the engines
  differ): each row is penalised by its own history (each beam by its own), on the logits,
  before the log-softmax; the log-probabilities, hence the choices and the scores, are those
  of the penalised distribution. An :class:`~seq2seq.nn.Ensemble` penalises each model's
  logits before that model's log-softmax, so an ensemble of one model decodes as that model.
* ``disable_unk``: the unknown token (the caller's ``unk_id``) is banned as the padding token
  is, after the log-softmax, so the scores of the other tokens are unchanged; inside a prefix
  the forced token wins, so a prefix may hold it.

One step (:meth:`StepRules.log_probs`): the decoder's logits, the repetition penalty, one
float32 log-softmax, then the bans (padding, an early EOS, the unknown token, repeated n-grams,
every token but the forced one inside a prefix), set to ``-inf`` after the softmax.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.nn.decoding import DecodingConfig
from seq2seq.nn.ensemble import Ensemble
from seq2seq.nn.kv_cache import DecoderCache
from seq2seq.nn.transformer import Transformer

__all__ = [
    "Hypothesis",
    "RowBatch",
    "StepRules",
    "check_mask",
    "decoding_config",
    "hypotheses",
    "length_penalty_value",
    "max_lengths",
    "prepare_search",
    "penalise_repetitions",
]


@dataclass
class Hypothesis:
    """One translation.

    Attributes:
        tokens: generated token ids, without BOS and EOS.
        score: length-penalised log-probability used for ranking.
    """

    tokens: list[int]
    score: float


def decoding_config(config: DecodingConfig | None) -> DecodingConfig:
    """``config``, or the defaults for ``None``.

    Raises:
        TypeError: for anything else (a search's settings are one ``DecodingConfig``).
    """
    if config is None:
        return DecodingConfig()
    if not isinstance(config, DecodingConfig):
        raise TypeError(
            f"config must be a seq2seq.nn.DecodingConfig or None, got {type(config).__name__}"
        )
    return config


def length_penalty_value(
    length: Tensor | float, alpha: float, form: str = "fairseq"
) -> Tensor | float:
    """Length penalty ``lp(len)`` that scores are divided by.

    Args:
        length: hypothesis length(s), EOS included.
        alpha: exponent (``0`` disables the penalty).
        form: ``"fairseq"`` -> ``len ** alpha``; ``"gnmt"`` -> ``((5 + len) / 6) ** alpha``
            (Wu et al. 2016, Eq. 14).

    Raises:
        ValueError: for an unknown form.
    """
    if form == "fairseq":
        return length**alpha
    if form == "gnmt":
        return ((5 + length) / 6) ** alpha
    raise ValueError(f"length_penalty_form must be 'fairseq' or 'gnmt', got {form!r}")


def check_mask(src: Tensor, src_mask: Tensor | None) -> None:
    """Raises ValueError unless ``src_mask`` is ``None`` or ``(B, 1, 1, S)`` for ``(B, S)``
    ``src``."""
    if src_mask is not None and src_mask.shape != (src.size(0), 1, 1, src.size(1)):
        raise ValueError(
            f"src_mask must have shape (B, 1, 1, S) = {(src.size(0), 1, 1, src.size(1))}, "
            f"got {tuple(src_mask.shape)}"
        )


def max_lengths(
    model: Transformer, src: Tensor, src_mask: Tensor | None, config: DecodingConfig
) -> Tensor:
    """``(B,)`` long ``max_len`` of each sentence (before a prefix raises it)."""
    if src_mask is None:
        src_len = torch.full((src.size(0),), src.size(1), device=src.device)
    else:
        src_len = src_mask.reshape(src.size(0), -1).sum(-1)
    max_len = config.max_len_a * src_len.double() + config.max_len_b
    return max_len.long().clamp(1, model.max_positions)


def prepare_search(
    model: Transformer | Ensemble,
    src: Tensor,
    src_mask: Tensor | None,
    eos_id: int,
    config: DecodingConfig | None,
    prefix: Sequence[Sequence[int]] | None,
    unscored_prefix: int,
    unk_id: int | None,
) -> tuple[DecodingConfig, StepRules, Tensor]:
    """What every search does first, with its arguments: the settings (``None``: the
    defaults) and the mask checked, the :class:`StepRules` of the ``B`` sentences, and each
    sentence's ``(B,)`` long maximum length, a prefix's raise included.

    Raises:
        ValueError, TypeError: as :func:`check_mask`, :func:`decoding_config` and
            :class:`StepRules` raise them.
    """
    config = decoding_config(config)
    check_mask(src, src_mask)
    rules = StepRules(
        model, config, prefix, src.size(0), eos_id, src.device, unscored_prefix, unk_id
    )
    return config, rules, rules.max_lengths(max_lengths(model, src, src_mask, config))


def penalise_repetitions(logits: Tensor, history: Tensor, penalty: float) -> Tensor:
    """``(N, V)`` logits with those of the ids in ``history`` ``(N, T)`` long divided by
    ``penalty`` where positive, multiplied by it where negative, once per id however often it
    occurs (duplicate ids scatter the same value); vectorised over rows (gather, scatter).
    Half-precision logits are promoted to float32 first; others are changed in place."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    seen = logits.gather(1, history)
    return logits.scatter_(1, history, torch.where(seen > 0, seen / penalty, seen * penalty))


def _penalise_last(logits: Tensor, history: Tensor, penalty: float) -> Tensor:
    """:func:`penalise_repetitions` of one cached step's ``(N, 1, V)`` logits."""
    return penalise_repetitions(logits[:, -1], history, penalty).unsqueeze(1)


def hypotheses(
    out: Tensor, out_len: Tensor, out_score: Tensor | None, eos_id: int, config: DecodingConfig
) -> list[Hypothesis]:
    """One :class:`Hypothesis` per row of ``(N, T)`` long tokens ``out`` (EOS cut), of
    ``(N,)`` lengths and ``(N,)`` summed log-probabilities (``None``: ``nan`` scores),
    scored with the length penalty."""
    if out_score is None:
        final = [float("nan")] * out.size(0)
    else:
        lp = length_penalty_value(
            out_len.double(), config.length_penalty, config.length_penalty_form
        )
        final = (out_score.double() / lp).tolist()
    results = []
    for row, length, score in zip(out.tolist(), out_len.tolist(), final, strict=True):
        tokens = row[:length]
        if tokens and tokens[-1] == eos_id:
            tokens = tokens[:-1]
        results.append(Hypothesis(tokens, score))
    return results


class RowBatch:
    """The rows of a search that extends every row by one token a step (greedy search,
    sampling): the rows still in the batch, and the tokens, lengths and summed
    log-probabilities of all rows.

    A row is finished at its first EOS or at its maximum length; its length and score are
    recorded then, and it leaves the batch at once, with its mask and cache rows.

    Args:
        max_len: ``(N,)`` long maximum length of each row.
        src_mask: ``(N, 1, 1, S)`` bool source mask of the rows, or ``None``.
        bos_id, pad_id: the first input token of every row; the filler of :attr:`out`.

    Attributes:
        alive: ``(N',)`` long: the original row of each row in the batch.
        tokens: ``(N', 1)`` long: each row's last token, the next step's input.
        mask: the source mask of the rows in the batch, or ``None``.
        out: ``(N, max_len.max())`` long tokens of every original row.
    """

    def __init__(self, max_len: Tensor, src_mask: Tensor | None, bos_id: int, pad_id: int):
        n, device = max_len.numel(), max_len.device
        self.out = torch.full((n, int(max_len.max())), pad_id, dtype=torch.long, device=device)
        self.length = torch.zeros(n, dtype=torch.long, device=device)
        self.total = torch.zeros(n, dtype=torch.float32, device=device)
        self.alive = torch.arange(n, device=device)
        self.tokens = torch.full((n, 1), bos_id, dtype=torch.long, device=device)
        self.mask = src_mask
        self._max_len = max_len
        self._score = torch.zeros(n, dtype=torch.float32, device=device)

    def history(self, step: int) -> Tensor:
        """``(N', step)`` long tokens of the rows in the batch so far."""
        return self.out[self.alive, :step]

    def advance(
        self, step: int, tokens: Tensor, gained: Tensor | None, eos_id: int, cache: DecoderCache
    ) -> bool:
        """Append step ``step``'s ``(N', 1)`` long ``tokens`` and add their ``(N',)`` float32
        log-probabilities ``gained`` (``None``: no scores) to the rows' scores; record the rows
        that finish, and remove them from the batch and ``cache``.

        Returns:
            Whether every row has finished.
        """
        if gained is not None:
            self._score += gained
        token = tokens.squeeze(1)
        self.out[self.alive, step] = token
        self.tokens = tokens
        done = (token == eos_id) | (self._max_len <= step + 1)
        if not bool(done.any()):
            return False
        ended = self.alive[done]
        self.length[ended] = step + 1
        self.total[ended] = self._score[done]
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() == 0:
            return True
        self.alive, self._max_len, self._score, self.tokens = (
            self.alive[keep],
            self._max_len[keep],
            self._score[keep],
            self.tokens[keep],
        )
        self.mask = self.mask.index_select(0, keep) if self.mask is not None else None
        cache.reorder(keep, include_cross=True)
        return False

    def hypotheses(self, eos_id: int, config: DecodingConfig, scores: bool = True):
        """:func:`hypotheses` of every original row (``scores=False``: ``nan`` scores)."""
        return hypotheses(self.out, self.length, self.total if scores else None, eos_id, config)


class StepRules:
    """What a step of one search may choose (see the module docstring): padding, early-EOS and
    unknown-token bans, forced prefixes, n-gram blocking and the repetition penalty.

    Args:
        model: the Transformer or Ensemble (``vocab_size``, ``pad_id``, ``max_positions``).
        config: the decoding settings.
        prefix: one list of target ids per sentence (``B`` lists), or ``None``.
        n: number of sentences ``B``.
        eos_id: end-of-sentence id (never forced; left allowed when a ban leaves nothing).
        device: where the search runs.
        unscored_prefix: leading prefix tokens forced with log-probability 0 (module
            docstring).
        unk_id: the unknown token's id, banned with ``config.disable_unk`` (required then).

    Raises:
        ValueError: for a prefix list of another length than ``B``, a prefix holding EOS,
            padding or an id outside the vocabulary, or one of ``max_positions`` tokens or more;
            for ``disable_unk`` without an ``unk_id`` in the vocabulary.
    """

    def __init__(
        self,
        model: Transformer,
        config: DecodingConfig,
        prefix: Sequence[Sequence[int]] | None,
        n: int,
        eos_id: int,
        device: torch.device,
        unscored_prefix: int = 0,
        unk_id: int | None = None,
    ) -> None:
        self.pad_id = model.pad_id
        self.unk_id = unk_id if config.disable_unk else None
        if config.disable_unk and not (unk_id is not None and 0 <= unk_id < model.vocab_size):
            raise ValueError(
                f"disable_unk needs the unknown token's id in [0, {model.vocab_size}), "
                f"got unk_id={unk_id}"
            )
        self.unscored = unscored_prefix
        self.eos_id = eos_id
        self.min_len = config.min_len
        self.ngram = config.no_repeat_ngram_size
        self.penalty = float(config.repetition_penalty)
        self.longest = 0  # the longest prefix; (B, longest) ids and (B,) lengths of them:
        self.prefix_tokens: Tensor | None = None
        self.prefix_lengths: Tensor | None = None
        if prefix is None:
            return
        if len(prefix) != n:
            raise ValueError(
                f"prefix must hold one token list per sentence ({n}), got {len(prefix)}"
            )
        for i, ids in enumerate(prefix):
            bad = [t for t in ids if t in (eos_id, model.pad_id) or not 0 <= t < model.vocab_size]
            if bad:
                raise ValueError(
                    f"prefix[{i}] holds id {bad[0]}: a prefix cannot force EOS, padding or an "
                    f"id outside the vocabulary (0..{model.vocab_size - 1})"
                )
            if len(ids) >= model.max_positions:
                raise ValueError(
                    f"prefix[{i}] has {len(ids)} tokens; at most max_positions - 1 = "
                    f"{model.max_positions - 1} fit with the EOS after them"
                )
        self.longest = max((len(ids) for ids in prefix), default=0)
        tokens = torch.full((n, max(self.longest, 1)), model.pad_id, dtype=torch.long)
        for i, ids in enumerate(prefix):
            tokens[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        self.prefix_tokens = tokens.to(device)
        self.prefix_lengths = torch.tensor([len(ids) for ids in prefix], device=device)

    def max_lengths(self, max_len: Tensor) -> Tensor:
        """``(B,)`` maximum lengths raised to at least ``len(prefix) + 1``."""
        return torch.maximum(max_len, self.prefix_lengths + 1) if self.longest else max_len

    @property
    def needs_history(self) -> bool:
        """Whether :meth:`log_probs` reads the rows' earlier tokens."""
        return self.ngram > 0 or self.penalty != 1.0

    def log_probs(
        self,
        model: Transformer | Ensemble,
        tokens: Tensor,
        memory,
        src_mask: Tensor | None,
        cache: DecoderCache,
        step: int,
        sentence: Tensor,
        history: Tensor | None,
        normalise: bool = True,
    ) -> Tensor:
        """One cached decoding step: float32 ``(N, V)`` log-probabilities under every rule.

        Args:
            model, tokens, memory, src_mask, cache: as :meth:`Transformer.decode` takes them
                (``tokens`` ``(N, 1)``: each row's last token).
            step: 0-based index of the token being chosen.
            sentence: ``(N,)`` long: the sentence (``0..B-1``) of each row.
            history: ``(N, step)`` long tokens of each row so far (when :attr:`needs_history`).
            normalise: ``False`` skips the log-softmax: the logits (dtype of the computation)
                with the same rules, hence the same arg-max.

        Returns:
            A fresh tensor, which the caller may update in place.
        """
        if self.penalty != 1.0 and step > 0:
            process = functools.partial(_penalise_last, history=history, penalty=self.penalty)
            if isinstance(model, Ensemble):  # each model's logits, before its log-softmax
                logits = model.decode(tokens, memory, src_mask, cache, process=process)
            else:
                logits = process(model.decode(tokens, memory, src_mask, cache))
        else:
            logits = model.decode(tokens, memory, src_mask, cache)
        scores = logits[:, -1]
        if normalise:
            scores = torch.log_softmax(scores, dim=-1, dtype=torch.float32)
        scores[:, self.pad_id] = float("-inf")
        self._constrain(scores, step, sentence, history)
        return scores

    def _constrain(self, scores: Tensor, step: int, sentence: Tensor, history) -> None:
        """The early-EOS, unknown-token and n-gram bans and the prefix, in place on
        ``scores`` ``(N, V)``."""
        forcing = step < self.longest
        if forcing:
            forced = (self.prefix_lengths[sentence] > step).unsqueeze(1)
            token = self.prefix_tokens[sentence, step].unsqueeze(1)
            value = scores.gather(1, token)  # before the bans: the prefix wins
            if step < self.unscored:  # chosen by the caller, not the model: not scored
                value = torch.zeros_like(value)
        if self.unk_id is not None:
            scores[:, self.unk_id] = float("-inf")
        ngram = self.ngram and history is not None and history.size(1) >= self.ngram
        if ngram:  # EOS before any ban: a row the bans leave nothing may still end
            eos = scores[:, self.eos_id].clone()
        if step < self.min_len:
            scores[:, self.eos_id] = float("-inf")
        if ngram:
            _ban_repeated_ngrams(scores, history, self.ngram)
            nothing = torch.isneginf(scores).all(dim=1)
            scores[:, self.eos_id] = torch.where(nothing, eos, scores[:, self.eos_id])
        if forcing:
            scores.masked_fill_(forced, float("-inf"))
            scores.scatter_(1, token, torch.where(forced, value, scores.gather(1, token)))


def _ban_repeated_ngrams(scores: Tensor, history: Tensor, n: int) -> None:
    """Sets to ``-inf`` in ``scores`` ``(N, V)`` every token that would complete an ``n``-gram
    already in its row of ``history`` ``(N, T)`` (``T >= n``); vectorised over rows and
    n-grams (``unfold``), as fairseq's ``NGramRepeatBlock``."""
    t, vocab = history.size(1), scores.size(1)
    windows = history.unfold(1, n, 1)  # (N, T - n + 1, n): every n-gram so far
    tail = history[:, t - n + 1 :]  # the n - 1 last tokens, which the next token extends
    match = (windows[:, :, :-1] == tail.unsqueeze(1)).all(dim=-1)
    # Non-matching n-grams point at an extra column, dropped: scatter needs no mask then.
    banned = torch.where(match, windows[:, :, -1], vocab)
    ban = torch.zeros(scores.size(0), vocab + 1, dtype=torch.bool, device=scores.device)
    ban.scatter_(1, banned, True)
    scores.masked_fill_(ban[:, :vocab], float("-inf"))
