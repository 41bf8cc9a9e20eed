"""Random sampling over :meth:`seq2seq.nn.Transformer.decode` with a KV cache, for
back-translation and diverse outputs (fairseq's ``--sampling``, Hugging Face's
``do_sample``), by the rules of :mod:`seq2seq.nn.rules` that the searches follow.

Sampling (:func:`sample`) draws with Gumbel-max (``argmax(log q + g)``, ``g`` standard Gumbel
noise, an exact draw from ``q``) from the filtered distribution ``q``: the step's
distribution (:mod:`seq2seq.nn.rules`: the repetition penalty and the bans applied) at
``temperature``, cut to the ``sampling_topk`` most probable tokens, then to the smallest set of
most probable tokens whose probability reaches ``sampling_topp`` (nucleus sampling, Holtzman et
al. 2020; the order of Hugging Face's processors and warpers). The noise is not drawn from a
generator: it is a counter-based hash (:func:`_mix32`) of (row seed, step, vocabulary index),
and a row's seed is a hash of the caller's ``sampling_seed``, the sentence's own source token
ids and the sample index (:func:`sentence_seeds`). A sentence's samples are therefore
reproducible and do not depend on the rest of the batch nor on its position in it (two equal
sources get equal samples; up to floating-point rounding of batched products, which could move
a log-probability across a cut or a draw). The 32-bit uniforms leave out Gumbel values beyond
about 22.9, a tail of probability ``2**-32``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from seq2seq.nn.decoding import DecodingConfig
from seq2seq.nn.ensemble import Ensemble
from seq2seq.nn.rules import Hypothesis, RowBatch, prepare_search
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
    config: DecodingConfig | None = None,
    *,
    prefix: Sequence[Sequence[int]] | None = None,
    unscored_prefix: int = 0,
    unk_id: int | None = None,
) -> list[list[Hypothesis]]:
    """Random sampling (ancestral, with top-k, nucleus and temperature; see the module
    docstring), ``n_samples`` draws per sentence, vectorised over ``batch * n_samples`` rows.

    Args:
        model, src, src_mask, bos_id, eos_id, unk_id: as
            :func:`~seq2seq.nn.search.greedy_search`.
        config: the decoding settings (``None``: the defaults), its sampling fields among them;
            ``beam_size`` and ``sampling`` are not read.
        prefix, unscored_prefix: target ids forced before sampling continues, one list per
            sentence, and how many of them are unscored (seq2seq.nn.rules).

    Returns:
        One list per sentence of ``n_samples`` hypotheses, in sample order (sample ``i`` is
        the same whatever ``n_samples``). A score is the summed log-probability of the tokens
        under the step's distribution before the sampling cuts (temperature 1, no top-k/top-p;
        the repetition penalty and the bans applied), prefix included, length-penalised.

    Raises:
        ValueError: for a malformed mask or prefix, a source longer than ``max_positions``, or
            ``disable_unk`` without ``unk_id``.
        TypeError: for a ``config`` that is no ``DecodingConfig``.
    """
    config, rules, max_len = prepare_search(
        model, src, src_mask, eos_id, config, prefix, unscored_prefix, unk_id
    )
    b, n_samples, device = src.size(0), config.n_samples, src.device
    steps = int(max_len.max())

    # Rows are sentence-major: row r is sample r % n_samples of sentence r // n_samples.
    sentence = torch.arange(b, device=device).repeat_interleave(n_samples)
    index = torch.arange(n_samples, device=device).repeat(b)
    seeds = sentence_seeds(src, src_mask, config.sampling_seed)
    row_seed = _mix32(seeds[sentence] ^ _mix32(index))
    vocab_hash = _mix32(torch.arange(model.vocab_size, device=device) ^ 0x85EBCA6B)
    memory = model.encode(src, src_mask)  # an Ensemble's: one tensor per model
    if isinstance(model, Ensemble):
        memory = [m.repeat_interleave(n_samples, dim=0) for m in memory]
    else:
        memory = memory.repeat_interleave(n_samples, dim=0)
    mask = None if src_mask is None else src_mask.repeat_interleave(n_samples, dim=0)
    cache = model.new_cache(steps)
    rows = RowBatch(max_len[sentence], mask, bos_id, model.pad_id)

    for step in range(steps):
        history = rows.history(step) if rules.needs_history else None
        lprobs = rules.log_probs(
            model, rows.tokens, memory, rows.mask, cache, step, sentence[rows.alive], history
        )
        filtered = _filter(lprobs, config.sampling_topk, config.sampling_topp, config.temperature)
        noise = _gumbel(row_seed[rows.alive], step, vocab_hash)
        tokens = (filtered + noise).max(dim=-1, keepdim=True).indices  # faster than argmax
        gained = lprobs.gather(1, tokens).squeeze(1)  # before the cuts, at temperature 1
        if rows.advance(step, tokens, gained, eos_id, cache):
            break

    found = rows.hypotheses(eos_id, config)
    return [found[i * n_samples : (i + 1) * n_samples] for i in range(b)]
