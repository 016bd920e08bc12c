"""Tree scenarios (SPEC §8): a verifier with the `tree_acceptance_sampler` signature, held to exact laws.

A tree scenario fixes the tree's shape (sibling groups, in index order) and the target logits of every
index; each row draws the tokens of each sibling group afresh from that index's draft law (i.i.d. or
without replacement, as `draws` says) and has its own seed. Given that the walk reached an index, the
children there are fresh draws, so the token committed at that index has one exact law:
`exact.tree_node_law` averaged over the draws, which for a lossless verifier is p~ of that index. The
walk's length has an exact law too (the product of the descent probabilities along each path).

The report reads a tree scenario as it reads a chain: its "positions" are the N + 1 logits indices
(index 0: the root), K is N, and the first rejection is the path length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import torch

from ..contract import PAD
from .calls import Observation, batched_call, min_p_and_mask, row_problems, shape_problems
from .exact import GREEDY_TEMPERATURE, tree_node_law, truncated_distribution
from .scenarios import (
    Laws,
    check_kept_sets_stable,
    draft_distribution,
    grammar_mask,
    named_rng,
    scenario_matrix,
    small_logits,
)
from .verifier import DEFAULT_TREE_VERIFIER, DEFAULT_VERIFIER, Verifier, load_verifier

#: (parent, siblings) per sibling group, in index order: nodes 0-2 hang from the root, 3-4 from node 0,
#: 5-6 from node 1, 7 from node 3. N = 8, depth 3, duplicates possible among siblings.
DEFAULT_SHAPE = ((-1, 3), (0, 2), (1, 2), (3, 1))


@dataclass(frozen=True, eq=False)
class TreeScenario:
    """One audited tree situation. N = nodes, V = vocabulary.

    logits: float32 [N+1, V] (index 0: the root, i+1: node i); groups: (parent, siblings) per sibling
    group; draft_law: float64 [N+1, V], the law the children of each index are drawn from ("sampled"
    passes it as their q); allowed: bool [N+1, V] or None."""

    name: str
    about: str
    logits: np.ndarray
    groups: tuple[tuple[int, int], ...]
    draft_law: np.ndarray
    rows: int
    draws: str = "with_replacement"
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    allowed: np.ndarray | None = None
    draft_proposal: str = "argmax"
    quick: bool = False
    lossless = True
    dtype = "float32"
    tree = True  # a tree scenario, for a tree verifier

    @property
    def positions(self) -> int:
        """N (the longest path), the report's K."""
        return sum(siblings for _, siblings in self.groups)

    @property
    def vocab(self) -> int:
        return self.logits.shape[-1]

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def parents(self) -> np.ndarray:
        """int64 [N]: each node's parent."""
        return np.array([parent for parent, siblings in self.groups for _ in range(siblings)], dtype=np.int64)

    @property
    def setting(self) -> str:
        parts = [f"tree {self.positions} nodes", "greedy" if self.greedy else f"T={self.temperature:g}"]
        parts += [f"top-k {self.top_k}"] if self.top_k > 0 else []
        parts += [f"top-p {self.top_p:g}"] if self.top_p < 1 else []
        parts += [f"min-p {self.min_p:g}"] if self.min_p > 0 else []
        parts += ["mask"] if self.allowed is not None else []
        parts += [self.draws.replace("_", " ")] if self.draft_proposal == "sampled" else []
        return " · ".join(parts)

    def target(self, index: int) -> np.ndarray:
        """p~ of a logits index, float64 [V]."""
        allowed = None if self.allowed is None else self.allowed[index]
        return truncated_distribution(self.logits[index], self.temperature, self.top_k, self.top_p, self.min_p, allowed)

    @cached_property
    def laws(self) -> Laws:
        return exact_tree_laws(self)

    def draw(self, rows: int, rng: np.random.Generator) -> np.ndarray:
        """int64 [rows, N]: each sibling group's tokens drawn from its index's draft law, as `draws` says."""
        columns = []
        for parent, siblings in self.groups:
            law = self.draft_law[parent + 1]
            uniform = np.full(len(law), 1 / len(law))
            left = np.broadcast_to(law / law.sum() if law.sum() else uniform, (rows, len(law))).copy()
            for _ in range(siblings):
                cumulative = left.cumsum(-1)
                tokens = (cumulative < rng.random((rows, 1)) * cumulative[:, -1:]).sum(-1).clip(0, len(law) - 1)
                columns.append(tokens)
                if self.draws == "without_replacement":
                    left[np.arange(rows), tokens] = 0.0
        return np.stack(columns, axis=1).astype(np.int64)

    def arguments(self, drafts: np.ndarray, seeds: np.ndarray, device: str) -> tuple[tuple, dict]:
        """(the seven positional arguments, the optional ones this scenario needs) of the batched call.
        drafts: int64 [rows, N]; seeds: int64 [rows]."""
        rows, nodes = drafts.shape

        def to(array, dtype):
            return torch.as_tensor(array, dtype=dtype, device=device)

        positional = (
            to(drafts, torch.int64),
            to(np.tile(self.parents, (rows, 1)), torch.int64),
            torch.from_numpy(self.logits).to(device)[None].expand(rows, nodes + 1, self.vocab).contiguous(),
            to(np.full(rows, self.temperature), torch.float32),
            to(np.full(rows, self.top_k), torch.int64),
            to(np.full(rows, self.top_p), torch.float32),
            to(seeds, torch.int64),
        )
        optional = min_p_and_mask(self.min_p, self.allowed, rows, device)
        if self.draft_proposal == "sampled":
            q = torch.as_tensor(self.draft_law[self.parents + 1], dtype=torch.float32, device=device)
            optional.update(
                draft_proposal="sampled",
                draft_probs=q[None].expand(rows, *q.shape).contiguous(),
                sibling_draws=self.draws,
            )
        return positional, optional

    def observe(self, verifier: Verifier, rows: int, seed: int, device: str = "cpu") -> Observation:
        """Draw the drafts and seeds, make the one batched call and collect the token committed at each index.

        Observation.first is the path length; committed [rows, N+1] holds at column x the token committed at
        index x by the rows whose walk reached it, PAD elsewhere."""
        drafts, (path, length, token), seconds = batched_call(verifier, self, rows, seed, device)
        nodes = self.positions
        problems = tuple(tree_contract_problems(drafts, self.parents, path, length, token, self.vocab))
        committed = np.full((rows, nodes + 1), PAD, dtype=np.int64)
        if not problems:
            row = np.arange(rows)
            for d in range(nodes + 1):  # step d of the walk is at index 0 (d = 0) or path[d - 1] + 1
                walking = length >= d
                index = np.zeros(rows, dtype=np.int64) if d == 0 else path[:, d - 1] + 1
                accepted = drafts[row, path[:, d].clip(0)] if d < nodes else token
                committed[row[walking], index[walking]] = np.where(length > d, accepted, token)[walking]
        return Observation(length.astype(np.int64), committed, seconds, problems)


def exact_tree_laws(scenario: TreeScenario) -> Laws:
    """target, committed: float64 [N+1, V] per index; first_rejection: the law of the path length [N+1];
    accept: [N], P(length >= d + 1 | length >= d)."""
    nodes = scenario.positions
    parents = scenario.parents
    target = np.stack([scenario.target(x) for x in range(nodes + 1)])
    committed = np.zeros_like(target)
    reach, depth = np.zeros(nodes + 1), np.zeros(nodes + 1, dtype=np.int64)
    reach[0] = 1.0
    length = np.zeros(nodes + 1)
    for x in range(nodes + 1):  # parents have smaller indices: each index is reached before its children
        children = np.flatnonzero(parents == x - 1)
        # greedy rows follow the argmax in either mode; p~ of a greedy row is one-hot at it
        proposal = "argmax" if scenario.greedy else scenario.draft_proposal
        descend, stop = tree_node_law(target[x], scenario.draft_law[x], len(children), scenario.draws, proposal)
        committed[x] = descend.sum(0) + stop
        length[depth[x]] += reach[x] * stop.sum()
        for rank, child in enumerate(children):
            reach[child + 1] = reach[x] * descend[rank].sum()
            depth[child + 1] = depth[x] + 1
    reached = length[::-1].cumsum()[::-1]  # P(length >= d)
    accept = np.divide(reached[1:], reached[:-1], out=np.zeros(nodes), where=reached[:-1] > 0)
    return Laws(target, committed, accept, length)


def tree_contract_problems(
    drafts: np.ndarray, parents: np.ndarray, path: np.ndarray, length: np.ndarray, token: np.ndarray, vocab: int
) -> list[str]:
    """SPEC §8 on one call's outputs (drafts [rows, N]; parents [N]; path [rows, N]; length, token [rows]):
    shapes; 0 <= length <= N; the path descends from the root through children; PAD after it; next_token
    in [0, V). Each problem names a row."""
    rows, nodes = drafts.shape
    wrong = shape_problems(
        {"path": (path, (rows, nodes)), "path_length": (length, (rows,)), "next_token": (token, (rows,))}
    )
    if wrong:
        return wrong
    on_path = np.arange(nodes)[None, :] < length[:, None]
    node = np.where(on_path, path, 0).clip(0, max(nodes - 1, 0))
    expected_parent = np.concatenate([np.full((rows, 1), -1), node[:, :-1]], axis=1)
    inside = (path >= 0) & (path < nodes)
    return [
        *row_problems((length < 0) | (length > nodes), f"path_length outside [0, {nodes}]"),
        *row_problems((~on_path & (path != PAD)).any(1), "path not -1 after path_length"),
        *row_problems(
            (on_path & (~inside | (parents[node] != expected_parent))).any(1), "a path that is not a walk down the tree"
        ),
        *row_problems((token < 0) | (token >= vocab), f"next_token outside [0, {vocab})"),
    ]


def check_tree_well_posed(scenario: TreeScenario) -> None:
    """Raise ValueError if a kept set changes when top_p or min_p move by BOUNDARY_MARGIN, or if siblings
    drawn without replacement could run out of tokens."""
    if scenario.draws == "without_replacement":
        for parent, siblings in scenario.groups:
            if np.count_nonzero(scenario.draft_law[parent + 1]) < siblings:
                raise ValueError(
                    f"scenario {scenario.name}: index {parent + 1} cannot draw {siblings} distinct siblings"
                )
    check_kept_sets_stable(scenario, where="index")


def tree_scenario(
    name: str,
    about: str,
    *,
    q: str = "model",
    proposal: str = "argmax",
    draws: str = "with_replacement",
    groups: tuple = DEFAULT_SHAPE,
    vocab: int = 12,
    rows: int = 30_000,
    mask: float = 0.0,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
    quick: bool = False,
) -> TreeScenario:
    """Build one tree scenario; q: a kind of scenarios.draft_distribution, the draft law of every index."""
    rng = named_rng(name)
    nodes = sum(siblings for _, siblings in groups)
    logits = small_logits(rng, nodes, vocab)
    allowed = grammar_mask(rng, logits, mask) if mask else None
    base = TreeScenario(
        name,
        about,
        logits,
        tuple(groups),
        np.zeros((nodes + 1, vocab)),
        rows,
        draws,
        temperature,
        top_k,
        top_p,
        min_p,
        allowed,
        proposal,
        quick,
    )
    targets = np.stack([base.target(x) for x in range(nodes + 1)])

    # draft_distribution makes q for all but its last row: give it one row more than there are indices
    def padded(a):
        return np.concatenate([a, a[-1:]])

    law = draft_distribution(rng, q, padded(logits), padded(targets))
    scenario = replace(base, draft_law=law)
    check_tree_well_posed(scenario)
    return scenario


def tree_scenario_matrix() -> list[TreeScenario]:
    """The tree scenarios of the default audit; those marked quick are in --quick."""
    wide = ((-1, 4), (0, 3), (1, 2))
    return [
        tree_scenario("tree/argmax/plain", "argmax walk; children from a draft model, duplicates possible", quick=True),
        tree_scenario(
            "tree/argmax/mix+mask",
            "every truncation and a grammar mask",
            temperature=0.8,
            top_k=6,
            top_p=0.8,
            min_p=0.05,
            mask=0.4,
            quick=True,
        ),
        tree_scenario("tree/argmax/greedy", "greedy rows follow the argmax down the tree", temperature=0.0, mask=0.3),
        tree_scenario(
            "tree/sampled/with-replacement",
            "siblings drawn i.i.d. from q (SpecInfer)",
            proposal="sampled",
            top_p=0.9,
            quick=True,
        ),
        tree_scenario(
            "tree/sampled/without-replacement",
            "siblings drawn without replacement (recursive rejection)",
            proposal="sampled",
            draws="without_replacement",
            top_p=0.9,
            quick=True,
        ),
        tree_scenario(
            "tree/sampled/wide+mask",
            "4 root children, a grammar mask, top-k and min-p",
            groups=wide,
            proposal="sampled",
            draws="without_replacement",
            q="close",
            temperature=0.9,
            top_k=7,
            min_p=0.05,
            mask=0.3,
        ),
        tree_scenario(
            "tree/sampled/outside",
            "q puts 80% of its mass outside the nucleus",
            q="outside",
            proposal="sampled",
            top_p=0.7,
        ),
        tree_scenario(
            "tree/sampled/greedy",
            "greedy rows ignore q and follow the argmax",
            proposal="sampled",
            q="close",
            temperature=0.0,
        ),
    ]


def audited_verifiers(spec: str, tree: bool) -> tuple[Verifier, Verifier | None, list]:
    """What `specverify audit --verifier SPEC [--tree]` audits -> (verifier, tree verifier or None, scenarios).

    specverify's chain verifier (the default) without --tree: both of specverify's verifiers, each on its
    scenarios. --tree alone: specverify's tree verifier on the tree scenarios. Any other verifier: on the
    tree scenarios when it is a tree verifier (--tree, or a parameter named `parents`), else on the chain
    scenarios. ValueError when the verifier cannot be loaded."""
    if spec == DEFAULT_VERIFIER:
        if tree:
            return load_verifier(DEFAULT_TREE_VERIFIER, tree=True), None, tree_scenario_matrix()
        return load_verifier(spec), load_verifier(DEFAULT_TREE_VERIFIER), scenario_matrix() + tree_scenario_matrix()
    verifier = load_verifier(spec, tree=True if tree else None)
    return verifier, None, tree_scenario_matrix() if verifier.tree else scenario_matrix()
