"""Random sampling over :meth:`seq2seq.nn.Transformer.decode` with a KV cache, for
back-translation and diverse outputs (fairseq's ``--sampling``, Hugging Face's
``do_sample``), with the conventions of :mod:`seq2seq.nn.search` (lengths, ``min_len``,
``prefix``, ``no_repeat_ngram_size``, scores).

Sampling (:func:`sample`) draws with Gumbel-max (``argmax(log q + g)``, ``g`` standard Gumbel
noise, an exact draw from ``q``) from the filtered distribution ``q``: the model's
distribution at ``temperature``, cut to the ``sampling_topk`` most probable tokens, then to the
smallest set of most probable tokens whose probability reaches ``sampling_topp`` (nucleus
sampling, Holtzman et al. 2020; the order of Hugging Face's warpers). The noise is not drawn
from a generator: it is a counter-based hash (:func:`_mix32`) of (row seed, step, vocabulary
index), and a row's seed is a hash of the caller's ``seed``, the sentence's own source token
ids and the sample index. A sentence's samples are therefore reproducible and do not depend on
the rest of the batch nor on its position in it (two equal sources get equal samples).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from seq2seq.nn.search import (
    Hypothesis,
    _check,
    _Constraints,
    _max_lengths,
    _step_log_probs,
    length_penalty_value,
)
from seq2seq.nn.transformer import Transformer

__all__ = ["sample", "sentence_seeds"]

_MASK32 = 0xFFFFFFFF


def _mul32(x: Tensor, m: int) -> Tensor:
    """``x * m mod 2**32`` for int64 ``x`` in ``[0, 2**32)``, in 16-bit halves of ``m`` so
    that no int64 product overflows."""
    low, high = m & 0xFFFF, m >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    """A bijective 32-bit integer hash (``lowbias32`` of Chris Wellons' hash-prospector) of
    int64 values in ``[0, 2**32)``, elementwise."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def sentence_seeds(src: Tensor, src_mask: Tensor | None, seed: int) -> Tensor:
    """Per-sentence sampling seeds: a hash of ``seed`` and the sentence's own source ids.

    Args:
        src: ``(B, S)`` long source ids.
        src_mask: ``(B, 1, 1, S)`` bool (``True`` = real token) or ``None`` (all real).
        seed: any integer (taken modulo ``2**64``).

    Returns:
        ``(B,)`` int64 seeds in ``[0, 2**32)``; padding does not change them.
    """
    seed %= 2**64
    start = _mix32(torch.tensor(seed & _MASK32)) ^ (seed >> 32)
    h = _mix32(start).to(src.device).expand(src.size(0)).clone()
    real = None if src_mask is None else src_mask.reshape(src.size(0), -1)
    for j in range(src.size(1)):
        mixed = _mix32(h ^ _mix32(src[:, j] & _MASK32))
        h = mixed if real is None else torch.where(real[:, j], mixed, h)
    return h


def _gumbel(row_seed: Tensor, step: int, vocab_hash: Tensor) -> Tensor:
    """``(N, V)`` float32 standard Gumbel noise, a function of (row seed, step, vocabulary
    index) only: ``-log(-log(u))`` with ``u = (hash + 0.5) / 2**32``."""
    key = _mix32(row_seed ^ _mix32(torch.tensor(step + 0x9E3779B9, device=row_seed.device)))
    h = _mix32(key.unsqueeze(1) ^ vocab_hash)
    u = (h.double() + 0.5) * 2.0**-32
    return (-torch.log(-torch.log(u))).float()


def _filter(scores: Tensor, topk: int, topp: float, temperature: float) -> Tensor:
    """``(N, V)`` log-probabilities of the sampling distribution up to a constant per row: at
    ``temperature``, cut to the ``topk`` most probable tokens (0 = all; ties at the cut kept),
    then to the smallest set of most probable tokens whose probability reaches ``topp``
    (always at least one)."""
    if temperature != 1.0:
        scores = scores / temperature
    if 0 < topk < scores.size(1):
        kth = scores.topk(topk, dim=1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if topp < 1.0:
        probs, order = torch.softmax(scores, dim=1).sort(dim=1, descending=True, stable=True)
        before = probs.cumsum(dim=1) - probs  # mass of the more probable tokens
        drop = before >= topp
        drop[:, 0] = False
        scores = scores.masked_fill(torch.zeros_like(drop).scatter_(1, order, drop), float("-inf"))
    return scores


@torch.no_grad()
def sample(
    model: Transformer,
    src: Tensor,
    src_mask: Tensor | None,
    bos_id: int,
    eos_id: int,
    n_samples: int = 1,
    sampling_topk: int = 0,
    sampling_topp: float = 1.0,
    temperature: float = 1.0,
    seed: int = 0,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 0,
    length_penalty: float = 1.0,
    length_penalty_form: str = "fairseq",
    prefix: Sequence[Sequence[int]] | None = None,
    no_repeat_ngram_size: int = 0,
) -> list[list[Hypothesis]]:
    """Random sampling (ancestral, with top-k, nucleus and temperature), ``n_samples`` draws
    per sentence, vectorised over ``batch * n_samples`` rows.

    Each step draws the next token with Gumbel-max from the filtered distribution (see the
    module docstring): ``temperature`` first, then top-k, then top-p (Holtzman et al. 2020,
    "The Curious Case of Neural Text Degeneration", as Hugging Face's ``TopKLogitsWarper`` and
    ``TopPLogitsWarper``). The noise is a hash of (row seed, step, vocabulary index), the row
    seed a hash of ``seed``, the sentence's source ids (:func:`sentence_seeds`) and the sample
    index: the same call gives the same samples, and a sentence's samples do not depend on
    the other sentences of the batch nor on its position (up to floating-point rounding of
    batched products, which could move a log-probability across a cut or a draw). The 32-bit
    uniforms leave out Gumbel values beyond about 22.9, a tail of probability ``2**-32``.

    Args:
        model: the Transformer (the caller chooses train/eval mode).
        src: ``(B, S)`` long source ids.
        src_mask: ``(B, 1, 1, S)`` bool source mask (``True`` = real token) or ``None``.
        bos_id: beginning-of-sentence id fed as first decoder input.
        eos_id: end-of-sentence id.
        n_samples: draws per sentence (``>= 1``).
        sampling_topk: keep the ``k`` most probable tokens (0 = off).
        sampling_topp: keep the smallest set of most probable tokens whose probability
            reaches ``p``, in ``(0, 1]`` (1 = off).
        temperature: divides the log-probabilities before the cuts (``> 0``; below 1 sharper,
            above 1 flatter).
        seed: any integer; the same seed gives the same samples.
        max_len_a: ``a`` in ``max_len = a * src_len + b``.
        max_len_b: ``b`` in ``max_len = a * src_len + b``.
        min_len: EOS is forbidden before this many tokens.
        length_penalty: ``alpha`` of the length penalty that divides the reported score.
        length_penalty_form: ``"fairseq"`` or ``"gnmt"``, see :func:`length_penalty_value`.
        prefix: one list of target ids per sentence, forced before sampling continues.
        no_repeat_ngram_size: ban tokens that would repeat an n-gram of this size (0 = off).

    Returns:
        One list per sentence of ``n_samples`` hypotheses, in sample order (sample ``i`` is
        the same whatever ``n_samples``). A score is the summed log-probability of the tokens
        under the model's own distribution (temperature 1, no top-k/top-p cut; padding and a
        too early EOS banned), prefix included, divided by the length penalty.

    Raises:
        ValueError: for ``n_samples < 1``, ``sampling_topk < 0``, ``sampling_topp`` outside
            ``(0, 1]``, ``temperature <= 0``, a malformed mask or prefix, an unknown
            length-penalty form, or a negative ``no_repeat_ngram_size``.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if sampling_topk < 0:
        raise ValueError(f"sampling_topk must be >= 0 (0 = off), got {sampling_topk}")
    if not 0.0 < sampling_topp <= 1.0:
        raise ValueError(f"sampling_topp must lie in (0, 1] (1 = off), got {sampling_topp}")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    _check(model, src, src_mask)
    length_penalty_value(1.0, length_penalty, length_penalty_form)
    b = src.size(0)
    device = src.device
    rules = _Constraints(model, prefix, no_repeat_ngram_size, b, eos_id, device)
    max_len = rules.max_lengths(_max_lengths(model, src, src_mask, max_len_a, max_len_b))
    steps = int(max_len.max())

    # Rows are sentence-major: row r is sample r % n_samples of sentence r // n_samples.
    n = b * n_samples
    sentence = torch.arange(b, device=device).repeat_interleave(n_samples)
    index = torch.arange(n_samples, device=device).repeat(b)
    row_seed = _mix32(sentence_seeds(src, src_mask, seed)[sentence] ^ _mix32(index))
    vocab_hash = _mix32(torch.arange(model.vocab_size, device=device) ^ 0x85EBCA6B)
    memory = model.encode(src, src_mask).repeat_interleave(n_samples, dim=0)
    mask = None if src_mask is None else src_mask.repeat_interleave(n_samples, dim=0)
    cache = model.new_cache(steps)

    out = torch.full((n, steps), model.pad_id, dtype=torch.long, device=device)
    out_len = torch.zeros(n, dtype=torch.long, device=device)
    out_score = torch.zeros(n, dtype=torch.float32, device=device)
    alive = torch.arange(n, device=device)  # original row of each row
    alive_max = max_len[sentence]
    score = torch.zeros(n, dtype=torch.float32, device=device)
    tokens = src.new_full((n, 1), bos_id)

    for step in range(steps):
        lprobs = _step_log_probs(model, tokens, memory, mask, cache, step, eos_id, min_len)
        history = out[alive, :step] if rules.needs_history else None
        rules.apply(lprobs, step, sentence[alive], history)
        filtered = _filter(lprobs, sampling_topk, sampling_topp, temperature)
        noise = _gumbel(row_seed[alive], step, vocab_hash)
        tokens = (filtered + noise).argmax(dim=-1, keepdim=True)
        score += lprobs.gather(1, tokens).squeeze(1)  # the model's own log-probability
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
    final = (out_score.double() / lp).tolist()
    rows, lens = out.tolist(), out_len.tolist()
    results: list[list[Hypothesis]] = [[] for _ in range(b)]
    for r, (row, length, sc) in enumerate(zip(rows, lens, final, strict=True)):
        toks = row[:length]
        if toks and toks[-1] == eos_id:
            toks = toks[:-1]
        results[r // n_samples].append(Hypothesis(toks, sc))
    return results
