"""The tree loop (`tree_generate`) and the tree drafters on tiny in-test models: in argmax mode the output is
plain decoding's, whatever the trees; in sampled mode the loop hands the verifier the drafter's real q and
the committed tokens follow the target's exact law (a lying drafter is caught)."""

from __future__ import annotations

import math

import pytest
import torch

import specverify
from specverify.audit.stats import chi_square_p_value
from specverify.decoding import (
    ModelTreeDrafter,
    NgramTrieDrafter,
    SamplingParams,
    TreeDraft,
    tree_generate,
)
from specverify.decoding.drafting.tree import continuation_trie
from specverify.decoding.loop.tree import fit_tree
from specverify.decoding.params import row_params
from tests.support.models import PROMPTS, ROW_PARAMS, SEEDS, VOCAB, MarkovModel, MarkovSession, fresh_logits, plain

pytestmark = pytest.mark.usefixtures("one_thread")


def tree(model, drafter, prompts=PROMPTS, params=ROW_PARAMS, **kwargs):
    kwargs = {"seed": SEEDS, "max_tokens": 20, "nodes": 8, **kwargs}
    return tree_generate(model, drafter, prompts, params, **kwargs)


class RandomTreeDrafter:
    """Random trees: random tokens (duplicate siblings), random parents, padding anywhere, ragged rows."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def propose_tree(self, contexts, nodes, depths, *, params, seeds, sampled) -> TreeDraft:
        g = self.generator
        width = int(torch.randint(0, nodes + 1, (), generator=g))
        tokens = torch.randint(0, 6, (len(contexts), width), generator=g)  # few ids: siblings repeat
        parents = torch.tensor(
            [[int(torch.randint(-1, i, (), generator=g)) for i in range(width)] for _ in contexts], dtype=torch.int64
        ).reshape(len(contexts), width)
        padded = torch.rand(len(contexts), width, generator=g) < 0.2
        tokens = torch.where(padded, -1, tokens)
        # a node below a padded node must go too (SPEC §8: its parent must be present)
        for b in range(len(contexts)):
            for i in range(width):
                if parents[b, i] >= 0 and tokens[b, parents[b, i]] < 0:
                    tokens[b, i] = -1
        return TreeDraft(tokens, parents)


class MarkovTreeModel(MarkovModel):
    """The Markov model of test_decoding with tree sessions: a node's logits are table[its token]."""

    def session(self, batch_size: int) -> MarkovTreeSession:
        return MarkovTreeSession(self.table, batch_size)


class MarkovTreeSession(MarkovSession):
    def extend_tree(self, root, tokens, parents):
        self.lengths = self.lengths + (root[:, 0] >= 0)
        return self.table[torch.cat([root, tokens], 1).clamp_min(0)]

    def keep_path(self, path, path_length):
        self.lengths = self.lengths + path_length


# --- argmax mode: plain decoding's tokens -----------------------------------------------------------


@pytest.mark.parametrize("nodes", [0, 1, 4, 16])
def test_tree_steps_give_plain_decodings_tokens(target, draft_model, nodes):
    """Greedy, top-p and top-k/min-p rows, ragged prompts and seeds near 2**64: every drafter, every size."""
    expected = plain(target).tokens
    for drafter in (
        NgramTrieDrafter(),
        ModelTreeDrafter(draft_model, 3),
        ModelTreeDrafter(target, 2),
        RandomTreeDrafter(nodes),
    ):
        assert tree(target, drafter, nodes=nodes).tokens == expected, type(drafter).__name__


def test_thinking_regions_end_a_commit_at_their_boundary(target):
    """A commit ends after a thinking boundary (as in the chain loop); the output is still plain decoding's."""
    from specverify.decoding import ThinkingRegions

    regions = ThinkingRegions(43, 21)  # the greedy output holds both, several times
    prompts = [[7, 9, 10, 8, 9, 10, 7, 9, 10, 8, 9, 10, 7, 9]]
    expected = plain(target, prompts=prompts, params=[SamplingParams()], seed=[0], thinking=regions).tokens
    events = []
    result = tree(
        target,
        ModelTreeDrafter(target, 2),
        prompts=prompts,
        params=[SamplingParams()],
        seed=[0],
        thinking=regions,
        on_step=events.append,
    )
    assert result.tokens == expected
    assert all(t not in (43, 21) for e in events for t in e.tokens[:-1])
    assert sum(e.tokens[-1] in (43, 21) for e in events) >= 3


def test_good_trees_commit_several_tokens_a_step(target):
    """The target drafting for itself (greedy): nearly every path is accepted to its end."""
    result = tree(target, ModelTreeDrafter(target, 2), params=SamplingParams(), nodes=8)
    assert result.tokens == plain(target, params=SamplingParams()).tokens
    assert result.tokens_per_step > 3
    assert result.steps < 20


def test_identical_whatever_the_batch_and_the_budgets(target, draft_model):
    together = tree(target, ModelTreeDrafter(draft_model, 2), max_tokens=[5, 20, 9], stop_tokens=[3])
    for b, prompt in enumerate(PROMPTS):
        alone = tree_generate(
            target,
            ModelTreeDrafter(draft_model, 2),
            [prompt],
            ROW_PARAMS[b],
            seed=[SEEDS[b]],
            max_tokens=[5, 20, 9][b],
            stop_tokens=[3],
            nodes=8,
        )
        assert alone.tokens[0] == together.tokens[b]
        assert len(alone.tokens[0]) <= [5, 20, 9][b]
        assert 3 not in alone.tokens[0][:-1]


def test_stream_events_rebuild_the_output_and_statistics_count_the_walk(target):
    events = []
    result = tree(target, ModelTreeDrafter(target, 2), on_step=events.append)
    rebuilt = [[] for _ in PROMPTS]
    for event in events:
        rebuilt[event.row] += event.tokens
        assert 0 <= event.accepted <= len(event.tokens)
    assert rebuilt == result.tokens
    assert sum(result.accepted) == sum(e.accepted for e in events)
    assert all(a <= d for a, d in zip(result.accepted, result.drafted))
    assert result.num_tokens == result.row_steps + sum(result.accepted)


# --- sampled mode: the verifier gets the drafter's real q -------------------------------------------


class RecordingDrafter:
    """The drafter it wraps, recording the contexts each proposal was made for."""

    def __init__(self, drafter):
        self.drafter, self.contexts = drafter, []

    def propose_tree(self, contexts, nodes, depths, **kwargs) -> TreeDraft:
        self.contexts.append([list(c) for c in contexts])
        return self.drafter.propose_tree(contexts, nodes, depths, **kwargs)


@pytest.mark.parametrize("sibling_draws", ["with_replacement", "without_replacement"])
def test_sampled_mode_hands_the_verifier_the_drafters_q(target, draft_model, monkeypatch, sibling_draws):
    """Every present node's q is the draft model's distribution after that node's parent path (a fresh,
    plain forward), truncated with the row's parameters; its token is in that q's support; the scheme is
    the drafter's; without replacement siblings differ."""
    calls = []
    real = specverify.tree_acceptance_sampler

    def recording(draft_tokens, parents, target_logits, *args, **kwargs):
        calls.append((draft_tokens.clone(), parents.clone(), kwargs["draft_probs"].clone(), kwargs["sibling_draws"]))
        return real(draft_tokens, parents, target_logits, *args, **kwargs)

    monkeypatch.setattr(specverify, "tree_acceptance_sampler", recording)
    drafter = RecordingDrafter(ModelTreeDrafter(draft_model, 3, sibling_draws))
    tree(target, drafter, draft_proposal="sampled", max_tokens=8, nodes=10)
    params = row_params(ROW_PARAMS, len(PROMPTS))
    checked = 0
    assert len(calls) == len(drafter.contexts)
    for (tokens, parents, probs, scheme), contexts in zip(calls, drafter.contexts):
        assert scheme == sibling_draws
        for b, context in enumerate(contexts):
            present = (tokens[b] >= 0).nonzero()[:, 0].tolist()
            siblings = {}
            for i in present:
                path, node = [], int(parents[b, i])
                while node >= 0:
                    path.insert(0, int(tokens[b, node]))
                    node = int(parents[b, node])
                logits = fresh_logits(draft_model, context + path)[-1:].float()
                q = specverify.truncated_probs(logits, *(None if t is None else t[b : b + 1] for t in params))[0]
                torch.testing.assert_close(probs[b, i], q, rtol=0, atol=1e-5)
                assert q[tokens[b, i]] > 0
                siblings.setdefault(int(parents[b, i]), []).append(int(tokens[b, i]))
                checked += 1
            if sibling_draws == "without_replacement":
                assert all(len(set(s)) == len(s) for s in siblings.values())
    assert checked > 30


def draws_of_root_children(drafter, logits_row: torch.Tensor, rows: int, temperature: float) -> torch.Tensor:
    """The first two children the drafter hangs under the root, over `rows` seeds: int64 [rows, 2]."""
    params = row_params(SamplingParams(temperature=temperature), rows)
    contexts = [[0]] * rows
    draft = drafter.propose_tree(contexts, 2, [1] * rows, params=params, seeds=torch.arange(rows), sampled=True)
    assert draft.tokens.shape == (rows, 2) and (draft.parents == -1).all()
    torch.testing.assert_close(draft.probs[:, 0], draft.probs[:, 1])  # siblings share q
    torch.testing.assert_close(
        draft.probs[0, 0].double(), (logits_row.double() / temperature).softmax(-1), rtol=0, atol=1e-6
    )
    return draft.tokens


@pytest.mark.slow
@pytest.mark.parametrize("sibling_draws", ["with_replacement", "without_replacement"])
def test_sampled_siblings_are_drawn_as_declared(sibling_draws):
    """The joint law of the first two root children against the exact float64 law of the declared scheme
    (i.i.d. from q, or the second from q without the first), and the other scheme's law is caught."""
    vocab, rows, temperature = 6, 6000, 0.7
    table = 1.5 * torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    drafter = ModelTreeDrafter(MarkovTreeModel(table.float()), 2, sibling_draws)
    pairs = draws_of_root_children(drafter, table[0], rows, temperature)
    counts = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab).double()
    q = (table[0] / temperature).softmax(-1)
    iid = q[:, None] * q[None, :]
    without = iid / (1 - q[:, None]) * (1 - torch.eye(vocab, dtype=torch.float64))
    declared, other = (iid, without) if sibling_draws == "with_replacement" else (without, iid)
    assert chi_square_p_value(counts.numpy(), declared.reshape(-1).numpy())[0] > 1e-3
    assert chi_square_p_value(counts.numpy(), other.reshape(-1).numpy())[0] < 1e-6


class LyingTreeDrafter:
    """A known-wrong variant: draws from its model but reports a flatter q to the verifier."""

    def __init__(self, drafter):
        self.drafter = drafter

    def propose_tree(self, contexts, nodes, depths, **kwargs) -> TreeDraft:
        draft = self.drafter.propose_tree(contexts, nodes, depths, **kwargs)
        real = draft.probs.sum(-1, keepdim=True) > 0
        flatter = torch.where(real, (draft.probs + 1.0 / draft.probs.shape[-1]) / 2, 0.0)
        return TreeDraft(draft.tokens, draft.parents, flatter, draft.sibling_draws)


def three_token_counts(target_model, drafter, rows: int) -> torch.Tensor:
    result = tree_generate(
        target_model,
        drafter,
        [[0]] * rows,
        SamplingParams(temperature=1.0),
        seed=11,
        max_tokens=3,
        nodes=6,
        draft_proposal="sampled",
    )
    triples = torch.tensor(result.tokens)
    vocab = target_model.vocab_size
    return torch.bincount((triples[:, 0] * vocab + triples[:, 1]) * vocab + triples[:, 2], minlength=vocab**3).double()


@pytest.mark.slow
@pytest.mark.parametrize("sibling_draws", ["with_replacement", "without_replacement"])
def test_sampled_tree_steps_are_lossless_and_a_lie_is_caught(sibling_draws):
    """The first three tokens of tree decoding with a sampling draft model (trees of 2 root children, 4
    grandchildren) follow the target's exact float64 law; the same drafter reporting a flatter q is caught."""
    vocab, rows = 5, 6000
    g = torch.Generator().manual_seed(4)
    table = 1.5 * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)
    draft_table = table + 1.5 * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)
    target_model, draft_model = MarkovTreeModel(table.float()), MarkovTreeModel(draft_table.float())
    step = table.softmax(-1)
    exact = (step[0][:, None, None] * step[:, :, None] * step[None, :, :]).reshape(-1)
    counts = three_token_counts(target_model, ModelTreeDrafter(draft_model, 2, sibling_draws), rows)
    assert math.isclose(counts.sum(), rows)
    assert chi_square_p_value(counts.numpy(), exact.numpy())[0] > 1e-3
    wrong = three_token_counts(target_model, LyingTreeDrafter(ModelTreeDrafter(draft_model, 2, sibling_draws)), rows)
    assert chi_square_p_value(wrong.numpy(), exact.numpy())[0] < 1e-6


def test_a_deterministic_tree_in_sampled_mode_keeps_greedy_rows_identical(target):
    result = tree(target, NgramTrieDrafter(), draft_proposal="sampled")
    assert result.tokens[0] == plain(target).tokens[0]  # row 0 is greedy


# --- the drafters ---------------------------------------------------------------------------------


def test_the_trie_merges_every_continuation_most_frequent_first():
    # (7, 1, 2) never occurred before; (1, 2) did, 3 times: followed by 3 4 9 | 3 5 1 | 3 4 7 (most recent last)
    context = [1, 2, 3, 4, 9, 8, 1, 2, 3, 5, 1, 2, 3, 4, 7, 1, 2]
    tokens, parents = continuation_trie(context, nodes=10, depth=3, max_ngram=3, min_ngram=1)
    # 3 (x3), 4 (x2), then the single continuations by recency: 7 (at 14), 5 (at 9), 1 (at 10), 9 (at 4)
    assert list(zip(tokens, parents)) == [(3, -1), (4, 0), (7, 1), (5, 0), (1, 3), (9, 1)]
    assert continuation_trie(context, nodes=3, depth=3, max_ngram=3, min_ngram=1) == ([3, 4, 7], [-1, 0, 1])
    assert continuation_trie(context, nodes=10, depth=1, max_ngram=3, min_ngram=1) == ([3], [-1])
    assert continuation_trie([1, 2, 3], nodes=10, depth=3, max_ngram=3, min_ngram=1) == ([], [])
    assert continuation_trie(context, nodes=0, depth=3, max_ngram=3, min_ngram=1) == ([], [])


@pytest.mark.parametrize("kind", ["ngram", "model-argmax", "model-sampled"])
def test_drafted_trees_are_valid_and_within_their_budgets(target, draft_model, kind):
    drafter = NgramTrieDrafter() if kind == "ngram" else ModelTreeDrafter(draft_model, 3)
    contexts = [p * 3 for p in PROMPTS]
    params = row_params(ROW_PARAMS, len(contexts))
    sampled = kind == "model-sampled"
    for nodes, depths in ((8, [3, 0, 8]), (5, [1, 2, 5]), (16, [16, 16, 16])):
        draft = drafter.propose_tree(
            contexts, nodes, depths, params=params, seeds=torch.tensor(SEEDS[:1] * 3), sampled=sampled
        )
        assert draft.tokens.dtype == draft.parents.dtype == torch.int64
        assert draft.tokens.shape == draft.parents.shape and draft.tokens.shape[1] <= nodes
        assert (draft.probs is not None) == sampled
        for b, depth in enumerate(depths):
            levels = {-1: -1}
            for i, (token, parent) in enumerate(zip(draft.tokens[b].tolist(), draft.parents[b].tolist())):
                if token == -1:
                    continue
                assert 0 <= token < VOCAB and parent in levels and parent < i
                levels[i] = levels[parent] + 1
                assert levels[i] < depth
            if kind == "model-argmax":  # 3 root children, then 3 of each level's nodes expand into 3
                assert len(levels) - 1 == min(nodes, 3 + 9 * (depth - 1) if depth else 0)


def test_fit_tree_cuts_each_row_to_its_budget_and_refuses_bad_shapes():
    tokens, parents = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), torch.tensor([[-1, 0, 1, -1], [-1, 0, 1, -1]])
    cut, same, probs = fit_tree(TreeDraft(tokens, parents), 4, [2, 0], False, VOCAB)
    assert cut.tolist() == [[5, 6, -1, 8], [-1, -1, -1, -1]] and torch.equal(same, parents) and probs is None
    _, _, zeros = fit_tree(TreeDraft(tokens, parents), 4, [4, 4], True, VOCAB)
    assert zeros.shape == (2, 4, VOCAB) and not zeros.any()  # a deterministic tree: judged without q
    for draft, message in [
        (TreeDraft(tokens, parents), r"\[B=2, N <= 3\]"),
        (TreeDraft(tokens.float(), parents), "tokens must be an integer tensor"),
        (TreeDraft(tokens, parents[:, :3]), "one shape"),
        (TreeDraft(tokens, parents, torch.zeros(2, 4, 7)), r"probs must be \[B, N, V\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            fit_tree(draft, 3 if "N <=" in message else 4, [4, 4], True, VOCAB)
    assert tokens.tolist() == [[5, 6, 7, 8], [5, 6, 7, 8]]  # inputs untouched


def test_bad_arguments_name_themselves(target, draft_model):
    from specverify.decoding.constraints.grammar import Grammar

    grammar = Grammar("regex", None, VOCAB, VOCAB, frozenset(), torch.zeros(2, dtype=torch.int32))
    cases = [
        ({"nodes": -1}, ValueError, "nodes must be an int >= 0"),
        ({"draft_proposal": "tree"}, ValueError, "draft_proposal must be"),
        ({"grammar": [None, grammar, None]}, ValueError, "grammar must be None with tree drafts: .* at row 1"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            tree(target, NgramTrieDrafter(), **kwargs)
    with pytest.raises(TypeError, match="a TreeSession"):
        tree(MarkovModel(torch.zeros(VOCAB, VOCAB)), NgramTrieDrafter())
    with pytest.raises(ValueError, match="sibling_draws must be"):
        ModelTreeDrafter(draft_model, 2, "iid")
    with pytest.raises(ValueError, match="branching must be an int >= 1"):
        ModelTreeDrafter(draft_model, 0)
    with pytest.raises(ValueError, match="parents must be -1 .* at row 0, node 0"):

        def bad(contexts, nodes, depths, **_):
            return TreeDraft(torch.tensor([[1]] * 3), torch.tensor([[0]] * 3))

        tree(target, type("Bad", (), {"propose_tree": staticmethod(bad)})())
