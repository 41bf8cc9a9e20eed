"""Greedy and beam search: equivalences, batch independence, scoring and length rules."""

from __future__ import annotations

import pytest
import torch
from conftest import copy_batch

from seq2seq.nn import DecodingConfig, Transformer, beam_search, greedy_search, padding_mask
from seq2seq.nn.rules import length_penalty_value

PAD, BOS, EOS = 0, 2, 3
V = 14


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> Transformer:
    """A model trained briefly on copying: confident but imperfect, with EOS at varied steps."""
    torch.manual_seed(0)
    m = Transformer(
        vocab_size=V,
        d_model=32,
        n_heads=4,
        n_encoder_layers=1,
        n_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        max_positions=40,
    )
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        src, dec_in, tgt = copy_batch(32, g, V)
        logits = m(src, dec_in, padding_mask(src, PAD))
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt, ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.double().eval()


@pytest.fixture(scope="module")
def sources() -> torch.Tensor:
    """Three sources of different lengths, right-padded."""
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [12, 4, 5, 0, 0, 0, 0], [7, 7, 13, 9, 6, 0, 0]])
    return src


def _ends_with_eos(hyp, src_len: int, a: float = 1.2, b: int = 10) -> bool:
    return len(hyp.tokens) < int(a * src_len + b)


def _rescore(model, src_row, hyp, with_eos: bool, alpha: float, form: str) -> float:
    seq = hyp.tokens + ([EOS] if with_eos else [])
    dec_in = torch.tensor([[BOS, *seq[:-1]]])
    src = src_row[None]
    logits = model(src, dec_in, padding_mask(src, PAD))
    lprobs = torch.log_softmax(logits.double(), dim=-1)[0]
    total = lprobs[torch.arange(len(seq)), torch.tensor(seq)].sum().item()
    return total / length_penalty_value(float(len(seq)), alpha, form)


@pytest.mark.parametrize(("alpha", "form"), [(1.0, "fairseq"), (0.6, "gnmt"), (0.0, "fairseq")])
@pytest.mark.parametrize("min_len", [0, 3])
def test_beam_size_one_equals_greedy(model, sources, alpha, form, min_len):
    mask = padding_mask(sources, PAD)
    config = DecodingConfig(length_penalty=alpha, length_penalty_form=form, min_len=min_len)
    greedy = greedy_search(model, sources, mask, BOS, EOS, config)
    beam = beam_search(model, sources, mask, BOS, EOS, config.replace(beam_size=1))
    for (g,), (b,) in zip(greedy, beam, strict=True):
        assert g.tokens == b.tokens
        assert g.score == pytest.approx(b.score, abs=1e-5)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_output_does_not_depend_on_batch_or_padding(model, sources, beam_size):
    def decode(src):
        mask = padding_mask(src, PAD)
        if beam_size == 1:
            return greedy_search(model, src, mask, BOS, EOS)
        return beam_search(
            model, src, mask, BOS, EOS, DecodingConfig(beam_size=beam_size), n_best=3
        )

    together = decode(sources)
    for i in range(sources.size(0)):
        length = int((sources[i] != PAD).sum())
        alone = decode(sources[i : i + 1, :length])
        padded = decode(torch.cat([sources[i : i + 1], torch.zeros(1, 5, dtype=torch.long)], 1))
        for hyps in (alone, padded):
            assert [h.tokens for h in hyps[0]] == [h.tokens for h in together[i]]
            assert [h.score for h in hyps[0]] == pytest.approx([h.score for h in together[i]])


@pytest.mark.parametrize(("alpha", "form"), [(1.0, "fairseq"), (0.6, "gnmt"), (2.0, "gnmt")])
def test_scores_are_length_penalised_log_probs(model, sources, alpha, form):
    mask = padding_mask(sources, PAD)
    results = beam_search(
        model,
        sources,
        mask,
        BOS,
        EOS,
        DecodingConfig(beam_size=4, length_penalty=alpha, length_penalty_form=form),
        n_best=4,
    )
    for i, hyps in enumerate(results):
        src_len = int(mask[i].sum())
        for hyp in hyps:
            expected = _rescore(model, sources[i], hyp, _ends_with_eos(hyp, src_len), alpha, form)
            assert hyp.score == pytest.approx(expected, abs=1e-4)


def test_length_penalty_forms():
    assert length_penalty_value(4.0, 1.0, "fairseq") == 4.0
    assert length_penalty_value(4.0, 0.5, "fairseq") == 2.0
    assert length_penalty_value(7.0, 1.0, "gnmt") == 2.0
    assert length_penalty_value(7.0, 0.0, "gnmt") == 1.0
    with pytest.raises(ValueError, match="length_penalty_form"):
        length_penalty_value(3.0, 1.0, "other")


def test_n_best_sorted_and_distinct(model, sources):
    results = beam_search(
        model, sources, padding_mask(sources, PAD), BOS, EOS, DecodingConfig(beam_size=5), n_best=3
    )
    for hyps in results:
        assert len(hyps) == 3
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 3


@pytest.mark.parametrize("beam_size", [1, 3])
def test_eos_ends_hypotheses_and_lengths_are_bounded(model, sources, beam_size):
    mask = padding_mask(sources, PAD)
    config = DecodingConfig(beam_size=beam_size)
    results = beam_search(model, sources, mask, BOS, EOS, config, n_best=beam_size)
    stopped_early = False
    for i, hyps in enumerate(results):
        max_len = int(1.2 * int(mask[i].sum()) + 10)
        for hyp in hyps:
            assert EOS not in hyp.tokens and PAD not in hyp.tokens
            assert len(hyp.tokens) <= max_len
            stopped_early |= len(hyp.tokens) < max_len - 1
    assert stopped_early


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_min_len_and_max_len(model, sources, search):
    mask = padding_mask(sources, PAD)

    def run(**kwargs):
        if search == "greedy":
            return greedy_search(model, sources, mask, BOS, EOS, DecodingConfig(**kwargs))
        config = DecodingConfig(beam_size=3, **kwargs)
        return beam_search(model, sources, mask, BOS, EOS, config, n_best=3)

    for hyps in run(min_len=12):
        assert all(len(h.tokens) >= 12 for h in hyps)
    for hyps in run(max_len_a=0.0, max_len_b=2):
        assert all(len(h.tokens) <= 2 for h in hyps)


def test_invalid_arguments(model, sources):
    mask = padding_mask(sources, PAD)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, sources, mask, BOS, EOS, DecodingConfig(beam_size=0))
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, sources, mask, BOS, EOS, DecodingConfig(beam_size=2), n_best=3)
    with pytest.raises(ValueError, match="length_penalty_form"):
        beam_search(model, sources, mask, BOS, EOS, DecodingConfig(length_penalty_form="wu"))
    with pytest.raises(ValueError, match="src_mask"):
        greedy_search(model, sources, mask[:, 0], BOS, EOS)
    with pytest.raises(ValueError, match=r"beam_size \(8\) must be at most half of vocab_size"):
        beam_search(model, sources, mask, BOS, EOS, DecodingConfig(beam_size=8))
    with pytest.raises(TypeError, match="config must be a seq2seq.nn.DecodingConfig"):
        greedy_search(model, sources, mask, BOS, EOS, {"beam_size": 1})


@torch.no_grad()
def test_beams_sharing_cross_attention_equal_expanded_copies():
    """expand_beams keeps cross-attention keys/values once per sentence; the logits equal those
    of a cache whose cross-attention rows were copied for every beam, also after sentences
    are dropped."""
    from seq2seq.nn import padding_mask

    torch.manual_seed(0)
    model = (
        Transformer(
            vocab_size=50,
            d_model=32,
            n_heads=4,
            n_encoder_layers=1,
            n_decoder_layers=2,
            d_ff=64,
            dropout=0.0,
        )
        .double()
        .eval()
    )
    src = torch.randint(4, 50, (3, 7))
    src[1, 4:] = 0
    mask = padding_mask(src, 0)
    memory = model.encode(src, mask)
    shared, copied = model.new_cache(8), model.new_cache(8)
    bos = torch.full((3, 1), 2)
    model.decode(bos, memory, mask, shared)
    model.decode(bos, memory, mask, copied)
    beam = 3
    rows = torch.arange(3).repeat_interleave(beam)
    shared.expand_beams(beam)
    copied.reorder(rows, include_cross=True)
    tokens = torch.randint(4, 50, (9, 1))
    a = model.decode(tokens, None, mask, shared)
    b = model.decode(tokens, None, mask.index_select(0, rows), copied)
    torch.testing.assert_close(a, b)
    # Drop sentence 1 and reorder beams within the others.
    keep = torch.tensor([0, 2])
    new_rows = torch.tensor([1, 1, 0, 8, 6, 7])
    shared.reorder(new_rows, include_cross=True)
    copied.reorder(new_rows, include_cross=True)
    tokens = torch.randint(4, 50, (6, 1))
    a = model.decode(tokens, None, mask.index_select(0, keep), shared)
    b = model.decode(tokens, None, mask.index_select(0, rows[new_rows]), copied)
    torch.testing.assert_close(a, b)


def _penalised(logits: torch.Tensor, tokens: list[int], penalty: float) -> torch.Tensor:
    """``logits`` ``(V,)`` with each id of ``tokens`` penalised once, one id at a time."""
    logits = logits.clone()
    for t in set(tokens):
        logits[t] = logits[t] / penalty if logits[t] > 0 else logits[t] * penalty
    return logits


def _reference_beam(model, src_row, k, alpha, form, min_len, a=1.2, b=10, penalty=1.0, unk=None):
    """Beam search written out per sentence and per beam, with a full forward pass per step and
    no cache: the rules of :func:`beam_search`'s docstring, nothing shared with it (each beam's
    logits penalised by its own tokens; ``unk`` banned after the softmax)."""
    src = src_row[None, : int((src_row != PAD).sum())]
    max_len = min(int(a * src.size(1) + b), model.max_positions)
    beams = [([], 0.0)]
    finished: list[tuple[float, list[int]]] = []
    for step in range(max_len):
        cands = []
        for beam_id, (toks, score) in enumerate(beams):
            if score == float("-inf"):
                continue
            logits = model(src, torch.tensor([[BOS, *toks]]))[0, -1]
            lprobs = torch.log_softmax(_penalised(logits.double(), toks, penalty), dim=-1)
            lprobs[PAD] = float("-inf")
            if unk is not None:
                lprobs[unk] = float("-inf")
            if step < min_len:
                lprobs[EOS] = float("-inf")
            cands += [(score + lp, beam_id, v) for v, lp in enumerate(lprobs.tolist())]
        cands.sort(key=lambda c: -c[0])
        at_max = step + 1 >= max_len
        opened = []
        for pos, (score, beam_id, v) in enumerate(cands[: 2 * k]):
            toks = beams[beam_id][0] + [v]
            if v == EOS or at_max:
                if pos < k and score > float("-inf"):
                    lp = length_penalty_value(float(step + 1), alpha, form)
                    finished.append((score / lp, toks))
            else:
                opened.append((toks, score))
        finished = sorted(finished, key=lambda f: -f[0])[:k]
        beams = opened[:k]
        if at_max or not beams:
            break
        best_open = beams[0][1] / length_penalty_value(float(step + 1), alpha, form)
        if len(finished) == k and best_open <= finished[-1][0]:
            break
    return [([t for t in toks if t != EOS], score) for score, toks in finished]


@pytest.mark.parametrize(
    ("k", "alpha", "form", "min_len"),
    [(2, 1.0, "fairseq", 0), (3, 0.0, "fairseq", 2), (5, 0.6, "gnmt", 0)],
)
def test_beam_search_equals_a_plain_reference(model, sources, k, alpha, form, min_len):
    """Batched, cached beam search (beams kept in their parent's slot, partial cache reorders)
    returns the hypotheses and scores of a per-beam reference without cache."""
    results = beam_search(
        model,
        sources,
        padding_mask(sources, PAD),
        BOS,
        EOS,
        DecodingConfig(
            beam_size=k, length_penalty=alpha, length_penalty_form=form, min_len=min_len
        ),
        n_best=k,
    )
    for i, hyps in enumerate(results):
        expected = _reference_beam(model, sources[i], k, alpha, form, min_len)
        assert [h.tokens for h in hyps] == [toks for toks, _ in expected]
        assert [h.score for h in hyps] == pytest.approx([s for _, s in expected], abs=1e-6)


@pytest.mark.parametrize("min_len", [0, 4])
def test_greedy_without_scores_gives_the_same_tokens(model, sources, min_len):
    mask = padding_mask(sources, PAD)
    config = DecodingConfig(min_len=min_len)
    with_scores = greedy_search(model, sources, mask, BOS, EOS, config)
    without = greedy_search(model, sources, mask, BOS, EOS, config, scores=False)
    for (a,), (b,) in zip(with_scores, without, strict=True):
        assert a.tokens == b.tokens
        assert b.score != b.score  # nan


@pytest.mark.parametrize("k", [2, 3])
def test_beam_search_over_a_wide_vocabulary_equals_the_reference(sources, k):
    """A vocabulary wide enough for the block-wise top-k of the CPU path (``fast.topk``)."""
    torch.manual_seed(1)
    wide = Transformer(
        vocab_size=1024,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        dropout=0.0,
    )
    wide = wide.double().eval()
    src = sources[:2]
    config = DecodingConfig(beam_size=k)
    results = beam_search(wide, src, padding_mask(src, PAD), BOS, EOS, config, n_best=k)
    for i, hyps in enumerate(results):
        expected = _reference_beam(wide, src[i], k, 1.0, "fairseq", 0)
        assert [h.tokens for h in hyps] == [toks for toks, _ in expected]
        assert [h.score for h in hyps] == pytest.approx([s for _, s in expected], abs=1e-6)


# ------------------------------------------------------------------------ repetition penalty
@torch.no_grad()
def _reference_greedy(model, src_row, penalty, min_len=0, a=1.2, b=10, unk=None):
    """Greedy decoding by float64 recomputation (no cache): each step's logits penalised by the
    tokens so far, then log-softmax and the bans (``unk`` too). Returns the tokens (EOS
    included) and the summed log-probability."""
    src = src_row[None, : int((src_row != PAD).sum())]
    max_len = min(int(a * src.size(1) + b), model.max_positions)
    seq: list[int] = []
    total = 0.0
    while len(seq) < max_len:
        logits = model(src, torch.tensor([[BOS, *seq]]))[0, -1].double()
        lprobs = torch.log_softmax(_penalised(logits, seq, penalty), dim=-1)
        lprobs[PAD] = float("-inf")
        if unk is not None:
            lprobs[unk] = float("-inf")
        if len(seq) < min_len:
            lprobs[EOS] = float("-inf")
        seq.append(int(lprobs.argmax()))
        total += float(lprobs[seq[-1]])
        if seq[-1] == EOS:
            break
    return seq, total


@pytest.mark.parametrize(("penalty", "min_len"), [(1.5, 0), (3.0, 2), (0.7, 0)])
def test_greedy_with_a_repetition_penalty_equals_a_plain_reference(
    model, sources, penalty, min_len
):
    config = DecodingConfig(repetition_penalty=penalty, min_len=min_len, length_penalty=1.0)
    results = greedy_search(model, sources, padding_mask(sources, PAD), BOS, EOS, config)
    plain = greedy_search(model, sources, padding_mask(sources, PAD), BOS, EOS)
    for i, (hyp,) in enumerate(results):
        seq, total = _reference_greedy(model, sources[i], penalty, min_len)
        assert hyp.tokens == [t for t in seq if t != EOS]
        assert hyp.score == pytest.approx(total / len(seq), abs=1e-5)
    # the penalty changes the outputs, so the agreement says something
    assert [h[0].tokens for h in results] != [h[0].tokens for h in plain]


@pytest.mark.parametrize(
    ("k", "alpha", "form", "min_len", "penalty"),
    [(2, 1.0, "fairseq", 0, 1.5), (4, 0.6, "gnmt", 2, 1.3), (3, 0.0, "fairseq", 0, 0.7)],
)
def test_beam_search_with_a_repetition_penalty_equals_the_reference(
    model, sources, k, alpha, form, min_len, penalty
):
    """Each beam is penalised by its own history (beams are reordered, copied and dropped)."""
    config = DecodingConfig(
        beam_size=k, length_penalty=alpha, length_penalty_form=form, min_len=min_len,
        repetition_penalty=penalty,
    )  # fmt: skip
    results = beam_search(model, sources, padding_mask(sources, PAD), BOS, EOS, config, n_best=k)
    plain = config.replace(repetition_penalty=1.0)
    unpenalised = beam_search(model, sources, padding_mask(sources, PAD), BOS, EOS, plain, n_best=k)
    assert [[h.tokens for h in hyps] for hyps in results] != [
        [h.tokens for h in hyps] for hyps in unpenalised
    ]
    for i, hyps in enumerate(results):
        expected = _reference_beam(model, sources[i], k, alpha, form, min_len, penalty=penalty)
        assert [h.tokens for h in hyps] == [toks for toks, _ in expected]
        assert [h.score for h in hyps] == pytest.approx([s for _, s in expected], abs=1e-6)


def test_repetition_penalty_one_is_the_plain_path(model, sources, monkeypatch):
    """1.0 (the default) never reaches the penalty's code, and that code would change nothing
    at 1.0 either: outputs stay exactly those of the search without the option."""
    from seq2seq.nn import rules, sample

    values = torch.randn(4, V, dtype=torch.float64)
    history = torch.tensor([[5, 5, 6], [4, 7, 8], [9, 9, 9], [13, 4, 5]])
    assert torch.equal(rules.penalise_repetitions(values.clone(), history, 1.0), values)

    mask = padding_mask(sources, PAD)
    runs = {
        "greedy": lambda c: greedy_search(model, sources, mask, BOS, EOS, c),
        "beam": lambda c: beam_search(model, sources, mask, BOS, EOS, c, n_best=3),
        "sample": lambda c: sample(model, sources, mask, BOS, EOS, c.replace(n_samples=3)),
    }
    before = {name: run(DecodingConfig(beam_size=3)) for name, run in runs.items()}

    def unreachable(*args, **kwargs):
        raise AssertionError("penalise_repetitions called with repetition_penalty=1.0")

    monkeypatch.setattr(rules, "penalise_repetitions", unreachable)
    for name, run in runs.items():
        assert run(DecodingConfig(beam_size=3, repetition_penalty=1.0)) == before[name], name


@pytest.mark.parametrize("value", [0.0, -1.2, float("inf"), float("nan")])
def test_invalid_repetition_penalty_is_refused_with_decoding_configs_message(value):
    with pytest.raises(
        ValueError, match=r"^repetition_penalty must be a finite number > 0 \(1 = off\)"
    ):
        DecodingConfig(repetition_penalty=value)


# ------------------------------------------------------------------------ disable_unk
UNK = 6  # stands for the unknown token: the copying model emits it for two of the sources


def test_greedy_with_disable_unk_equals_a_plain_reference(model, sources):
    """The ban is after the softmax: the other tokens keep their log-probabilities."""
    mask = padding_mask(sources, PAD)
    config = DecodingConfig(disable_unk=True, length_penalty=1.0)
    results = greedy_search(model, sources, mask, BOS, EOS, config, unk_id=UNK)
    plain = greedy_search(model, sources, mask, BOS, EOS, config.replace(disable_unk=False))
    assert sum(UNK in hyp.tokens for (hyp,) in plain) == 2  # so the ban has work to do
    for i, (hyp,) in enumerate(results):
        assert UNK not in hyp.tokens
        seq, total = _reference_greedy(model, sources[i], 1.0, unk=UNK)
        assert hyp.tokens == [t for t in seq if t != EOS]
        assert hyp.score == pytest.approx(total / len(seq), abs=1e-5)


@pytest.mark.parametrize(("k", "alpha", "form"), [(2, 1.0, "fairseq"), (4, 0.6, "gnmt")])
def test_beam_search_with_disable_unk_equals_the_reference(model, sources, k, alpha, form):
    config = DecodingConfig(
        beam_size=k, length_penalty=alpha, length_penalty_form=form, disable_unk=True
    )
    mask = padding_mask(sources, PAD)
    results = beam_search(model, sources, mask, BOS, EOS, config, n_best=k, unk_id=UNK)
    plain = beam_search(model, sources, mask, BOS, EOS, config.replace(disable_unk=False), n_best=k)
    assert any(UNK in h.tokens for hyps in plain for h in hyps)
    for i, hyps in enumerate(results):
        assert all(UNK not in h.tokens for h in hyps)
        expected = _reference_beam(model, sources[i], k, alpha, form, 0, unk=UNK)
        assert [h.tokens for h in hyps] == [toks for toks, _ in expected]
        assert [h.score for h in hyps] == pytest.approx([s for _, s in expected], abs=1e-6)


def test_disable_unk_lets_a_prefix_hold_the_unknown_token(model, sources):
    mask = padding_mask(sources, PAD)
    prefix = [[UNK], [], [4, UNK]]
    config = DecodingConfig(beam_size=3, disable_unk=True)
    greedy = greedy_search(model, sources, mask, BOS, EOS, config, prefix=prefix, unk_id=UNK)
    beam = beam_search(model, sources, mask, BOS, EOS, config, n_best=3, prefix=prefix, unk_id=UNK)
    for hyps, forced in zip(greedy + beam, prefix * 2, strict=True):
        for h in hyps:
            assert h.tokens[: len(forced)] == forced and h.score > float("-inf")
            assert UNK not in h.tokens[len(forced) :]


def test_disable_unk_needs_the_unknown_tokens_id(model, sources):
    mask = padding_mask(sources, PAD)
    config = DecodingConfig(disable_unk=True)
    for unk_id in (None, V):
        message = rf"^disable_unk needs the unknown token's id in \[0, {V}\), got unk_id={unk_id}$"
        with pytest.raises(ValueError, match=message):
            greedy_search(model, sources, mask, BOS, EOS, config, unk_id=unk_id)
    off = greedy_search(model, sources, mask, BOS, EOS, DecodingConfig(), unk_id=UNK)
    assert off == greedy_search(model, sources, mask, BOS, EOS)  # unk_id alone bans nothing
    with pytest.raises(ValueError, match=r"^disable_unk must be true or false, got 'yes'$"):
        DecodingConfig(disable_unk="yes")
