"""Sampling, forced target prefixes and n-gram blocking in the model's search."""

from __future__ import annotations

import math

import pytest
import torch

from seq2seq.nn import DecodingConfig, Transformer, beam_search, greedy_search, padding_mask, sample
from seq2seq.nn.rules import length_penalty_value

PAD, BOS, EOS = 0, 2, 3
V = 14


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> Transformer:
    """A float64 model trained briefly on copying: confident but imperfect, so samples vary."""
    torch.manual_seed(0)
    m = Transformer(
        vocab_size=V, d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=64,
        dropout=0.0, max_positions=40,
    )  # fmt: skip
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        lens = torch.randint(2, 9, (32,), generator=g)
        src = torch.randint(4, V, (32, int(lens.max())), generator=g)
        src = src.masked_fill(torch.arange(src.size(1)) >= lens[:, None], PAD)
        tgt = torch.cat([src, torch.full((32, 1), PAD)], dim=1)
        tgt[torch.arange(32), lens] = EOS
        dec_in = torch.cat([torch.full((32, 1), BOS), tgt[:, :-1]], 1).masked_fill(tgt == PAD, PAD)
        logits = m(src, dec_in, padding_mask(src, PAD))
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt, ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.double().eval()


@pytest.fixture(scope="module")
def sources() -> torch.Tensor:
    return torch.tensor([[5, 6, 7, 8, 9, 10, 11], [12, 4, 5, 0, 0, 0, 0], [7, 7, 13, 9, 6, 0, 0]])


@torch.no_grad()
def _lprobs(model, src_row, seq, penalty: float = 1.0) -> torch.Tensor:
    """Plain forward (no cache): float64 ``(len(seq) + 1, V)`` log-probabilities after BOS and
    each token of ``seq``, the padding token banned after the softmax as the search does; with
    ``penalty``, position ``j``'s logits of the ids in ``seq[:j]`` are divided by it where
    positive and multiplied where negative, each id once, before the softmax."""
    src = src_row[src_row != PAD][None]
    logits = model(src, torch.tensor([[BOS, *seq]]), padding_mask(src, PAD))[0].double()
    for j in range(len(seq) + 1):
        for t in set(seq[:j]):
            value = logits[j, t]
            logits[j, t] = value / penalty if value > 0 else value * penalty
    lprobs = torch.log_softmax(logits, dim=-1)
    lprobs[:, PAD] = float("-inf")
    return lprobs


def _repeats(tokens: list[int], n: int) -> bool:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def test_top_k_one_equals_greedy(model, sources):
    mask = padding_mask(sources, PAD)
    cases = [
        ({}, None), ({"min_len": 4}, None), ({"no_repeat_ngram_size": 2}, [[9], [], [4, 4]]),
        ({"repetition_penalty": 1.5, "no_repeat_ngram_size": 3}, [[9], [], [4, 4]]),
        ({"disable_unk": True}, None),
    ]  # fmt: skip
    for settings, prefix in cases:
        config = DecodingConfig(**settings)
        forced = {"prefix": prefix, "unk_id": 7}  # 7 stands for the unknown token
        greedy = greedy_search(model, sources, mask, BOS, EOS, config, **forced)
        drawn = config.replace(n_samples=3, sampling_topk=1, sampling_seed=5, temperature=2.0)
        sampled = sample(model, sources, mask, BOS, EOS, drawn, **forced)
        for (g,), draws in zip(greedy, sampled, strict=True):
            assert [h.tokens for h in draws] == [g.tokens] * 3
            assert draws[0].score == pytest.approx(g.score, abs=1e-5)


def test_samples_are_reproducible_and_do_not_depend_on_the_batch(model, sources):
    mask = padding_mask(sources, PAD)

    def draw(src, m, seed=7):
        config = DecodingConfig(n_samples=6, temperature=1.5, sampling_seed=seed)
        return sample(model, src, m, BOS, EOS, config)

    together = draw(sources, mask)
    assert draw(sources, mask) == together
    texts = [[h.tokens for h in hyps] for hyps in together]
    assert any(len({tuple(t) for t in row}) > 1 for row in texts)  # the draws vary
    assert [[h.tokens for h in hyps] for hyps in draw(sources, mask, seed=8)] != texts
    for i in range(sources.size(0)):
        length = int(mask[i].sum())
        alone = draw(sources[i : i + 1, :length], None)
        # at another position of another batch, with more padding
        other = torch.cat([sources.flip(0), sources[i : i + 1]], 0)
        other = torch.cat([other, torch.zeros(other.size(0), 3, dtype=torch.long)], 1)
        moved = draw(other, padding_mask(other, PAD))[-1]
        for hyps in (alone[0], moved):
            assert [h.tokens for h in hyps] == texts[i]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in together[i]])
    # sample i is the same whatever n_samples
    config = DecodingConfig(n_samples=2, temperature=1.5, sampling_seed=7)
    fewer = sample(model, sources, mask, BOS, EOS, config)
    assert [[h.tokens for h in hyps] for hyps in fewer] == [row[:2] for row in texts]


@pytest.mark.parametrize(("alpha", "form"), [(1.0, "fairseq"), (0.6, "gnmt")])
def test_sample_scores_are_the_models_log_probs(model, sources, alpha, form):
    mask = padding_mask(sources, PAD)
    config = DecodingConfig(
        n_samples=4, sampling_topp=0.8, temperature=1.7, length_penalty=alpha,
        length_penalty_form=form,
    )  # fmt: skip
    results = sample(model, sources, mask, BOS, EOS, config)
    for i, hyps in enumerate(results):
        max_len = int(1.2 * int(mask[i].sum()) + 10)
        for hyp in hyps:
            seq = hyp.tokens + ([EOS] if len(hyp.tokens) < max_len else [])
            lprobs = _lprobs(model, sources[i], seq[:-1])
            total = lprobs[torch.arange(len(seq)), torch.tensor(seq)].sum().item()
            expected = total / length_penalty_value(float(len(seq)), alpha, form)
            assert hyp.score == pytest.approx(expected, abs=1e-4)


def _expected(probs: torch.Tensor, topk: int, topp: float) -> torch.Tensor:
    """The renormalised top-k then top-p distribution, written plainly, one token at a time."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i].item())
    kept = order[:topk] if topk else order
    mass = sum(probs[i].item() for i in kept)
    nucleus, reached = [], 0.0
    for i in kept:
        if nucleus and reached >= topp:
            break
        nucleus.append(i)
        reached += probs[i].item() / mass
    out = torch.zeros_like(probs)
    out[nucleus] = probs[nucleus]
    return out / out.sum()


@pytest.mark.parametrize(
    ("topk", "topp", "temperature"),
    [(0, 1.0, 1.0), (4, 1.0, 1.0), (0, 0.7, 1.0), (5, 0.8, 1.0), (0, 1.0, 0.5), (0, 0.9, 2.5)],
)
def test_token_frequencies_follow_the_filtered_distribution(model, topk, topp, temperature):
    src = torch.tensor([[9, 5, 12, 6]])
    n = 20_000
    config = DecodingConfig(
        n_samples=n, sampling_topk=topk, sampling_topp=topp, temperature=temperature,
        max_len_a=0.0, max_len_b=1, sampling_seed=3,
    )  # fmt: skip
    draws = sample(model, src, None, BOS, EOS, config)[0]
    counts = torch.bincount(
        torch.tensor([h.tokens[0] if h.tokens else EOS for h in draws]), None, V
    )
    lprobs = _lprobs(model, src[0], [])[0]
    probs = torch.softmax(lprobs / temperature, dim=-1)
    expected = _expected(probs, topk, topp)
    support = expected > 0
    assert int(support.sum()) >= 2  # the cut leaves a choice
    if (topk, topp) != (0, 1.0):
        assert int(support.sum()) < int((probs > 1e-6).sum())
    assert int(counts[~support].sum()) == 0
    observed = counts[support].double()
    exp = expected[support] * n
    chi2 = float(((observed - exp) ** 2 / exp).sum())
    dof = int(support.sum()) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * dof), (chi2, dof)
    if temperature != 1.0:  # the plain distribution would be far off
        plain = _expected(torch.softmax(lprobs, dim=-1), topk, topp)[support] * n
        assert float(((observed - plain) ** 2 / plain).sum()) > 10 * (dof + 6 * math.sqrt(2 * dof))


def _plain_greedy(model, src_row, prefix, max_len, ngram=0, penalty=1.0):
    """Greedy decoding by full recomputation (no cache): the prefix forced, then arg-max."""
    seq: list[int] = []
    while len(seq) < max_len:
        lprobs = _lprobs(model, src_row, seq, penalty)[-1]
        if len(seq) < len(prefix):
            seq.append(prefix[len(seq)])
            continue
        if ngram and len(seq) >= ngram:
            for j in range(len(seq) - ngram + 1):
                if seq[j : j + ngram - 1] == seq[len(seq) - ngram + 1 :]:
                    lprobs[seq[j + ngram - 1]] = float("-inf")
        seq.append(int(lprobs.argmax()))
        if seq[-1] == EOS:
            break
    return seq


def test_a_forced_prefix_is_kept_and_greedy_continues_as_plain_decoding(model, sources):
    mask = padding_mask(sources, PAD)
    prefix = [[13, 13, 4], [], [6]]
    short = DecodingConfig(max_len_a=0.0, max_len_b=2)
    results = greedy_search(model, sources, mask, BOS, EOS, short, prefix=prefix)
    for i, ((hyp,), forced) in enumerate(zip(results, prefix, strict=True)):
        assert hyp.tokens[: len(forced)] == forced
        assert len(hyp.tokens) >= len(forced)  # max_len is at least len(prefix) + 1
        expected = _plain_greedy(model, sources[i], forced, max(2, len(forced) + 1))
        assert hyp.tokens == [t for t in expected if t != EOS]
        seq = expected
        lprobs = _lprobs(model, sources[i], seq[:-1])
        total = lprobs[torch.arange(len(seq)), torch.tensor(seq)].sum().item()
        assert hyp.score == pytest.approx(total / len(seq), abs=1e-6)  # the prefix included
    full = greedy_search(model, sources, mask, BOS, EOS, prefix=prefix)
    for i, ((hyp,), forced) in enumerate(zip(full, prefix, strict=True)):
        max_len = int(1.2 * int(mask[i].sum()) + 10)
        assert hyp.tokens == [
            t for t in _plain_greedy(model, sources[i], forced, max_len) if t != EOS
        ]
    # an unconstrained greedy output differs from the forced ones, so the test can fail
    plain = greedy_search(model, sources, mask, BOS, EOS)
    assert plain[0][0].tokens[:3] != prefix[0]


def test_unscored_prefix_tokens_count_in_the_length_but_not_in_the_score(model, sources):
    """``unscored_prefix=1``: the first prefix token (a target-language token) is forced with
    log-probability 0, as generate's forced_bos_token_id; the same tokens come out."""
    mask = padding_mask(sources, PAD)
    prefix = [[13, 4], [6], [12, 5]]
    short = DecodingConfig(max_len_a=0.0, max_len_b=4)
    scored = greedy_search(model, sources, mask, BOS, EOS, short, prefix=prefix)
    free = greedy_search(model, sources, mask, BOS, EOS, short, prefix=prefix, unscored_prefix=1)
    for i, ((a,), (b,), forced) in enumerate(zip(scored, free, prefix, strict=True)):
        assert a.tokens == b.tokens and a.tokens[: len(forced)] == forced
        seq = a.tokens + ([EOS] if len(a.tokens) < max(4, len(forced) + 1) else [])
        first = _lprobs(model, sources[i], [])[0, forced[0]].item()
        assert b.score == pytest.approx(a.score - first / len(seq), abs=1e-5)
    beams = [
        beam_search(
            model,
            sources,
            mask,
            BOS,
            EOS,
            DecodingConfig(beam_size=3),
            prefix=prefix,
            unscored_prefix=k,
        )  # fmt: skip
        for k in (0, 1)
    ]
    assert all(h[0].score > g[0].score for g, h in zip(*beams, strict=True))


def test_beam_and_sampling_with_a_prefix_start_with_it(model, sources):
    mask = padding_mask(sources, PAD)
    prefix = [[13, 13, 4], [], [6, 12]]
    beams = beam_search(
        model, sources, mask, BOS, EOS, DecodingConfig(beam_size=4), n_best=4, prefix=prefix
    )
    config = DecodingConfig(n_samples=5, temperature=2.0)
    draws = sample(model, sources, mask, BOS, EOS, config, prefix=prefix)
    for hyps_b, hyps_s, forced in zip(beams, draws, prefix, strict=True):
        assert len(hyps_b) == 4 and len(hyps_s) == 5
        for hyp in hyps_b + hyps_s:
            assert hyp.tokens[: len(forced)] == forced
        assert len({tuple(h.tokens) for h in hyps_b}) == 4
    # beam size 1 with a prefix is greedy with that prefix
    one = beam_search(model, sources, mask, BOS, EOS, DecodingConfig(beam_size=1), prefix=prefix)
    greedy = greedy_search(model, sources, mask, BOS, EOS, prefix=prefix)
    assert [h[0].tokens for h in one] == [h[0].tokens for h in greedy]


def test_no_repeat_ngram_size_blocks_every_repeated_ngram(model):
    # Copying a repetitive source repeats its n-grams.
    src = torch.tensor([[7, 8, 7, 8, 7, 8, 7, 8], [5, 5, 5, 5, 5, 5, 0, 0]])
    mask = padding_mask(src, PAD)
    searches = {
        "greedy": lambda c, **kw: greedy_search(model, src, mask, BOS, EOS, c, **kw),
        "beam": lambda c, **kw: beam_search(
            model, src, mask, BOS, EOS, c.replace(beam_size=3), n_best=3, **kw
        ),
        "sample": lambda c, **kw: sample(
            model, src, mask, BOS, EOS, c.replace(n_samples=4, sampling_topk=3), **kw
        ),
    }
    for name, search in searches.items():
        for n in (2, 3):
            plain = [h.tokens for hyps in search(DecodingConfig()) for h in hyps]
            assert any(_repeats(t, n) for t in plain), (name, n, plain)
            ban = DecodingConfig(no_repeat_ngram_size=n)
            blocked = [h.tokens for hyps in search(ban) for h in hyps]
            assert not any(_repeats(t, n) for t in blocked), (name, n, blocked)
            # a prefix that repeats is still forced; the ban applies after it
            forced = search(ban, prefix=[[7, 7, 7, 7], [4]])
            assert all(h.tokens[:4] == [7, 7, 7, 7] for h in forced[0])
            assert not any(_repeats(h.tokens[3:], n) for h in forced[0])
    # greedy with the ban equals plain decoding with the ban
    for i in range(src.size(0)):
        (hyp,) = greedy_search(
            model, src[i : i + 1], mask[i : i + 1], BOS, EOS, DecodingConfig(no_repeat_ngram_size=2)
        )[0:1][0]
        max_len = int(1.2 * int(mask[i].sum()) + 10)
        expected = _plain_greedy(model, src[i], [], max_len, ngram=2)
        assert hyp.tokens == [t for t in expected if t != EOS]


def test_a_row_the_ngram_ban_leaves_nothing_ends_even_before_min_len(model, sources):
    """With ``no_repeat_ngram_size=1`` every token may come once; once a row has used all
    ``V`` ids it can, the ban leaves it nothing but EOS, which ``min_len`` would ban: the row
    ends there, in every search, rather than choose a banned token (or padding)."""
    mask = padding_mask(sources, PAD)
    config = DecodingConfig(no_repeat_ngram_size=1, min_len=35, max_len_a=0.0, max_len_b=38)
    searches = {
        "greedy": greedy_search(model, sources, mask, BOS, EOS, config),
        "beam": beam_search(model, sources, mask, BOS, EOS, config.replace(beam_size=3), n_best=3),
        "sample": sample(model, sources, mask, BOS, EOS, config.replace(n_samples=3)),
    }
    for name, found in searches.items():
        for hyps in found:
            for h in hyps:
                assert PAD not in h.tokens and len(set(h.tokens)) == len(h.tokens), (name, h)
                assert len(h.tokens) < V and math.isfinite(h.score), (name, h)


def _repeated(hyps) -> int:
    """Tokens that repeat an earlier token of their hypothesis, over all hypotheses."""
    return sum(len(h.tokens) - len(set(h.tokens)) for row in hyps for h in row)


def test_a_repetition_penalty_makes_a_repeating_model_repeat_less(model):
    src = torch.tensor(
        [[7, 8, 7, 8, 7, 8, 7, 8], [5, 5, 5, 5, 5, 5, 0, 0], [6, 6, 9, 9, 6, 6, 9, 0]]
    )
    mask = padding_mask(src, PAD)
    searches = {
        "greedy": lambda c: greedy_search(model, src, mask, BOS, EOS, c),
        "beam": lambda c: beam_search(model, src, mask, BOS, EOS, c.replace(beam_size=3)),
        "sample": lambda c: sample(model, src, mask, BOS, EOS, c.replace(n_samples=8)),
    }
    for name, search in searches.items():
        counts = [_repeated(search(DecodingConfig(repetition_penalty=p))) for p in (1.0, 1.5, 4.0)]
        assert counts[0] > counts[1] > counts[2], (name, counts)
        rewarded = _repeated(search(DecodingConfig(repetition_penalty=0.5)))
        assert rewarded >= counts[0], (name, rewarded, counts)  # below 1 it rewards repeats


def test_prefix_tokens_count_as_generated_for_the_repetition_penalty(model, sources):
    """Greedy with a prefix and a penalty equals plain decoding that penalises the prefix's
    tokens too, scores included; the prefix changes what follows it only through the penalty
    (the same search without it continues otherwise)."""
    mask = padding_mask(sources, PAD)
    prefix = [[9, 9, 10], [], [6, 6]]
    config = DecodingConfig(repetition_penalty=2.0)
    results = greedy_search(model, sources, mask, BOS, EOS, config, prefix=prefix)
    for i, ((hyp,), forced) in enumerate(zip(results, prefix, strict=True)):
        max_len = int(1.2 * int(mask[i].sum()) + 10)
        seq = _plain_greedy(model, sources[i], forced, max_len, penalty=2.0)
        assert hyp.tokens == [t for t in seq if t != EOS]
        lprobs = _lprobs(model, sources[i], seq[:-1], penalty=2.0)
        total = lprobs[torch.arange(len(seq)), torch.tensor(seq)].sum().item()
        assert hyp.score == pytest.approx(total / len(seq), abs=1e-5)
    unforced = greedy_search(model, sources, mask, BOS, EOS, DecodingConfig(), prefix=prefix)
    assert [h[0].tokens for h in results] != [h[0].tokens for h in unforced]


def test_sample_scores_with_a_repetition_penalty_are_the_penalised_log_probs(model, sources):
    mask = padding_mask(sources, PAD)
    config = DecodingConfig(n_samples=4, temperature=1.5, sampling_topk=6, repetition_penalty=1.8)
    for i, hyps in enumerate(sample(model, sources, mask, BOS, EOS, config)):
        max_len = int(1.2 * int(mask[i].sum()) + 10)
        for hyp in hyps:
            seq = hyp.tokens + ([EOS] if len(hyp.tokens) < max_len else [])
            lprobs = _lprobs(model, sources[i], seq[:-1], penalty=1.8)
            total = lprobs[torch.arange(len(seq)), torch.tensor(seq)].sum().item()
            assert hyp.score == pytest.approx(total / len(seq), abs=1e-4)


def test_samples_with_disable_unk_never_hold_it_and_keep_the_other_log_probs(model, sources):
    """The unknown token (7 stands for it) is banned after the softmax, as padding is: the
    other tokens' log-probabilities, hence the scores, are the model's own."""
    unk = 7
    mask = padding_mask(sources, PAD)
    config = DecodingConfig(n_samples=8, temperature=1.5, sampling_seed=2)
    plain = sample(model, sources, mask, BOS, EOS, config)
    assert any(unk in h.tokens for hyps in plain for h in hyps)  # so the ban has work to do
    banned = sample(model, sources, mask, BOS, EOS, config.replace(disable_unk=True), unk_id=unk)
    for i, hyps in enumerate(banned):
        max_len = int(1.2 * int(mask[i].sum()) + 10)
        for hyp in hyps:
            assert unk not in hyp.tokens
            seq = hyp.tokens + ([EOS] if len(hyp.tokens) < max_len else [])
            lprobs = _lprobs(model, sources[i], seq[:-1])
            total = lprobs[torch.arange(len(seq)), torch.tensor(seq)].sum().item()
            assert hyp.score == pytest.approx(total / len(seq), abs=1e-4)


@pytest.mark.parametrize(("penalty", "topk", "temperature"), [(3.0, 0, 1.0), (0.4, 4, 1.5)])
def test_sampling_draws_from_the_penalised_distribution(model, penalty, topk, temperature):
    """After a forced first token, the second token's frequencies follow the penalised
    distribution, at ``temperature`` and cut to the top ``k`` (the penalty comes first)."""
    src = torch.tensor([[9, 5, 12, 6]])
    n = 20_000
    first = 12
    config = DecodingConfig(
        n_samples=n, sampling_topk=topk, temperature=temperature, repetition_penalty=penalty,
        max_len_a=0.0, max_len_b=2, sampling_seed=4,
    )  # fmt: skip
    draws = sample(model, src, None, BOS, EOS, config, prefix=[[first]])[0]
    counts = torch.bincount(
        torch.tensor([h.tokens[1] if len(h.tokens) > 1 else EOS for h in draws]), None, V
    )
    lprobs = _lprobs(model, src[0], [first], penalty)[1]
    expected = _expected(torch.softmax(lprobs / temperature, dim=-1), topk, 1.0)
    plain = _expected(
        torch.softmax(_lprobs(model, src[0], [first])[1] / temperature, -1), topk, 1.0
    )
    assert (expected[first] - plain[first]).abs() > 0.02  # the penalty moves token 12
    support = expected > 0
    assert int(counts[~support].sum()) == 0
    observed, exp = counts[support].double(), expected[support] * n
    chi2 = float(((observed - exp) ** 2 / exp).sum())
    dof = int(support.sum()) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * dof), (chi2, dof)


def test_invalid_sampling_prefix_and_ngram_arguments(model, sources):
    """Settings out of range are refused by DecodingConfig (its message), before any search;
    what depends on the model (the prefix ids) by the search."""
    mask = padding_mask(sources, PAD)
    bad_settings = [
        ({"n_samples": 0}, "n_samples must be >= 1, got 0"),
        ({"sampling_topk": -1}, "sampling_topk must be >= 0"),
        ({"sampling_topp": 0.0}, r"sampling_topp must lie in \(0, 1\]"),
        ({"sampling_topp": 1.5}, r"sampling_topp must lie in \(0, 1\]"),
        ({"temperature": 0.0}, r"temperature must be a finite number > 0, got 0.0"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be >= 0"),
        ({"no_repeat_ngram_size": -2}, "no_repeat_ngram_size must be >= 0"),
    ]
    for settings, message in bad_settings:
        with pytest.raises(ValueError, match=message):
            sample(model, sources, mask, BOS, EOS, DecodingConfig(**settings))
    bad_prefixes = [
        ([[4]], r"one token list per sentence \(3\), got 1"),
        ([[4, EOS], [], []], r"prefix\[0\] holds id 3"),
        ([[], [PAD], []], r"prefix\[1\] holds id 0"),
        ([[], [], [V]], rf"prefix\[2\] holds id {V}"),
        ([[], [], [4] * 40], r"prefix\[2\] has 40 tokens"),
    ]
    for prefix, message in bad_prefixes:
        with pytest.raises(ValueError, match=message):
            sample(model, sources, mask, BOS, EOS, prefix=prefix)
    with pytest.raises(ValueError, match=r"prefix\[0\] holds id 3"):
        beam_search(
            model, sources, mask, BOS, EOS, DecodingConfig(beam_size=2), prefix=[[EOS], [], []]
        )
