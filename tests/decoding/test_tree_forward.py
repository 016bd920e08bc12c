"""The target's tree forward (`HFSession.extend_tree`) and KV compaction (`keep_path`) on a tiny Llama:
every node's logits equal a plain forward of its path, and after keeping an accepted path the cache
scores the next tokens as a fresh forward of the committed context does."""

from __future__ import annotations

import pytest
import torch

import specverify
from specverify.decoding.drafting.base import pad_rows
from tests.support.models import VOCAB, fresh_logits, tiny_llama_config

pytestmark = pytest.mark.usefixtures("one_thread")

# A float64 model: the tree forward differs from the plain one only by summation order, except that
# transformers' eager attention takes its softmax in float32.
ATOL = {"sdpa": 1e-10, "eager": 1e-5}


def atol(target) -> float:
    return ATOL[target.model.config._attn_implementation]


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def target(request):
    transformers = pytest.importorskip("transformers")
    from specverify.decoding import HFLanguageModel

    torch.manual_seed(0)
    config = tiny_llama_config(VOCAB, attn_implementation=request.param)
    return HFLanguageModel(transformers.LlamaForCausalLM(config).to(torch.float64))


# Three rows: ragged contexts, trees with padding anywhere (row 0 also at its end), one row without nodes.
CONTEXTS = [[3, 14, 15, 9, 2, 6], [5, 35], [8, 9, 7, 9, 3]]
ROOTS = [[26], [5], [11]]
TOKENS = [
    [40, 41, -1, 42, 43, 44, 45, -1],
    [7, -1, 7, 1, 2, 47, 0, 30],  # a duplicate sibling token (7 twice)
    [-1, -1, -1, -1, -1, -1, -1, -1],
]
PARENTS = [
    [-1, -1, 5, 0, 0, 3, 5, 2],  # padded nodes' parents are ignored, even when out of order
    [-1, 6, -1, 0, 3, 4, 3, 2],
    [-1, 9, 9, 9, 9, 9, 9, 9],
]


def node_path(tokens: list[int], parents: list[int], node: int) -> list[int]:
    """The tokens on the path root -> node (root excluded), by following parents."""
    path = []
    while node != -1:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def session_with_holes(target):
    """A session over CONTEXTS whose cache has masked holes from a ragged rollback (rows dropped different drafts)."""
    session = target.session(len(CONTEXTS))
    session.extend(pad_rows([c[:-1] for c in CONTEXTS]), return_logits=False)
    session.extend(pad_rows([[c[-1], 44, 45, 46][: 4 - b] for b, c in enumerate(CONTEXTS)]), return_logits=False)
    session.truncate(torch.tensor([len(c) for c in CONTEXTS]))
    assert bool((~session._valid).any())  # holes the tree's mask must keep hidden
    return session


def test_every_node_scores_as_a_plain_forward_of_its_path(target):
    session = session_with_holes(target)
    logits = session.extend_tree(torch.tensor(ROOTS), torch.tensor(TOKENS), torch.tensor(PARENTS))
    assert logits.shape == (3, 9, VOCAB)
    for b, context in enumerate(CONTEXTS):
        prefix = context + ROOTS[b]
        torch.testing.assert_close(logits[b, 0], fresh_logits(target, prefix)[-1], rtol=0, atol=atol(target))
        for node, token in enumerate(TOKENS[b]):
            if token != -1:
                path = prefix + node_path(TOKENS[b], PARENTS[b], node)
                torch.testing.assert_close(
                    logits[b, node + 1], fresh_logits(target, path)[-1], rtol=0, atol=atol(target)
                )


def test_kept_path_leaves_the_cache_of_the_committed_context(target):
    session = session_with_holes(target)
    session.extend_tree(torch.tensor(ROOTS), torch.tensor(TOKENS), torch.tensor(PARENTS))
    path = torch.tensor([[0, 3, 5, -1, -1, -1, -1, -1], [0, 3, 4, 5, -1, -1, -1, -1], [-1] * 8])
    session.keep_path(path, torch.tensor([3, 4, 0]))
    committed = [CONTEXTS[b] + ROOTS[b] + [TOKENS[b][i] for i in path[b].tolist() if i != -1] for b in range(3)]
    assert session.lengths.tolist() == [len(c) for c in committed]
    nexts = [[4, 4, 20], [], [33, 1]]  # ragged, one row idle
    after = session.extend(pad_rows(nexts))
    for b, extra in enumerate(nexts):
        fresh = fresh_logits(target, committed[b] + extra)
        torch.testing.assert_close(after[b, : len(extra)], fresh[len(committed[b]) :], rtol=0, atol=atol(target))


def test_one_row_compacts_exactly_over_sampler_verdicts(target):
    """Two tree steps driven by `tree_acceptance_sampler` (argmax mode): the accepted nodes move to the
    front of the block, so a single row's cache holds exactly its context, and each step scores as fresh."""
    context = [3, 14, 15, 9, 2, 6]
    tokens, parents = torch.tensor([[40, 41, 42, 43, 44, 45]]), torch.tensor([[-1, -1, 1, 1, 3, 0]])
    session = target.session(1)
    session.extend(torch.tensor([context[:-1]]), return_logits=False)
    root = context[-1]
    for step in range(2):
        logits = session.extend_tree(torch.tensor([[root]]), tokens, parents).float()  # a normal tensor: editable
        # temperature 0: the walk follows the argmax; force the argmax onto nodes 1 -> 3 -> 4 at step 0.
        if step == 0:
            for index, token in ((0, 41), (2, 43), (4, 44)):
                logits[0, index, token] = 1e3
        path, length, next_token = specverify.tree_acceptance_sampler(tokens, parents, logits, 0.0, -1, 1.0, 0)
        session.keep_path(path, length)
        accepted = [int(tokens[0, i]) for i in path[0, : int(length)]]
        assert step > 0 or accepted == [41, 43, 44]
        context = context + accepted + [int(next_token)]
        root = context[-1]
        assert session._cache.get_seq_length() == int(session.lengths) == len(context) - 1
    after = session.extend(torch.tensor([[root, 7, 8]]))[0]
    torch.testing.assert_close(after, fresh_logits(target, context + [7, 8])[-3:], rtol=0, atol=atol(target))


def test_a_tree_without_keep_path_is_dropped(target):
    session = target.session(1)
    session.extend(torch.tensor([[1, 2, 3]]), return_logits=False)
    session.extend_tree(torch.tensor([[4]]), torch.tensor([[5, 6]]), torch.tensor([[-1, 0]]))
    after = session.extend(torch.tensor([[9]]))[0]  # the root stays, the nodes go
    assert session.lengths.tolist() == [5]
    torch.testing.assert_close(after, fresh_logits(target, [1, 2, 3, 4, 9])[-1:], rtol=0, atol=atol(target))
    with pytest.raises(ValueError, match="keep_path needs a tree"):
        session.keep_path(torch.tensor([[0, -1]]), torch.tensor([1]))


def test_bad_trees_and_paths_name_themselves(target):
    session = target.session(2)
    session.extend(torch.tensor([[1, 2], [3, 4]]), return_logits=False)
    root, tokens = torch.tensor([[5], [6]]), torch.tensor([[7, 8, 9], [10, 11, -1]])
    cases = [
        (root, tokens, torch.tensor([[-1, 0], [-1, 0]]), "parents must have the shape of tokens"),
        (root, tokens.float(), torch.tensor([[-1, 0, 1], [-1, 0, 0]]), "tokens must be an integer tensor"),
        (root, tokens[:1], torch.tensor([[-1, 0, 1]]), "tokens must have B = 2 rows"),
    ]
    for r, t, p, message in cases:
        before = (r.clone(), t.clone(), p.clone())
        with pytest.raises((ValueError, TypeError), match=message):
            session.extend_tree(r, t, p)
        assert all(torch.equal(x, y) for x, y in zip(before, (r, t, p)))
    assert session.lengths.tolist() == [2, 2]
    session.extend_tree(root, tokens, torch.tensor([[-1, 0, 0], [-1, -1, 0]]))
    for path, length, message in [
        ([[1, -1, -1], [0, -1, -1]], [1, 1], "got node 1 at row 0, depth 0"),  # node 1 is not a child of the root
        ([[0, 0, -1], [0, -1, -1]], [2, 1], "got node 0 at row 0, depth 1"),  # node 0 is no child of node 0
        ([[0, -1, -1], [2, -1, -1]], [1, 1], "got node 2 at row 1, depth 0"),  # padding
        ([[0, -1, -1], [0, -1, -1]], [1, 4], r"path_length must be in \[0, 3\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            session.keep_path(torch.tensor(path), torch.tensor(length))
    session.keep_path(torch.tensor([[0, 2, -1], [1, -1, -1]]), torch.tensor([2, 1]))
    assert session.lengths.tolist() == [5, 4]


# Trees whose values break SPEC §8, each beside the tree the verifier's validate=False walk reads (the bad
# node and its subtree as padding), and the rule tree_acceptance_sampler names under validate=True.
BAD_TREES = [
    (
        [[7, 8, 9], [10, 11, -1]],
        [[-1, 1, 0], [-1, 0, 0]],
        [[7, -1, -1], [10, 11, -1]],
        "parents must be -1 .* at row 0, node 1",
    ),
    (
        [[7, -1, 9], [10, 11, -1]],
        [[-1, 0, 1], [-1, 0, 0]],
        [[7, -1, -1], [10, 11, -1]],
        "a present node .* row 0, node 2",
    ),
    (
        [[7, VOCAB, 9], [10, 11, 12]],
        [[-1, 0, 0], [-1, 0, 1]],
        [[7, -1, 9], [10, 11, 12]],
        rf"draft_tokens must be in \[-1, {VOCAB}\) .* row 0, node 1",
    ),
]


@pytest.mark.parametrize("tokens, parents, read_as, rule", BAD_TREES)
def test_a_bad_tree_is_scored_as_the_verifier_reads_it_and_refused_by_the_verifier(
    target, tokens, parents, read_as, rule
):
    """extend_tree leaves the values to the verifier (one check per step, no host reads in the forward):
    a node the walk cannot reach is scored as padding, so the reachable nodes' logits are those of the tree
    without it; the verifier with validate=True refuses the tree by name."""

    def scores(t, p):
        session = target.session(2)
        session.extend(torch.tensor([[1, 2], [3, 4]]), return_logits=False)
        return session.extend_tree(torch.tensor([[5], [6]]), torch.tensor(t), torch.tensor(p))

    logits, expected = scores(tokens, parents), scores(read_as, parents)
    reachable = torch.cat([torch.ones(2, 1, dtype=torch.bool), torch.tensor(read_as) >= 0], dim=1)
    torch.testing.assert_close(logits[reachable], expected[reachable], rtol=0, atol=atol(target))
    with pytest.raises(ValueError, match=rule):
        specverify.tree_acceptance_sampler(torch.tensor(tokens), torch.tensor(parents), logits.float(), 1.0, -1, 1.0, 0)
