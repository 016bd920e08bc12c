"""SPEC §8, deterministic laws: a chain-shaped tree is the chain verifier bit for bit; argmax mode commits
exactly what `sample` gives with seed s_b + n whatever the tree; greedy rows follow the argmax; N = 0 and
B = 0; validate=False reads nothing back and returns valid outputs; bad input names argument, rule, value."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import specverify as sv
from specverify.kernels import native
from tests.support.backends import backend_path, native_available
from tests.support.invariants import assert_untouched, forbid_host_reads, snapshot
from tests.support.trees import insert_padding, random_trees, reference_argmax_walk

V = 9


def _params(rng: np.random.Generator, batch: int) -> dict:
    """Per-row sampling parameters mixing every rule: plain, top-k, top-p, min-p and greedy rows."""
    kind = np.arange(batch) % 5
    return dict(
        temperature=torch.tensor(np.choose(kind, [1.0, 0.7, 1.3, 0.9, 0.0]), dtype=torch.float32),
        top_k=torch.tensor(np.choose(kind, [-1, 4, 0, -1, -1])),
        top_p=torch.tensor(np.choose(kind, [1.0, 1.0, 0.8, 0.9, 1.0]), dtype=torch.float32),
        min_p=torch.tensor(np.choose(kind, [0.0, 0.0, 0.0, 0.1, 0.0]), dtype=torch.float32),
        seed=torch.tensor(rng.integers(-(2**63), 2**63 - 1, size=batch, dtype=np.int64)),
    )


def _masks(rng: np.random.Generator, shape: tuple) -> torch.Tensor:
    """Random grammar masks [..., ceil(V/32)] that allow at least one token everywhere."""
    allowed = rng.random((*shape, V)) < 0.7
    allowed[..., 0] = True
    return sv.pack_bitmask(torch.as_tensor(allowed))


def _chain(rng: np.random.Generator, batch: int, nodes: int, padded: bool):
    draft = rng.integers(0, V, size=(batch, nodes))
    if padded:  # a padded tail of random length
        draft = np.where(np.arange(nodes)[None, :] >= rng.integers(0, nodes + 1, size=(batch, 1)), -1, draft)
    return torch.as_tensor(draft), torch.arange(-1, nodes - 1).expand(batch, nodes).contiguous()


def _chain_committed(args: dict, **extra) -> tuple[torch.Tensor, torch.Tensor]:
    out = sv.stochastic_acceptance_sampler(
        args["draft_tokens"],
        args["target_logits"],
        args["temperature"],
        args["top_k"],
        None,
        args["top_p"],
        None,
        args["seed"],
        token_bitmasks=args.get("token_bitmasks"),
        min_p=args["min_p"],
        **extra,
    )
    return sv.committed_tokens(*out)


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded-tail"])
def test_a_chain_shaped_tree_is_the_chain_verifier_in_argmax_mode(code_path, padded):
    rng = np.random.default_rng(1 + padded)
    batch, nodes = 60, 5
    draft, parents = _chain(rng, batch, nodes, padded)
    logits = torch.as_tensor(rng.normal(0, 2, size=(batch, nodes + 1, V)), dtype=torch.float32)
    args = dict(
        draft_tokens=draft, target_logits=logits, token_bitmasks=_masks(rng, (batch, nodes + 1)), **_params(rng, batch)
    )
    # drafts that often agree with the target, so that paths run deep
    likely = logits.argmax(-1)[:, :nodes]
    args["draft_tokens"] = torch.where((draft >= 0) & torch.as_tensor(rng.random((batch, nodes)) < 0.6), likely, draft)
    path, length, token = sv.tree_acceptance_sampler(parents=parents, **args)
    tokens, count = sv.tree_committed_tokens(args["draft_tokens"], path, length, token)
    chain_tokens, chain_count = _chain_committed(args)
    assert torch.equal(tokens, chain_tokens) and torch.equal(count, chain_count)
    assert length.float().mean() > 0.5  # the comparison reached past the root


def test_a_chain_shaped_tree_is_the_chain_verifier_in_sampled_mode(code_path):
    rng = np.random.default_rng(3)
    batch, nodes = 80, 4
    draft, parents = _chain(rng, batch, nodes, padded=False)
    logits = torch.as_tensor(rng.normal(0, 1.5, size=(batch, nodes + 1, V)), dtype=torch.float32)
    scores = logits[:, :nodes].double().numpy()
    q = 0.7 * np.exp(scores) / np.exp(scores).sum(-1, keepdims=True) + 0.3 * rng.dirichlet(
        np.ones(V), size=(batch, nodes)
    )
    q[:, :, 2] = 0.0  # a token the draft cannot sample: judged without a distribution
    q /= q.sum(-1, keepdims=True)
    q[::7, 1] = 0.0  # rows without a distribution
    draft = np.array(
        [[rng.choice(V, p=q[b, j]) if q[b, j].sum() else rng.integers(V) for j in range(nodes)] for b in range(batch)]
    )
    draft[::5, 0] = 2
    args = dict(
        draft_tokens=torch.as_tensor(draft),
        target_logits=logits,
        token_bitmasks=_masks(rng, (batch, nodes + 1)),
        **_params(rng, batch),
    )
    probs = torch.as_tensor(q, dtype=torch.float32)
    for scheme in ("with_replacement", "without_replacement"):  # one child per node: the schemes agree
        out = sv.tree_acceptance_sampler(
            parents=parents, draft_proposal="sampled", draft_probs=probs, sibling_draws=scheme, **args
        )
        tokens, count = sv.tree_committed_tokens(args["draft_tokens"], *out)
        chain_tokens, chain_count = _chain_committed(args, draft_proposal="sampled", draft_probs_full=probs)
        assert torch.equal(tokens, chain_tokens) and torch.equal(count, chain_count)
    assert count.float().mean() > 1.5


def _random_tree_args(seed: int, batch: int = 48, nodes: int = 10, vocab_top: int = 3, masks: bool = True) -> dict:
    """Random trees whose tokens come from each index's few most likely tokens (duplicates among siblings,
    deep paths), padding anywhere, NaN logits at the padded indices (ignored)."""
    rng = np.random.default_rng(seed)
    draft, parents = random_trees(rng, batch, nodes, vocab_top, padding=0.15)
    logits = rng.normal(0, 2, size=(batch, nodes + 1, V)).astype(np.float32)
    order = np.argsort(-logits, axis=-1)
    # node i's token: one of the `vocab_top` most likely tokens at its parent's index
    parent_index = np.where(parents >= 0, parents + 1, 0).clip(0, nodes)
    tokens = order[np.arange(batch)[:, None], parent_index]  # [B, N, V]: ids by rank at the parent's index
    draft = np.where(draft >= 0, np.take_along_axis(tokens, np.maximum(draft, 0)[..., None], axis=-1)[..., 0], -1)
    draft, parents, logits = insert_padding(rng, draft, parents, logits)
    args = dict(
        draft_tokens=torch.as_tensor(draft),
        parents=torch.as_tensor(parents),
        target_logits=torch.as_tensor(logits),
        **_params(rng, batch),
    )
    if masks:
        args["token_bitmasks"] = _masks(rng, (batch, nodes + 2))
    return args


def test_argmax_mode_commits_what_sample_gives_with_seed_s_plus_n(code_path):
    args = _random_tree_args(seed=5)
    before = snapshot(args)
    path, length, token = sv.tree_acceptance_sampler(**args)
    assert_untouched(args, before)
    paths, tokens = reference_argmax_walk(args)
    assert [p[: int(n)] for p, n in zip(path.tolist(), length)] == paths
    assert token.tolist() == tokens
    assert (path[length[:, None] <= torch.arange(path.shape[1])] == -1).all()
    assert length.max() >= 3  # deep paths were exercised


def test_every_backend_walks_trees_as_the_spec_says(each_backend):
    # the compiled kernels, the torch reference and Triton (interpreted here): argmax mode against the
    # from-the-spec walk, validate=True and validate=False (which each backend runs its own way)
    args = _random_tree_args(seed=16, batch=10, nodes=6)
    paths, tokens = reference_argmax_walk(args)
    for validate in (True, False):
        path, length, token = sv.tree_acceptance_sampler(**args, validate=validate)
        assert [p[: int(n)] for p, n in zip(path.tolist(), length)] == paths and token.tolist() == tokens


def test_the_output_does_not_depend_on_the_batch():
    args = _random_tree_args(seed=6, batch=12)
    whole = sv.tree_acceptance_sampler(**args)
    for b in (0, 7):
        alone = {name: value[b : b + 1] if isinstance(value, torch.Tensor) else value for name, value in args.items()}
        assert all(torch.equal(x[b : b + 1], y) for x, y in zip(whole, sv.tree_acceptance_sampler(**alone)))


def test_a_shared_seed_spreads_over_rows_as_in_the_chain_verifier():
    args = _random_tree_args(seed=7, batch=6)
    spread = torch.tensor([(1234 + b * 0x9E3779B97F4A7C15) % 2**64 for b in range(6)], dtype=torch.uint64).view(
        torch.int64
    )
    shared = sv.tree_acceptance_sampler(**{**args, "seed": 1234})
    per_row = sv.tree_acceptance_sampler(**{**args, "seed": spread})
    assert all(torch.equal(x, y) for x, y in zip(shared, per_row))


@pytest.mark.parametrize("proposal", ["argmax", "sampled"])
def test_greedy_rows_follow_the_argmax(proposal):
    args = _random_tree_args(seed=8, masks=False)
    batch, nodes = args["draft_tokens"].shape
    args["temperature"] = torch.zeros(batch)
    extra = {}
    if proposal == "sampled":
        q = torch.softmax(torch.randn(batch, nodes, V, generator=torch.Generator().manual_seed(0)), -1)
        first_sibling = torch.tensor(
            [[row.index(p) if p in row else i for i, p in enumerate(row)] for row in args["parents"].tolist()]
        )
        extra = dict(draft_proposal="sampled", draft_probs=q.gather(1, first_sibling[..., None].expand_as(q)))
    path, length, token = sv.tree_acceptance_sampler(**args, **extra)
    logits = args["target_logits"].float().nan_to_num(nan=-1.0)
    draft, parents = args["draft_tokens"], args["parents"]
    for b in range(batch):
        current, walked = -1, []
        while True:
            top = int(logits[b, current + 1].argmax())
            match = [i for i in range(nodes) if draft[b, i] == top and parents[b, i] == current]
            if not match:
                break
            current = match[0]
            walked.append(current)
        assert path[b, : length[b]].tolist() == walked and int(token[b]) == top


@pytest.mark.parametrize("proposal", ["argmax", "sampled"])
def test_no_nodes_commits_one_plain_sample(proposal):
    batch = 7
    rng = np.random.default_rng(9)
    logits = torch.as_tensor(rng.normal(size=(batch, V)), dtype=torch.float32)
    params = _params(rng, batch)
    extra = dict(draft_proposal="sampled", draft_probs=torch.zeros(batch, 0, V)) if proposal == "sampled" else {}
    empty = torch.zeros(batch, 0, dtype=torch.int64)
    with forbid_host_reads():
        unchecked = sv.tree_acceptance_sampler(empty, empty, logits, **params, **extra, validate=False)
    path, length, token = sv.tree_acceptance_sampler(empty, empty, logits, **params, **extra)
    assert path.shape == (batch, 0) and (length == 0).all()
    assert torch.equal(
        token,
        sv.sample(
            logits, params["temperature"], params["top_k"], params["top_p"], params["seed"], min_p=params["min_p"]
        ),
    )
    assert all(torch.equal(x, y) for x, y in zip((path, length, token), unchecked))
    assert sv.tree_committed_tokens(empty, path, length, token)[0].tolist() == token[:, None].tolist()


def test_an_empty_batch_returns_empty_shapes():
    out = sv.tree_acceptance_sampler(
        torch.zeros(0, 3, dtype=torch.int64),
        torch.zeros(0, 3, dtype=torch.int64),
        torch.zeros(0, 4, V),
        torch.zeros(0),
        torch.zeros(0, dtype=torch.int64),
        torch.ones(0),
        torch.zeros(0, dtype=torch.int64),
    )
    assert [tuple(t.shape) for t in out] == [(0, 3), (0,), (0,)] and all(t.dtype == torch.int64 for t in out)


@pytest.mark.parametrize("proposal", ["argmax", "sampled"])
def test_validate_false_reads_nothing_back_and_gives_the_same_outputs(code_path, proposal):
    args = _random_tree_args(seed=10)
    if proposal == "sampled":
        batch, nodes = args["draft_tokens"].shape
        # siblings share q: each node's q is a random law of its parent's index
        laws = torch.softmax(torch.randn(batch, nodes + 1, V, generator=torch.Generator().manual_seed(1)), -1)
        parent_index = (args["parents"] + 1).clamp(0, nodes)
        args.update(
            draft_proposal="sampled", draft_probs=laws.gather(1, parent_index[..., None].expand(-1, -1, V)).contiguous()
        )
    before = snapshot(args)
    checked = sv.tree_acceptance_sampler(**args)
    with forbid_host_reads():
        unchecked = sv.tree_acceptance_sampler(**args, validate=False)
    assert all(torch.equal(x, y) for x, y in zip(checked, unchecked))
    assert_untouched(args, before)


def _on_walk(path: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """bool [B, N+1]: the logits indices a row's walk truncates: 0 and i+1 for each accepted node i."""
    batch, nodes = path.shape
    used = torch.zeros(batch, nodes + 1, dtype=torch.bool)
    used[:, 0] = True
    for b in range(batch):
        used[b, path[b, : int(length[b])] + 1] = True
    return used


@pytest.mark.parametrize("masks", [False, True], ids=["no-mask", "mask"])
def test_validate_false_argmax_walk_ignores_the_rows_off_the_walk(code_path, masks):
    # NaN in every logits row the walk does not truncate, present nodes' rows included: the same tokens
    args = _random_tree_args(seed=13, masks=masks)
    batch, nodes = args["draft_tokens"].shape
    clean = sv.tree_acceptance_sampler(**args)
    off_walk = ~_on_walk(clean[0], clean[1])
    present = torch.cat([torch.ones(batch, 1, dtype=torch.bool), args["draft_tokens"] >= 0], dim=1)
    assert (off_walk & present).sum() > batch  # present nodes off the walk were poisoned
    poisoned = args["target_logits"].clone()
    poisoned[off_walk] = float("nan")
    with forbid_host_reads():
        unchecked = sv.tree_acceptance_sampler(**{**args, "target_logits": poisoned}, validate=False)
    assert all(torch.equal(x, y) for x, y in zip(clean, unchecked))


@pytest.mark.skipif(not native_available(), reason="the compiled CPU kernels are unavailable")
@pytest.mark.parametrize("proposal", ["argmax", "sampled"])
def test_validate_false_truncates_only_the_rows_on_the_walk(monkeypatch, proposal):
    # the compiled CPU kernels skip the rows of walks that stopped: the logits rows truncated are exactly
    # those on the walk (index 0, and i+1 for every accepted node i), each once
    args = _random_tree_args(seed=14, masks=False)
    batch, nodes = args["draft_tokens"].shape
    if proposal == "sampled":
        args.update(draft_proposal="sampled", draft_probs=torch.full((batch, nodes, V), 1.0 / V))
    path, length, _ = sv.tree_acceptance_sampler(**args)
    weighed = []
    real_weigh_rows = native.weigh_rows

    def recording(logits, *rest):  # the real kernel, called through; its sources recorded
        source = rest[-1]
        weighed.append(source[source >= 0].clone())
        return real_weigh_rows(logits, *rest)

    monkeypatch.setattr(native, "weigh_rows", recording)
    with backend_path("native"), forbid_host_reads():
        unchecked = sv.tree_acceptance_sampler(**args, validate=False)
    assert all(torch.equal(x, y) for x, y in zip((path, length), unchecked[:2]))
    rows = torch.cat(weighed)
    assert rows.numel() == rows.unique().numel() == int(length.sum()) + batch
    expected = _on_walk(path, length).reshape(-1).nonzero()[:, 0]
    assert torch.equal(rows.sort().values, expected)


def test_validate_true_catches_nan_or_inf_in_the_row_of_any_present_node(code_path):
    args = _random_tree_args(seed=15, batch=6, nodes=5, masks=False)
    draft = args["draft_tokens"]
    batch, nodes = draft.shape
    present = torch.cat([torch.ones(batch, 1, dtype=torch.bool), draft >= 0], dim=1)
    assert not bool(present.all())  # padded indices are there, and ignored
    for b in range(batch):
        for index in range(nodes + 1):
            logits = args["target_logits"].clone()
            logits[b, index, (b + index) % V] = float("nan") if index % 2 else float("inf")
            if present[b, index]:
                value = "nan" if index % 2 else "inf"
                message = f"target_logits must not hold NaN or +inf (got {value} at row {b}, index {index}, token {(b + index) % V})"
                with pytest.raises(ValueError, match=re.escape(message)):
                    sv.tree_acceptance_sampler(**{**args, "target_logits": logits})
            else:
                path, length, token = sv.tree_acceptance_sampler(**{**args, "target_logits": logits})
                assert ((token >= 0) & (token < V)).all()


def test_validate_false_treats_out_of_range_ids_and_parents_as_padding():
    args = _random_tree_args(seed=11, masks=False)
    draft, parents = args["draft_tokens"].clone(), args["parents"].clone()
    batch, nodes = draft.shape
    garbage_draft, garbage_parents = draft.clone(), parents.clone()
    garbage_draft[0::3, 2] = V + 5  # an id out of range
    garbage_draft[1::3, 2] = -7
    garbage_parents[2::3, 2] = 2  # not an earlier node
    garbage_parents[2::6, 2] = nodes + 3
    garbage_parents[5::6, 2] = -4
    with forbid_host_reads():
        path, length, token = sv.tree_acceptance_sampler(
            **{**args, "draft_tokens": garbage_draft, "parents": garbage_parents}, validate=False
        )
    # the same as padding node 2 and everything below it
    below = torch.zeros_like(draft, dtype=torch.bool)
    below[:, 2] = True
    for i in range(3, nodes):
        below[:, i] = (
            (draft[:, i] >= 0) & (parents[:, i] >= 0) & below.gather(1, parents[:, i : i + 1].clamp(0, i - 1))[:, 0]
        )
    padded = torch.where(below, -1, draft)
    assert all(
        torch.equal(x, y)
        for x, y in zip((path, length, token), sv.tree_acceptance_sampler(**{**args, "draft_tokens": padded}))
    )
    assert ((token >= 0) & (token < V)).all()


def test_validate_false_with_garbage_values_still_returns_valid_ids_and_indices():
    rng = np.random.default_rng(12)
    batch, nodes = 16, 6
    logits = torch.as_tensor(rng.normal(size=(batch, nodes + 1, V)), dtype=torch.float32)
    logits[0, 0, 3] = float("nan")
    logits[1, :, :] = float("-inf")
    args = dict(
        draft_tokens=torch.as_tensor(rng.integers(-3, V + 3, size=(batch, nodes))),
        parents=torch.as_tensor(rng.integers(-3, nodes + 3, size=(batch, nodes))),
        target_logits=logits,
        temperature=torch.tensor([-1.0, float("nan")] + [1.0] * (batch - 2)),
        top_k=torch.full((batch,), -9),
        top_p=torch.full((batch,), 1.5),
        seed=5,
        draft_proposal="sampled",
        draft_probs=torch.as_tensor(rng.normal(size=(batch, nodes, V)), dtype=torch.float32),
    )
    with forbid_host_reads():
        path, length, token = sv.tree_acceptance_sampler(**args, validate=False)
    assert ((token >= 0) & (token < V)).all() and ((length >= 0) & (length <= nodes)).all()
    assert ((path >= -1) & (path < nodes)).all()


def test_tree_committed_tokens():
    draft = torch.tensor([[5, 6, 7], [1, 2, 3]])
    tokens, count = sv.tree_committed_tokens(
        draft, torch.tensor([[0, 2, -1], [-1, -1, -1]]), torch.tensor([2, 0]), torch.tensor([9, 4])
    )
    assert tokens.tolist() == [[5, 7, 9, -1], [4, -1, -1, -1]] and count.tolist() == [3, 1]
    with pytest.raises(ValueError, match=re.escape("path_length must be in [0, N = 3] (got 4 at row 1)")):
        sv.tree_committed_tokens(
            draft, torch.zeros(2, 3, dtype=torch.int64), torch.tensor([0, 4]), torch.tensor([1, 1])
        )
    with pytest.raises(
        ValueError,
        match=re.escape("path must hold node indices in [0, 3) before path_length (got -1 at row 0, depth 1)"),
    ):
        sv.tree_committed_tokens(
            draft, torch.tensor([[0, -1, -1], [0, 0, 0]]), torch.tensor([2, 0]), torch.tensor([1, 1])
        )
    with pytest.raises(
        TypeError, match=re.escape("next_token must be an integer tensor [B] (got dtype torch.float32)")
    ):
        sv.tree_committed_tokens(
            draft, torch.zeros(2, 3, dtype=torch.int64), torch.tensor([0, 0]), torch.tensor([1.0, 1.0])
        )


# ---- errors (SPEC §6, §8) ------------------------------------------------------------------------------


def _valid(**overrides) -> dict:
    """A valid sampled-mode call with 2 rows of 4 nodes: node 1 and 2 are children of node 0, node 3 padding."""
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(2, 4, V, generator=g), -1)
    q[:, 2] = q[:, 1]  # siblings share q
    args = dict(
        draft_tokens=torch.tensor([[1, 2, 3, -1], [4, 5, 6, -1]]),
        parents=torch.tensor([[-1, 0, 0, 9], [-1, 0, 0, -1]]),
        target_logits=torch.randn(2, 5, V, generator=g),
        temperature=torch.ones(2),
        top_k=torch.tensor([-1, 3]),
        top_p=torch.ones(2),
        seed=torch.tensor([1, 2]),
        draft_proposal="sampled",
        draft_probs=q,
    )
    args.update(overrides)
    return args


def _edit(name: str, index: tuple, value, **overrides) -> dict:
    args = _valid(**overrides)
    tensor = args[name].clone()
    tensor[index] = value
    args[name] = tensor
    return args


ERRORS = [
    (
        "draft id",
        _edit("draft_tokens", (1, 2), V),
        ValueError,
        f"draft_tokens must be in [-1, {V}) (got {V} at row 1, node 2)",
    ),
    (
        "parent later",
        _edit("parents", (0, 1), 1),
        ValueError,
        "parents must be -1 (the root) or the index of an earlier node, in [-1, i) for node i (got 1 at row 0, node 1)",
    ),
    ("parent out of range", _edit("parents", (1, 2), -2), ValueError, "(got -2 at row 1, node 2)"),
    (
        "parent absent",
        _edit("parents", (1, 3), 2, draft_tokens=torch.tensor([[1, 2, 3, -1], [4, 5, -1, 6]])),
        ValueError,
        "parents must be a present node (not padding) (got 2 at row 1, node 3)",
    ),
    (
        "nan logit",
        _edit("target_logits", (1, 2, 4), float("nan")),
        ValueError,
        "target_logits must not hold NaN or +inf (got nan at row 1, index 2, token 4)",
    ),
    ("inf logit", _edit("target_logits", (0, 0, 0), float("inf")), ValueError, "(got inf at row 0, index 0, token 0)"),
    (
        "empty logits",
        _edit("target_logits", (0, 3), float("-inf")),
        ValueError,
        "target_logits must leave at least one token with a finite logit (got none at row 0, index 3)",
    ),
    (
        "empty mask",
        dict(
            _valid(),
            token_bitmasks=torch.zeros(2, 5, 1, dtype=torch.int32).index_fill(1, torch.tensor([0, 1, 2, 4]), -1),
        ),
        ValueError,
        "token_bitmasks must leave at least one token with a finite logit (got none at row 0, index 3)",
    ),
    (
        "unequal siblings",
        _edit("draft_probs", (1, 2), torch.full((V,), 1.0 / V)),
        ValueError,
        "draft_probs rows of siblings must agree within 1e-6 (got a difference of",
    ),
    (
        "q not normalised",
        _edit("draft_probs", (0, 1), 0.5),
        ValueError,
        "draft_probs rows must sum to 1 (within 1e-3) or be all zero (got a sum of 4.5 at row 0, node 1)",
    ),
    (
        "q negative",
        _edit("draft_probs", (0, 0, 3), -0.5),
        ValueError,
        "draft_probs must be >= 0 (got -0.5 at row 0, node 0, token 3)",
    ),
    (
        "temperature",
        _valid(temperature=torch.tensor([1.0, -1.0])),
        ValueError,
        "temperature must be finite and >= 0 (got -1.0 at row 1)",
    ),
    ("top_p", _valid(top_p=torch.tensor([1.5, 1.0])), ValueError, "top_p must be in (0, 1] (got 1.5 at row 0)"),
    ("min_p", _valid(min_p=torch.tensor([0.0, 2.0])), ValueError, "min_p must be in [0, 1] (got 2.0 at row 1)"),
    (
        "top_k",
        _valid(top_k=torch.tensor([-1, -3])),
        ValueError,
        "top_k must be >= -1 (0 or -1 means no limit) (got -3 at row 1)",
    ),
    (
        "sibling_draws",
        _valid(sibling_draws="iid"),
        ValueError,
        'sibling_draws must be "with_replacement" or "without_replacement" (got \'iid\')',
    ),
    (
        "sibling_draws argmax",
        _valid(sibling_draws=None, draft_proposal="argmax", draft_probs=None),
        ValueError,
        "sibling_draws must be",
    ),
    (
        "proposal",
        _valid(draft_proposal="greedy"),
        ValueError,
        'draft_proposal must be "argmax" or "sampled" (got \'greedy\')',
    ),
    (
        "q missing",
        _valid(draft_probs=None),
        ValueError,
        'draft_probs is required when draft_proposal="sampled" (got None)',
    ),
    (
        "q with argmax",
        _valid(draft_proposal="argmax"),
        ValueError,
        'draft_probs must be None when draft_proposal="argmax" (got a tensor)',
    ),
    (
        "q shape",
        _valid(draft_probs=torch.zeros(2, 3, V)),
        ValueError,
        f"draft_probs must have shape [B, N, V] = [2, 4, {V}] (got [2, 3, {V}])",
    ),
    (
        "parents shape",
        _valid(parents=torch.zeros(2, 3, dtype=torch.int64)),
        ValueError,
        "parents must have shape [B, N] = [2, 4] (got [2, 3])",
    ),
    (
        "parents dtype",
        _valid(parents=torch.zeros(2, 4)),
        TypeError,
        "parents must be an int32 or int64 tensor [B, N] (got dtype torch.float32)",
    ),
    (
        "draft dtype",
        _valid(draft_tokens=torch.zeros(2, 4)),
        TypeError,
        "draft_tokens must be an int32 or int64 tensor [B, N] (got dtype torch.float32)",
    ),
    (
        "logits shape",
        _valid(target_logits=torch.zeros(2, 4, V)),
        ValueError,
        f"target_logits must have shape [B*(N+1), V] = [10, V] or [B, N+1, V] = [2, 5, V] with V >= 1 (got [2, 4, {V}])",
    ),
    (
        "mask shape",
        _valid(token_bitmasks=torch.zeros(2, 4, 1, dtype=torch.int32)),
        ValueError,
        "token_bitmasks must have shape [B, N+1, ceil(V/32)] = [2, 5, 1] (got [2, 4, 1])",
    ),
    (
        "seed",
        _valid(seed=torch.zeros(3, dtype=torch.int64)),
        ValueError,
        "seed must be an int, a 0-d or [1] tensor, or a tensor of shape [B] = [2]",
    ),
]


@pytest.mark.parametrize("args, exc, message", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_input_names_the_argument_the_rule_and_the_value(args, exc, message):
    before = snapshot(args)
    with pytest.raises(exc, match=re.escape(message)):
        sv.tree_acceptance_sampler(**args)
    assert_untouched(args, before)


def test_padded_nodes_rows_are_ignored_even_when_invalid():
    args = _valid()
    for name, index in (("target_logits", (0, 4)), ("draft_probs", (1, 3))):
        args[name] = args[name].clone()
        args[name][index] = float("nan")  # node 3 is padding: its logits (index 4) and q row are ignored
    path, length, token = sv.tree_acceptance_sampler(**args)
    assert ((token >= 0) & (token < V)).all()
