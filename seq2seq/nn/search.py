"""Greedy search and beam search over :meth:`seq2seq.nn.Transformer.decode` with a KV cache.

Both take a :class:`~seq2seq.nn.decoding.DecodingConfig` and follow the conventions of
:mod:`seq2seq.nn.rules` (lengths, EOS, scores, prefixes, n-gram blocking, repetition penalty),
which sampling (:mod:`seq2seq.nn.sampling`) shares.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from seq2seq.nn import fast
from seq2seq.nn.decoding import DecodingConfig
from seq2seq.nn.rules import (
    Hypothesis,
    RowBatch,
    decoding_config,
    length_penalty_value,
    prepare_search,
)
from seq2seq.nn.transformer import Transformer

__all__ = [
    "Hypothesis",
    "beam_search",
    "greedy_search",
    "length_penalty_value",
]


@torch.no_grad()
def greedy_search(
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
    scores: bool = True,
) -> list[list[Hypothesis]]:
    """Greedy (arg-max) decoding, by the rules of :mod:`seq2seq.nn.rules`.

    Args:
        model: the Transformer or Ensemble (the caller chooses train/eval mode).
        src: ``(B, S)`` long source ids.
        src_mask: ``(B, 1, 1, S)`` bool source mask (``True`` = real token) or ``None``.
        bos_id, eos_id, unk_id: the beginning-of-sentence id fed as first decoder input,
            the end-of-sentence id, the unknown token's id (banned by ``disable_unk``).
        config: the decoding settings (``None``: the defaults); ``beam_size`` and the sampling
            fields are not read, ``length_penalty`` only scales the reported scores.
        prefix, unscored_prefix: target ids forced first, one list per sentence (the tokens
            returned start with them), and how many of them are unscored (seq2seq.nn.rules).
        scores: compute each hypothesis' score. ``False`` skips the log-softmax normaliser of
            every step (the arg-max of the logits is the same token) and reports ``nan``
            scores, as Hugging Face's ``generate`` returns no scores unless asked.

    Returns:
        One list per sentence holding one :class:`Hypothesis`.

    Raises:
        ValueError: for a malformed mask or prefix, a source longer than ``max_positions``, or
            ``disable_unk`` without ``unk_id``.
        TypeError: for a ``config`` that is no ``DecodingConfig``.
    """
    config, rules, max_len = prepare_search(
        model, src, src_mask, eos_id, config, prefix, unscored_prefix, unk_id
    )
    steps = int(max_len.max())
    memory = model.encode(src, src_mask)
    cache = model.new_cache(steps)
    rows = RowBatch(max_len, src_mask, bos_id, model.pad_id)

    for step in range(steps):
        history = rows.history(step) if rules.needs_history else None
        step_scores = rules.log_probs(
            model, rows.tokens, memory, rows.mask, cache, step, rows.alive, history, scores
        )
        # max, not argmax: the same first index, 2-4x faster over (N, 8000) rows on CPU
        best, tokens = step_scores.max(dim=-1, keepdim=True)
        if rows.advance(step, tokens, best.squeeze(1) if scores else None, eos_id, cache):
            break

    found = rows.hypotheses(eos_id, config, scores)
    return [[hyp] for hyp in found]


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    src_mask: Tensor | None,
    bos_id: int,
    eos_id: int,
    config: DecodingConfig | None = None,
    *,
    n_best: int = 1,
    prefix: Sequence[Sequence[int]] | None = None,
    unscored_prefix: int = 0,
    unk_id: int | None = None,
) -> list[list[Hypothesis]]:
    """Beam search with length penalty over ``batch * beam_size`` rows, by the rules of
    :mod:`seq2seq.nn.rules`; the loop's comments give its steps and stopping rule (Hugging
    Face's ``early_stopping=False``). With ``beam_size == 1`` this is :func:`greedy_search`.

    Args:
        model, src, src_mask, bos_id, eos_id, unk_id: as :func:`greedy_search`.
        config: the decoding settings (``None``: the defaults); the sampling fields are not
            read.
        n_best: number of hypotheses returned per sentence (``<= beam_size``).
        prefix, unscored_prefix: target ids forced first, one list per sentence (every
            hypothesis starts with them), and how many of them are unscored (seq2seq.nn.rules).

    Returns:
        One list per sentence of ``n_best`` hypotheses, best first (fewer where the bans
        leave fewer with a finite score).

    Raises:
        ValueError: for ``beam_size > vocab_size / 2``, ``n_best`` outside ``[1, beam_size]``,
            a malformed mask or prefix, a source longer than ``max_positions``, or
            ``disable_unk`` without ``unk_id``.
        TypeError: for a ``config`` that is no ``DecodingConfig``.
    """
    k = decoding_config(config).beam_size
    if not 1 <= n_best <= k:
        raise ValueError(f"n_best must lie in [1, beam_size={k}], got {n_best}")
    if 2 * k > model.vocab_size:
        raise ValueError(f"beam_size ({k}) must be at most half of vocab_size ({model.vocab_size})")
    config, rules, max_len = prepare_search(
        model, src, src_mask, eos_id, config, prefix, unscored_prefix, unk_id
    )
    n, device = src.size(0), src.device
    steps = int(max_len.max())
    lp = length_penalty_value(
        torch.arange(steps + 1, device=device, dtype=torch.float64).clamp_min(1),
        config.length_penalty,
        config.length_penalty_form,
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
        # The next-token log-probabilities of every open beam, under the rules (bans, prefix,
        # n-grams and repetition penalty read each beam's own history). At step 0 there is one
        # row per sentence: the K beams would all be BOS.
        if step == 0:
            lprobs = rules.log_probs(model, tokens, memory, mask, cache, step, alive, None)
        else:
            history = hist[:, :, :step].reshape(a * k, step) if rules.needs_history else None
            sentence = alive.repeat_interleave(k)
            lprobs = rules.log_probs(model, tokens, memory, mask, cache, step, sentence, history)
        vocab = lprobs.size(-1)
        # Candidates: every (beam, token) extension, scored by its summed log-probability.
        if step == 0:  # expand to K beams, of which only beam 0 is live (score 0, others -inf)
            cand = beam_score.unsqueeze(-1) + lprobs.unsqueeze(1)
            # Cross-attention keys/values stay one row per sentence, which its K beams' queries
            # attend to together; so the source mask stays one row per sentence too.
            cache.expand_beams(k)
        else:  # added in place: no new (A * K, V) tensor
            cand = lprobs.view(a, k, vocab).add_(beam_score.unsqueeze(-1))
        cand = cand.view(a, k * vocab)
        # The 2K best: each beam has one EOS extension, so at most K of them end, and at least
        # K open extensions are left to refill the K beams.
        cand_score, cand_idx = fast.topk(cand, 2 * k)  # = cand.topk(2 * k, dim=-1)
        cand_beam = torch.div(cand_idx, vocab, rounding_mode="floor")
        cand_tok = cand_idx - cand_beam * vocab
        cand_hist = hist.gather(1, cand_beam.unsqueeze(-1).expand(a, 2 * k, steps))
        cand_hist[:, :, step] = cand_tok

        # An EOS candidate finishes only if it ranks among the first K (fairseq's rule): below
        # them, K open extensions beat it, so a K-beam search would never have kept it. At the
        # maximum length every one of the first K finishes, EOS or not.
        at_max = alive_max <= step + 1
        ends = (cand_tok == eos_id) | at_max.unsqueeze(1)
        finishing = ends & (positions < k) & torch.isfinite(cand_score)
        if bool(finishing.any()):
            # Merge them, length-penalised, into the sentence's K best finished hypotheses.
            new_score = torch.where(finishing, cand_score / lp[step + 1], neg_inf)
            merged_score = torch.cat([fin_score[alive], new_score], dim=1)
            merged_tokens = torch.cat([fin_tokens[alive], cand_hist], dim=1)
            merged_len = torch.cat([fin_len[alive], torch.full_like(cand_tok, step + 1)], dim=1)
            top_score, top = merged_score.topk(k, dim=1)
            fin_score[alive] = top_score
            fin_tokens[alive] = merged_tokens.gather(1, top.unsqueeze(-1).expand(a, k, steps))
            fin_len[alive] = merged_len.gather(1, top)

        # The best K candidates that do not end become the open beams. Slots carry no order,
        # so fast.py keeps each beam in its parent's slot where it can: the caches, reordered
        # to follow each beam's parent, then copy fewer rows.
        beam_score, sel = cand_score.masked_fill(ends, neg_inf).topk(k, dim=1)
        order = fast.slots_in_place(cand_beam.gather(1, sel))
        beam_score, sel = beam_score.gather(1, order), sel.gather(1, order)
        src_beam = cand_beam.gather(1, sel)
        hist = cand_hist.gather(1, sel.unsqueeze(-1).expand(a, k, steps))
        tokens = cand_tok.gather(1, sel)

        # Stopping rule: a sentence is done at its maximum length, or once it has K finished
        # hypotheses and its best open beam, scored as if it ended now, cannot beat the K-th
        # (log-probabilities only add up to less, so this is exact when length_penalty == 0).
        kth = fin_score[alive, k - 1]
        best_open = beam_score.amax(dim=1)
        done = at_max | (torch.isfinite(kth) & (best_open / lp[step + 1] <= kth))
        shrink = bool(done.any())
        if shrink:  # done sentences leave the batch, their cache rows with them
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
        # Each new beam takes its parent's cache rows (at step 0 the K rows of a sentence are
        # equal copies from expand_beams, so they move only if sentences left).
        if shrink or step > 0:
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
