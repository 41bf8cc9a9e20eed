"""Greedy search and beam search over :meth:`seq2seq.nn.Transformer.decode` with a KV cache,
and the conventions that sampling (:mod:`seq2seq.nn.sampling`) shares.

The searches are batched and vectorised over ``batch * beam`` (or ``batch * n_samples``) rows:
the step loop has no Python loop over sentences. Sentences that are finished are dropped from
the batch (their cache rows are removed), and the loop stops as soon as every sentence is
finished.

Conventions shared by greedy search, beam search and sampling:

* ``max_len = min(int(max_len_a * src_len + max_len_b), max_positions)`` per sentence, with
  ``src_len`` its unpadded length (at least 1). A hypothesis holds at most ``max_len`` tokens;
  one that reaches it without EOS is finished there.
* A hypothesis ends at its first EOS, which is never extended. ``min_len``: EOS is forbidden
  while fewer than ``min_len`` tokens have been generated. The padding token is never generated.
* Length: the number of generated tokens, EOS included. Score: the summed token log-probability
  divided by the length penalty ``lp(len)``: ``len ** alpha`` (``"fairseq"``) or
  ``((5 + len) / 6) ** alpha`` (``"gnmt"``, Wu et al. 2016, Eq. 14).
* The output of a sentence does not depend on the rest of the batch nor on its padding (up to
  floating-point rounding of batched matrix products).
* ``prefix`` (optional): one list of target token ids per sentence (possibly empty). While a
  hypothesis is inside its sentence's prefix, every other token is banned, so the search
  continues after the prefix. The returned tokens start with the prefix, the score includes
  the prefix tokens' log-probabilities, and ``max_len`` is at least ``len(prefix) + 1``.
* ``no_repeat_ngram_size = n`` (0 = off): a token that would complete an n-gram already present
  in the hypothesis (its prefix included, BOS not) is banned, as fairseq's
  ``--no-repeat-ngram-size`` and Hugging Face's ``no_repeat_ngram_size``. Should that ban every
  token of a row, EOS stays allowed.

Sampling (:func:`seq2seq.nn.sampling.sample`) shares these conventions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.nn import fast
from seq2seq.nn.kv_cache import DecoderCache
from seq2seq.nn.transformer import Transformer

__all__ = [
    "Hypothesis",
    "beam_search",
    "greedy_search",
    "length_penalty_value",
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


def length_penalty_value(length: Tensor | float, alpha: float, form: str = "fairseq"):
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


def _max_lengths(model: Transformer, src: Tensor, src_mask: Tensor | None, a: float, b: int):
    if src_mask is None:
        src_len = torch.full((src.size(0),), src.size(1), device=src.device)
    else:
        src_len = src_mask.reshape(src.size(0), -1).sum(-1)
    max_len = (a * src_len.double() + b).long().clamp(1, model.max_positions)
    return max_len


def _step_log_probs(
    model: Transformer,
    tokens: Tensor,
    memory: Tensor,
    src_mask: Tensor | None,
    cache: DecoderCache,
    step: int,
    eos_id: int,
    min_len: int,
    normalise: bool = True,
) -> Tensor:
    """float32 ``(N, V)`` next-token log-probabilities, with pad (and too early EOS) banned.

    One fused log-softmax pass reads the logits in their own dtype and writes float32; the bans
    are applied in place on that fresh tensor, which the caller may also update in place.
    ``normalise=False`` returns the logits (dtype of the computation) with the same bans: the
    same arg-max, without the log-softmax pass.
    """
    scores = model.decode(tokens, memory, src_mask, cache)[:, -1]
    if normalise:
        scores = torch.log_softmax(scores, dim=-1, dtype=torch.float32)
    scores[:, model.pad_id] = float("-inf")
    if step < min_len:
        scores[:, eos_id] = float("-inf")
    return scores


def _check(model: Transformer, src: Tensor, src_mask: Tensor | None) -> None:
    if src_mask is not None and src_mask.shape != (src.size(0), 1, 1, src.size(1)):
        raise ValueError(
            f"src_mask must have shape (B, 1, 1, S) = {(src.size(0), 1, 1, src.size(1))}, "
            f"got {tuple(src_mask.shape)}"
        )


class _Constraints:
    """Forced target prefixes and n-gram blocking for the rows of one search.

    Args:
        model: the Transformer (its ``vocab_size``, ``pad_id``, ``max_positions``).
        prefix: one list of target ids per sentence (``B`` lists), or ``None``.
        no_repeat_ngram_size: ``n`` of the n-gram ban (0 = off).
        n: number of sentences ``B``.
        eos_id: end-of-sentence id (never forced; left allowed when a ban leaves nothing).
        device: where the search runs.

    Raises:
        ValueError: for a prefix list of another length than ``B``, a prefix holding EOS,
            padding or an id outside the vocabulary, a prefix of ``max_positions`` tokens or
            more, or a negative ``no_repeat_ngram_size``.
    """

    def __init__(self, model, prefix, no_repeat_ngram_size, n, eos_id, device) -> None:
        if no_repeat_ngram_size < 0:
            raise ValueError(f"no_repeat_ngram_size must be >= 0, got {no_repeat_ngram_size}")
        self.ngram = int(no_repeat_ngram_size)
        self.eos_id = eos_id
        self.longest = 0
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
        self.tokens = torch.full((n, max(self.longest, 1)), model.pad_id, dtype=torch.long)
        for i, ids in enumerate(prefix):
            self.tokens[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        self.tokens = self.tokens.to(device)
        self.lengths = torch.tensor([len(ids) for ids in prefix], device=device)

    def max_lengths(self, max_len: Tensor) -> Tensor:
        """``(B,)`` maximum lengths raised to at least ``len(prefix) + 1``."""
        return torch.maximum(max_len, self.lengths + 1) if self.longest else max_len

    @property
    def needs_history(self) -> bool:
        """Whether :meth:`apply` reads the rows' earlier tokens."""
        return self.ngram > 0

    def apply(self, scores: Tensor, step: int, sentence: Tensor, history: Tensor | None) -> None:
        """Bans, in place on ``scores`` ``(N, V)``, the tokens that ``step`` may not take.

        Args:
            scores: log-probabilities (or logits) of the ``N`` rows.
            step: 0-based index of the token being chosen.
            sentence: ``(N,)`` long: the sentence (``0..B-1``) of each row.
            history: ``(N, step)`` long tokens of each row so far (when :attr:`needs_history`).
        """
        forcing = step < self.longest
        if forcing:
            forced = (self.lengths[sentence] > step).unsqueeze(1)
            token = self.tokens[sentence, step].unsqueeze(1)
            value = scores.gather(1, token)  # before the n-gram ban: the prefix wins
        if self.ngram and history is not None and history.size(1) >= self.ngram:
            eos = scores[:, self.eos_id].clone()
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


@torch.no_grad()
def greedy_search(
    model: Transformer,
    src: Tensor,
    src_mask: Tensor | None,
    bos_id: int,
    eos_id: int,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 0,
    length_penalty: float = 1.0,
    length_penalty_form: str = "fairseq",
    scores: bool = True,
    prefix: Sequence[Sequence[int]] | None = None,
    no_repeat_ngram_size: int = 0,
) -> list[list[Hypothesis]]:
    """Greedy (arg-max) decoding.

    Args:
        model: the Transformer (the caller chooses train/eval mode).
        src: ``(B, S)`` long source ids.
        src_mask: ``(B, 1, 1, S)`` bool source mask (``True`` = real token) or ``None``.
        bos_id: beginning-of-sentence id fed as first decoder input.
        eos_id: end-of-sentence id.
        max_len_a: ``a`` in ``max_len = a * src_len + b``.
        max_len_b: ``b`` in ``max_len = a * src_len + b``.
        min_len: EOS is forbidden before this many tokens.
        length_penalty: ``alpha`` used for the reported score only (ranking is trivial).
        length_penalty_form: ``"fairseq"`` or ``"gnmt"``, see :func:`length_penalty_value`.
        scores: compute each hypothesis' score. ``False`` skips the log-softmax normaliser of
            every step (the arg-max of the logits is the same token) and reports ``nan``
            scores, as Hugging Face's ``generate`` returns no scores unless asked.
        prefix: one list of target ids per sentence, forced before the search continues
            (see the module docstring); the tokens returned start with it.
        no_repeat_ngram_size: ban tokens that would repeat an n-gram of this size (0 = off).

    Returns:
        One list per sentence holding one :class:`Hypothesis`.

    Raises:
        ValueError: for a malformed mask, an unknown length-penalty form, a source longer
            than ``max_positions``, a malformed prefix or a negative ``no_repeat_ngram_size``.
    """
    _check(model, src, src_mask)
    length_penalty_value(1.0, length_penalty, length_penalty_form)
    n = src.size(0)
    device = src.device
    rules = _Constraints(model, prefix, no_repeat_ngram_size, n, eos_id, device)
    max_len = rules.max_lengths(_max_lengths(model, src, src_mask, max_len_a, max_len_b))
    steps = int(max_len.max())
    memory = model.encode(src, src_mask)
    cache = model.new_cache(steps)

    out = torch.full((n, steps), model.pad_id, dtype=torch.long, device=device)
    out_len = torch.zeros(n, dtype=torch.long, device=device)
    out_score = torch.zeros(n, dtype=torch.float32, device=device)
    alive = torch.arange(n, device=device)  # original sentence id of each row
    alive_max = max_len
    score = torch.zeros(n, dtype=torch.float32, device=device)
    tokens = src.new_full((n, 1), bos_id)
    mask = src_mask

    for step in range(steps):
        step_scores = _step_log_probs(
            model, tokens, memory, mask, cache, step, eos_id, min_len, normalise=scores
        )
        rules.apply(step_scores, step, alive, out[alive, :step] if rules.needs_history else None)
        tokens = step_scores.argmax(dim=-1, keepdim=True)
        if scores:
            score += step_scores.gather(1, tokens).squeeze(1)
        out[alive, step] = tokens.squeeze(1)
        done = (tokens.squeeze(1) == eos_id) | (alive_max <= step + 1)
        if bool(done.any()):
            ids = alive[done]
            out_len[ids] = step + 1
            out_score[ids] = score[done]
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            alive, alive_max, score, tokens = (
                alive[keep],
                alive_max[keep],
                score[keep],
                tokens[keep],
            )
            mask = mask.index_select(0, keep) if mask is not None else None
            cache.reorder(keep, include_cross=True)

    lp = length_penalty_value(out_len.double(), length_penalty, length_penalty_form)
    final = (out_score.double() / lp).tolist() if scores else [float("nan")] * n
    rows, lens = out.tolist(), out_len.tolist()
    results = []
    for row, length, sc in zip(rows, lens, final, strict=True):
        toks = row[:length]
        if toks and toks[-1] == eos_id:
            toks = toks[:-1]
        results.append([Hypothesis(toks, sc)])
    return results


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    src_mask: Tensor | None,
    bos_id: int,
    eos_id: int,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    length_penalty_form: str = "fairseq",
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 0,
    n_best: int = 1,
    prefix: Sequence[Sequence[int]] | None = None,
    no_repeat_ngram_size: int = 0,
) -> list[list[Hypothesis]]:
    """Beam search with length penalty, vectorised over ``batch * beam`` rows.

    Each step ranks, per sentence, the ``2 * beam_size`` best extensions of its open beams by
    summed log-probability. EOS extensions ranked among the first ``beam_size`` finish a
    hypothesis, scored with the length penalty (at the maximum length every extension among the
    first ``beam_size`` finishes); the best ``beam_size`` other extensions stay open. Each
    sentence keeps its ``beam_size`` best finished hypotheses. A sentence is done when it has
    ``beam_size`` finished hypotheses and no open hypothesis, scored as if it ended at its
    current length, beats the ``beam_size``-th finished one (the stopping rule of Hugging Face's
    ``early_stopping=False``; log-probabilities only decrease, so this is exact when
    ``length_penalty == 0``), or when it reaches its maximum length. With ``beam_size == 1`` this
    reproduces :func:`greedy_search`.

    Cross-attention keys/values are computed once per sentence at the first step (from a batch
    of ``B`` rows, before beams exist) and stay one row per sentence: the ``beam_size`` queries
    of a sentence attend to them together (see ``DecoderCache.expand_beams``); beam reordering
    only touches the self-attention caches.

    Args:
        model: the Transformer (the caller chooses train/eval mode).
        src: ``(B, S)`` long source ids.
        src_mask: ``(B, 1, 1, S)`` bool source mask (``True`` = real token) or ``None``.
        bos_id: beginning-of-sentence id fed as first decoder input.
        eos_id: end-of-sentence id.
        beam_size: number of beams ``K`` per sentence.
        length_penalty: exponent ``alpha`` of the length penalty.
        length_penalty_form: ``"fairseq"`` (``len ** alpha``) or ``"gnmt"``
            (``((5 + len) / 6) ** alpha``).
        max_len_a: ``a`` in ``max_len = a * src_len + b``.
        max_len_b: ``b`` in ``max_len = a * src_len + b``.
        min_len: EOS is forbidden before this many tokens.
        n_best: number of hypotheses returned per sentence (``<= beam_size``).
        prefix: one list of target ids per sentence, forced before the search continues
            (see the module docstring); every hypothesis returned starts with it.
        no_repeat_ngram_size: ban tokens that would repeat an n-gram of this size within a
            hypothesis (0 = off).

    Returns:
        One list per sentence of ``n_best`` hypotheses, best first.

    Raises:
        ValueError: for ``beam_size < 1`` or ``> vocab_size / 2``, ``n_best`` outside
            ``[1, beam_size]``, an unknown length-penalty form, a malformed mask, a source
            longer than ``max_positions``, a malformed prefix or a negative
            ``no_repeat_ngram_size``.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must lie in [1, beam_size={beam_size}], got {n_best}")
    if 2 * beam_size > model.vocab_size:
        raise ValueError(
            f"beam_size ({beam_size}) must be at most half of vocab_size ({model.vocab_size})"
        )
    _check(model, src, src_mask)
    length_penalty_value(1.0, length_penalty, length_penalty_form)
    k = beam_size
    n = src.size(0)
    device = src.device
    rules = _Constraints(model, prefix, no_repeat_ngram_size, n, eos_id, device)
    max_len = rules.max_lengths(_max_lengths(model, src, src_mask, max_len_a, max_len_b))
    steps = int(max_len.max())
    lp = length_penalty_value(
        torch.arange(steps + 1, device=device, dtype=torch.float64).clamp_min(1),
        length_penalty,
        length_penalty_form,
    ).float()
    neg_inf = float("-inf")

    memory = model.encode(src, src_mask)
    cache = model.new_cache(steps)

    # Finished hypotheses per sentence (all B sentences), best first.
    fin_score = torch.full((n, k), neg_inf, device=device)
    fin_tokens = torch.full((n, k, steps), model.pad_id, dtype=torch.long, device=device)
    fin_len = torch.zeros((n, k), dtype=torch.long, device=device)

    # Open beams of the alive sentences: (A, K) views over A * K decoder rows.
    alive = torch.arange(n, device=device)
    alive_max = max_len
    hist = torch.full((n, k, steps), model.pad_id, dtype=torch.long, device=device)
    beam_score = torch.full((n, k), neg_inf, device=device)
    beam_score[:, 0] = 0.0
    mask = src_mask
    tokens = src.new_full((n, 1), bos_id)
    positions = torch.arange(2 * k, device=device)

    for step in range(steps):
        a = alive.numel()
        lprobs = _step_log_probs(model, tokens, memory, mask, cache, step, eos_id, min_len)
        vocab = lprobs.size(-1)
        if step == 0:
            rules.apply(lprobs, step, alive, None)
        else:
            history = hist[:, :, :step].reshape(a * k, step) if rules.needs_history else None
            rules.apply(lprobs, step, alive.repeat_interleave(k), history)
        if step == 0:  # one row per sentence so far: expand to K beams (only beam 0 is live)
            cand = beam_score.unsqueeze(-1) + lprobs.unsqueeze(1)
            cache.expand_beams(k)  # the source mask stays one row per sentence
        else:  # summed log-probability, added in place (no new (A * K, V) tensor)
            cand = lprobs.view(a, k, vocab).add_(beam_score.unsqueeze(-1))
        cand = cand.view(a, k * vocab)
        cand_score, cand_idx = fast.topk(cand, 2 * k)  # = cand.topk(2 * k, dim=-1)
        cand_beam = torch.div(cand_idx, vocab, rounding_mode="floor")
        cand_tok = cand_idx - cand_beam * vocab
        cand_hist = hist.gather(1, cand_beam.unsqueeze(-1).expand(a, 2 * k, steps))
        cand_hist[:, :, step] = cand_tok

        # EOS among the first K candidates (any of them at the maximum length) finishes.
        at_max = alive_max <= step + 1
        ends = (cand_tok == eos_id) | at_max.unsqueeze(1)
        finishing = ends & (positions < k) & torch.isfinite(cand_score)
        if bool(finishing.any()):
            new_score = torch.where(finishing, cand_score / lp[step + 1], neg_inf)
            merged_score = torch.cat([fin_score[alive], new_score], dim=1)
            merged_tokens = torch.cat([fin_tokens[alive], cand_hist], dim=1)
            merged_len = torch.cat([fin_len[alive], torch.full_like(cand_tok, step + 1)], dim=1)
            top_score, top = merged_score.topk(k, dim=1)
            fin_score[alive] = top_score
            fin_tokens[alive] = merged_tokens.gather(1, top.unsqueeze(-1).expand(a, k, steps))
            fin_len[alive] = merged_len.gather(1, top)

        # The best K other candidates stay open (in any order of the K slots: fast.py keeps
        # each in its parent's slot where possible, so the caches copy fewer rows).
        beam_score, sel = cand_score.masked_fill(ends, neg_inf).topk(k, dim=1)
        order = fast.slots_in_place(cand_beam.gather(1, sel))
        beam_score, sel = beam_score.gather(1, order), sel.gather(1, order)
        src_beam = cand_beam.gather(1, sel)
        hist = cand_hist.gather(1, sel.unsqueeze(-1).expand(a, k, steps))
        tokens = cand_tok.gather(1, sel)

        kth = fin_score[alive, k - 1]
        best_open = beam_score.amax(dim=1)
        done = at_max | (torch.isfinite(kth) & (best_open / lp[step + 1] <= kth))
        shrink = bool(done.any())
        if shrink:
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            alive, alive_max = alive[keep], alive_max[keep]
            beam_score, hist, src_beam, tokens = (
                beam_score[keep],
                hist[keep],
                src_beam[keep],
                tokens[keep],
            )
        else:
            keep = torch.arange(a, device=device)
        if shrink or step > 0:  # after the first step, the K rows of a sentence are equal
            rows = (keep.unsqueeze(1) * k + src_beam).view(-1)
            cache.reorder(rows, include_cross=shrink)
        if shrink and mask is not None:
            mask = mask.index_select(0, keep)
        tokens = tokens.view(-1, 1)

    scores, lens, toks = fin_score.tolist(), fin_len.tolist(), fin_tokens.tolist()
    results = []
    for s_row, l_row, t_row in zip(scores, lens, toks, strict=True):
        hyps = []
        for sc, length, tk in zip(s_row, l_row, t_row, strict=True):
            if sc == neg_inf or len(hyps) == n_best:
                continue
            tk = tk[:length]
            if tk and tk[-1] == eos_id:
                tk = tk[:-1]
            hyps.append(Hypothesis(tk, sc))
        results.append(hyps)
    return results
