"""The decoding loop on tiny in-test models: speculative output equals plain output with the same seed,
the KV cache rolls back exactly, the drafters propose what they should, sampled proposals keep the
target's distribution."""

from __future__ import annotations

import math

import pytest
import torch

import specverify as sv
from specverify.audit.stats import chi_square_p_value
from specverify.decoding import (
    Draft,
    ModelDrafter,
    NgramDrafter,
    SamplingParams,
    speculative_generate,
)
from specverify.decoding.drafting.base import pad_rows
from specverify.decoding.drafting.ngram import SuffixIndex, lookup_continuation
from specverify.decoding.loop.state import BatchState
from specverify.decoding.params import base_seeds, row_params
from tests.support.models import (
    PROMPTS,
    ROW_PARAMS,
    SEEDS,
    VOCAB,
    MarkovModel,
    RandomDrafter,
    fresh_logits,
    plain,
    spec,
)
from tests.support.seeds import ROW_STRIDE

pytestmark = pytest.mark.usefixtures("one_thread")


# --- the KV cache ---------------------------------------------------------------------------------


def test_rollback_one_row_crops_exactly(target):
    seq = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    session = target.session(1)
    session.extend(torch.tensor([seq[:10]]), return_logits=False)
    session.extend(torch.tensor([[40, 41, 42, 43, 44]]))  # drafts, rejected from the third on
    session.truncate(torch.tensor([12]))
    assert session.lengths.tolist() == [12]
    assert session._cache.get_seq_length() == 12  # cropped, not masked
    session.truncate(torch.tensor([10]))
    after = session.extend(torch.tensor([seq[10:20]]))[0]
    torch.testing.assert_close(after, fresh_logits(target, seq)[10:20], rtol=0, atol=1e-12)


def test_rollback_ragged_batch_matches_fresh_rows(target):
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, VOCAB, (30,), generator=g).tolist() for _ in range(3)]
    session = target.session(3)
    session.extend(pad_rows([rows[0][:4], rows[1][:9], rows[2][:1]]), return_logits=False)
    session.extend(pad_rows([rows[0][4:10], rows[1][9:12], []]))  # ragged drafts, one row idle
    session.truncate(torch.tensor([6, 12, 1]))  # row 0 keeps 2 of 6, row 1 all, row 2 nothing new
    session.extend(pad_rows([rows[0][6:8] + [47, 47], rows[1][12:16], rows[2][1:3]]))
    session.truncate(torch.tensor([8, 14, 2]))
    after = session.extend(pad_rows([rows[0][8:14], rows[1][14:20], rows[2][2:8]]))
    assert session.lengths.tolist() == [14, 20, 8]
    for b, (start, end) in enumerate([(8, 14), (14, 20), (2, 8)]):
        torch.testing.assert_close(after[b], fresh_logits(target, rows[b][:end])[start:end], rtol=0, atol=1e-12)


def test_session_rejects_bad_input(target):
    session = target.session(2)
    with pytest.raises(ValueError, match="right padding"):
        session.extend(torch.tensor([[1, -1, 2], [1, 2, 3]]))
    with pytest.raises(ValueError, match="B = 2 rows"):
        session.extend(torch.tensor([[1, 2]]))
    session.extend(torch.tensor([[1, 2, 3], [4, 5, -1]]))
    with pytest.raises(ValueError, match=r"lengths must be in \[0, current length\] \(got 3 at row 1"):
        session.truncate(torch.tensor([3, 3]))


# --- speculative == plain -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("drafter_name", "k"),
    [("ngram", 1), ("ngram", 4), ("model", 2), ("self", 3), ("random", 5), ("ngram", 0)],
)
def test_speculative_equals_plain_greedy_and_sampled(target, draft_model, drafter_name, k):
    drafter = {
        "ngram": lambda: NgramDrafter(),
        "model": lambda: ModelDrafter(draft_model),
        "self": lambda: ModelDrafter(target),
        "random": lambda: RandomDrafter(k),
    }[drafter_name]()
    reference = plain(target)
    result = spec(target, drafter, k=k)
    assert result.tokens == reference.tokens
    assert [len(t) for t in result.tokens] == [20, 20, 20]
    assert result.steps <= reference.steps


def test_drafts_are_accepted_when_they_are_right(target):
    greedy = SamplingParams()
    result = spec(target, ModelDrafter(target), params=greedy, k=3)
    assert result.acceptance == [1.0, 1.0, 1.0]
    assert result.tokens == plain(target, params=greedy).tokens


def test_identical_whatever_the_batch(target):
    """Each row's output depends on its own prompt and seed only, not on its neighbours."""
    together = spec(target, NgramDrafter(), k=3)
    for b in range(len(PROMPTS)):
        alone = spec(target, NgramDrafter(), prompts=[PROMPTS[b]], params=ROW_PARAMS[b], seed=[SEEDS[b]], k=2)
        assert alone.tokens[0] == together.tokens[b]


def test_sampled_proposals_keep_greedy_rows_identical(target, draft_model):
    greedy = SamplingParams()
    result = spec(target, ModelDrafter(draft_model), params=greedy, k=3, draft_proposal="sampled")
    assert result.tokens == plain(target, params=greedy).tokens


def test_stop_tokens_and_max_tokens(target):
    reference = plain(target, max_tokens=12)
    stop = reference.tokens[2][4]
    cut = reference.tokens[2].index(stop) + 1
    for k in (0, 3):
        result = spec(target, ModelDrafter(target), max_tokens=12, stop_tokens=[stop], k=k)
        assert result.tokens[2] == reference.tokens[2][:cut]
        assert all(len(t) <= 12 for t in result.tokens)
        assert all(stop not in t[:-1] for t in result.tokens)
    assert spec(target, NgramDrafter(), max_tokens=0).tokens == [[], [], []]


class CountingDrafter:
    """Proposes the greedy continuation t+1, t+2, ... of a Markov chain that steps by one token."""

    def propose(self, contexts, k, *, params, seeds, sampled) -> Draft:
        return Draft(torch.tensor([[(c[-1] + j) % VOCAB for j in range(1, k + 1)] for c in contexts]))


def test_a_draft_is_not_verified_past_its_stop_token():
    """Nothing after a stop token would be kept, so the draft is cut there and the target's pass is no wider."""
    table = torch.full((VOCAB, VOCAB), -5.0)
    table[torch.arange(VOCAB), (torch.arange(VOCAB) + 1) % VOCAB] = 5.0  # greedy: t -> t + 1
    passes = []

    class Recording(MarkovModel):
        def session(self, batch_size):
            session = super().session(batch_size)
            extend = session.extend
            session.extend = lambda tokens, **kw: passes.append(tokens.clone()) or extend(tokens, **kw)
            return session

    stop = 12
    result = speculative_generate(Recording(table), CountingDrafter(), [[3]], k=16, stop_tokens=[stop], max_tokens=50)
    assert result.tokens == [list(range(4, stop + 1))]
    assert passes[-1].tolist() == [list(range(3, stop + 1))]  # the last input token, then 4..12: no token past 12
    assert result.drafted[: stop - 3] == [1] * (stop - 3) and len(result.drafted) == stop - 3


def test_markov_protocol_model_speculates_like_plain():
    """Any LanguageModel works: here one without a KV cache, drafted by another."""
    g = torch.Generator().manual_seed(2)
    target_model = MarkovModel(3 * torch.randn(VOCAB, VOCAB, generator=g))
    drafter = ModelDrafter(MarkovModel(3 * torch.randn(VOCAB, VOCAB, generator=g)))
    reference = plain(target_model, max_tokens=30)
    for k in (1, 4):
        assert spec(target_model, drafter, max_tokens=30, k=k).tokens == reference.tokens


def test_sampled_drafts_are_drawn_from_q_on_the_drafters_own_stream():
    """SPEC §4: draft j of a row is drawn from the q it returns, by inverse CDF with the uniform of the key
    the verifier gives that position (seed + j) on stream 2**32, not any stream the verifier draws on."""
    g = torch.Generator().manual_seed(5)
    drafter = ModelDrafter(MarkovModel(2 * torch.randn(VOCAB, VOCAB, generator=g)))
    rows, k = 48, 3
    seeds = sv.request_seed(torch.arange(rows), torch.arange(rows) % 7)
    params = row_params(SamplingParams(temperature=1.0), rows)
    draft = drafter.propose([[int(t) % VOCAB] for t in range(rows)], k, params=params, seeds=seeds, sampled=True)
    for j in range(k):
        q = draft.probs[:, j].double()
        for stream, matches in ((2**32, rows), (0, None), (1, None), (2, None)):
            u = sv.keyed_uniform(seeds + j, stream)
            drawn = (q.cumsum(-1) <= (u * q.sum(-1))[:, None]).sum(-1)  # the smallest i with cdf(i) > u * sum
            agree = int((drawn == draft.tokens[:, j]).sum())
            assert agree == rows if matches else agree < rows - 8, (j, stream, agree)


def test_stream_events_rebuild_the_output(target):
    events = []
    result = spec(target, ModelDrafter(target), k=3, on_step=events.append)
    rebuilt = [[] for _ in PROMPTS]
    for e in events:
        assert 0 <= e.accepted <= len(e.tokens)
        assert e.accepted == len(e.tokens) or len(e.tokens) == e.accepted + 1
        rebuilt[e.row] += e.tokens
    assert rebuilt == result.tokens
    assert sum(e.accepted for e in events) == sum(result.accepted)


def test_bad_arguments_name_themselves(target):
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        spec(target, NgramDrafter(), k=-1)
    with pytest.raises(ValueError, match="draft_proposal"):
        spec(target, NgramDrafter(), draft_proposal="greedy")
    with pytest.raises(ValueError, match=r"prompts\[1\] must be a non-empty"):
        plain(target, prompts=[[1], []], params=SamplingParams(), seed=0)
    with pytest.raises(ValueError, match="max_tokens"):
        plain(target, max_tokens=-1)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="params must be"):
        row_params([SamplingParams()], 2)


class CountingModel:
    """The real model, counting the sessions opened on it (a session is where decoding starts)."""

    def __init__(self, model):
        self.model, self.sessions = model, 0
        self.vocab_size, self.max_context = model.vocab_size, model.max_context

    def session(self, batch_size: int):
        self.sessions += 1
        return self.model.session(batch_size)


def test_prompt_plus_max_tokens_beyond_the_context_is_refused_before_decoding(target):
    from specverify.decoding.engines.base import ContextOverflow

    assert target.max_context == 256  # config.max_position_embeddings
    counted = CountingModel(target)
    fits, long = [[7] * 246, [8] * 10], [[7] * 250, [8] * 10]
    message = (
        r"prompt \(250 tokens\) \+ max_tokens \(10\) = 260 exceeds the model's context of 256 tokens "
        r"\(at row 0\); shorten the prompt or lower max_tokens"
    )
    for generate in (plain, lambda *a, **kw: spec(*a, NgramDrafter(), **kw)):
        with pytest.raises(ContextOverflow, match=message):
            generate(counted, prompts=long, params=SamplingParams(), max_tokens=10, seed=0)
        assert counted.sessions == 0
        result = generate(counted, prompts=fits, params=SamplingParams(), max_tokens=10, seed=0)
        assert [len(t) for t in result.tokens] == [10, 10]  # exactly the context: runs to the end
        counted.sessions = 0
    assert issubclass(ContextOverflow, ValueError)
    # a model that states no limit (the protocol's max_context is optional) is not limited
    markov = MarkovModel(torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0)))
    assert len(plain(markov, prompts=[[3] * 300], params=SamplingParams(), max_tokens=5, seed=0).tokens[0]) == 5


def test_int_seed_spreads_over_rows_like_the_verifier():
    """Row b's base seed is seed + b, so its keys (SPEC §4, base * ROW_STRIDE + n) are those the verifier
    gives row b of a batch sharing the seed request_seed(seed, n)."""
    assert base_seeds(7, 3).tolist() == [7, 8, 9]
    state = BatchState([[1], [2], [3]], 4, (), 7, None)
    state.generated = [[5], [5], [5]]
    assert [s % 2**64 for s in state.seeds().tolist()] == [((7 + b) * ROW_STRIDE + 1) % 2**64 for b in range(3)]
    assert [s % 2**64 for s in state.seeds().tolist()] == [
        (7 * ROW_STRIDE + 1 + b * ROW_STRIDE) % 2**64 for b in range(3)
    ]


# --- drafters -------------------------------------------------------------------------------------


def test_lookup_prefers_the_longest_then_the_latest_suffix():
    ctx = [1, 2, 3, 9, 2, 3, 8, 7, 1, 2, 3]
    assert lookup_continuation(ctx, 3, 3, 1) == [9, 2, 3]  # "1 2 3" occurred at 0
    ctx = [5, 2, 3, 9, 4, 2, 3, 8, 6, 2, 3]
    assert lookup_continuation(ctx, 2, 3, 1) == [8, 6]  # "2 3", the latest occurrence
    assert lookup_continuation([4, 5, 6], 3, 3, 1) == []
    assert lookup_continuation([4], 3, 3, 1) == []
    assert lookup_continuation([7, 7, 7], 4, 3, 1) == [7]


def reference_lookup(context: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Prompt lookup by its definition: for n = max_ngram down to min_ngram, the latest earlier
    occurrence of the last n tokens that is followed by a token; what follows it, k tokens at most."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == context[-n:]:
                return context[start + n : start + n + k]
    return []


def test_lookup_matches_its_definition_on_random_contexts():
    generator = torch.Generator().manual_seed(0)
    for trial in range(300):
        length = int(torch.randint(1, 40, (), generator=generator))
        vocab = int(torch.randint(2, 6, (), generator=generator))
        context = torch.randint(0, vocab, (length,), generator=generator)
        max_ngram = int(torch.randint(1, 10, (), generator=generator))
        min_ngram = int(torch.randint(1, max_ngram + 1, (), generator=generator))
        got = lookup_continuation(context.tolist(), 5, max_ngram, min_ngram)
        assert got == reference_lookup(context.tolist(), 5, max_ngram, min_ngram), (trial, context.tolist())


def reference_match_length(context: list[int], max_ngram: int, min_ngram: int) -> int:
    """The longest n in max_ngram..min_ngram whose last n tokens occurred earlier, followed by a token; 0 if none."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        if any(context[start : start + n] == context[-n:] for start in range(len(context) - n)):
            return n
    return 0


def test_a_row_s_suffix_index_follows_its_context_as_it_grows_and_when_it_changes():
    """The drafter's per-row index, synced step after step (appends, and contexts that shrink or change
    under it), always gives the searches of a fresh index and the definition's match length."""
    generator = torch.Generator().manual_seed(2)
    drafter = NgramDrafter(max_ngram=4)
    rows = [[0], [1, 2]]
    for step in range(400):
        kind = int(torch.randint(0, 10, (), generator=generator))
        for row in rows:
            if kind < 7:  # decoding: a few tokens appended
                row += torch.randint(
                    0, 3, (int(torch.randint(1, 4, (), generator=generator)),), generator=generator
                ).tolist()
            elif kind == 7 and len(row) > 2:  # rolled back
                del row[len(row) // 2 :]
            elif kind == 8:  # an earlier token replaced: same length, other content
                row[int(torch.randint(0, len(row), (), generator=generator))] += 1
        contexts = [list(r) for r in rows] if kind == 9 else rows  # new list objects, same content
        evidence = drafter.evidence(contexts)
        for index, context, got in zip(drafter._indexes, contexts, evidence):
            assert index.tokens == context
            assert index.longest_suffix(4, 1) == SuffixIndex(context).longest_suffix(4, 1)
            assert got == reference_match_length(context, 4, 1), (step, context)
            starts = [i + got for i in range(len(context) - got) if got and context[i : i + got] == context[-got:]]
            assert index.longest_suffix(4, 1)[1] == starts  # every earlier occurrence, in order
    assert SuffixIndex([5, 6, 5, 6, 7, 5, 6]).longest_suffix(8, 1) == (2, [2, 4])
    assert SuffixIndex([5, 6, 5, 6, 7, 5, 6]).longest_suffix(8, 3) == (0, [])
    assert SuffixIndex([5, 7, 6, 5]).longest_suffix(8, 1) == (1, [1])


def test_ngram_evidence_is_the_match_length_and_zero_exactly_when_nothing_is_proposed():
    generator = torch.Generator().manual_seed(1)
    for trial in range(200):
        contexts = [
            torch.randint(0, 4, (int(torch.randint(1, 30, (), generator=generator)),), generator=generator).tolist()
            for _ in range(3)
        ]
        drafter = NgramDrafter(max_ngram=int(torch.randint(1, 9, (), generator=generator)))
        evidence = drafter.evidence(contexts)
        assert evidence == [reference_match_length(c, drafter.max_ngram, 1) for c in contexts], (trial, contexts)
        tokens = drafter.propose(contexts, 2, params=None, seeds=None, sampled=False).tokens
        assert [e > 0 for e in evidence] == (tokens[:, 0] != -1).tolist()
        # the proposal after an evidence call (its searches reused) is the lookup's
        assert tokens.tolist() == [(reference_lookup(c, 2, drafter.max_ngram, 1) + [-1, -1])[:2] for c in contexts]
        contexts[0].append(contexts[0][-1])  # changed since: searched again
        again = drafter.propose(contexts, 2, params=None, seeds=None, sampled=False).tokens
        assert again[0].tolist() == (reference_lookup(contexts[0], 2, drafter.max_ngram, 1) + [-1, -1])[:2]


@pytest.mark.parametrize("bad", [[1], [1, -1], [1, 2.0], [True, 1]])
def test_a_drafter_s_bad_evidence_is_named(target, bad):
    class Claims(NgramDrafter):
        def evidence(self, contexts):
            return bad

    with pytest.raises(ValueError, match="the drafter's evidence must be one int >= 0 per row"):
        spec(target, Claims(), prompts=PROMPTS[:2], params=ROW_PARAMS[:2], seed=SEEDS[:2], k="auto")


def test_ngram_drafter_pads_ragged_proposals():
    draft = NgramDrafter().propose([[1, 2, 1, 2], [3, 4], [5, 6, 7, 5]], 3, params=None, seeds=None, sampled=False)
    assert draft.tokens.tolist() == [[1, 2, -1], [-1, -1, -1], [6, 7, 5]]
    assert draft.probs is None


def test_model_drafter_follows_rollbacks(target):
    """After a rejection the drafter's cache matches the committed context: it proposes what a fresh one would."""
    rows = row_params(SamplingParams(), 2)
    seeds = torch.zeros(2, dtype=torch.int64)
    drafter = ModelDrafter(target)
    first = drafter.propose([[1, 2, 3], [4, 5]], 4, params=rows, seeds=seeds, sampled=False).tokens
    contexts = [[1, 2, 3, int(first[0, 0]), 30], [4, 5] + first[1].tolist() + [31]]
    again = drafter.propose(contexts, 4, params=rows, seeds=seeds, sampled=False).tokens
    fresh = ModelDrafter(target).propose(contexts, 4, params=rows, seeds=seeds, sampled=False).tokens
    assert again.tolist() == fresh.tolist()


def test_model_drafter_returns_its_distributions(target):
    rows = row_params(SamplingParams(temperature=0.9, top_k=5), 2)
    draft = ModelDrafter(target).propose([[1, 2], [3]], 3, params=rows, seeds=torch.tensor([0, 1]), sampled=True)
    assert draft.probs.shape == (2, 3, VOCAB)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(2, 3))
    assert ((draft.probs > 0).sum(-1) <= 5).all()
    assert (draft.probs.gather(2, draft.tokens[..., None]) > 0).all()


# --- sampled proposals keep the distribution ------------------------------------------------------


class LyingDrafter:
    """A known-wrong variant: samples from its model but reports a flatter distribution as q."""

    def __init__(self, drafter: ModelDrafter):
        self.drafter = drafter

    def propose(self, contexts, k, *, params, seeds, sampled) -> Draft:
        draft = self.drafter.propose(contexts, k, params=params, seeds=seeds, sampled=sampled)
        return Draft(draft.tokens, (draft.probs + 1.0 / draft.probs.shape[-1]) / 2)


def two_token_counts(target_model, drafter, rows: int, verification: str = "token") -> torch.Tensor:
    result = spec(
        target_model,
        drafter,
        prompts=[[0]] * rows,
        params=SamplingParams(temperature=1.0),
        seed=11,
        max_tokens=2,
        k=2,
        draft_proposal="sampled",
        verification=verification,
    )
    pairs = torch.tensor(result.tokens)
    vocab = target_model.vocab_size
    return torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab).double()


@pytest.mark.parametrize("verification", ["token", "block"])
def test_sampled_proposals_are_lossless_and_a_lie_is_caught(verification):
    vocab, rows = 5, 6000
    g = torch.Generator().manual_seed(4)
    table = 1.5 * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)
    draft_table = table + 1.5 * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)
    target_model, draft_model = MarkovModel(table.float()), MarkovModel(draft_table.float())
    step = table.softmax(-1)  # exact, float64: T = 1, no truncation
    exact = (step[0][:, None] * step).reshape(-1)
    counts = two_token_counts(target_model, ModelDrafter(draft_model), rows, verification)
    assert chi_square_p_value(counts.numpy(), exact.numpy())[0] > 1e-3
    wrong = two_token_counts(target_model, LyingDrafter(ModelDrafter(draft_model)), rows, verification)
    assert chi_square_p_value(wrong.numpy(), exact.numpy())[0] < 1e-6
    assert math.isclose(counts.sum(), rows)


def test_block_verification_accepts_more_drafts_in_the_loop():
    """On a draft model unlike its target (the Markov tables of the lossless test), block verification keeps
    more drafted tokens per step than token-wise, on the same seeds (4000 rows, one step of 3 drafts each);
    token-wise keeps its output law, block too (the test above). Argmax proposals are refused."""
    vocab, rows = 5, 4000
    g = torch.Generator().manual_seed(4)
    table = 1.5 * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)
    draft_table = table + 1.5 * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)
    target_model, draft_model = MarkovModel(table.float()), MarkovModel(draft_table.float())
    accepted = {}
    for verification in ("token", "block"):
        result = spec(
            target_model,
            ModelDrafter(draft_model),
            prompts=[[0]] * rows,
            params=SamplingParams(temperature=1.0),
            seed=3,
            max_tokens=4,
            k=3,
            draft_proposal="sampled",
            verification=verification,
        )
        assert sum(result.drafted) >= 3 * rows
        accepted[verification] = sum(result.accepted) / sum(result.drafted)
    assert accepted["block"] > accepted["token"] + 0.01, accepted
    with pytest.raises(ValueError, match='verification="block" needs draft_proposal="sampled"'):
        spec(target_model, ModelDrafter(draft_model), verification="block")
