"""A tree verifier call (SPEC §8) walked depth by depth over a backend's per-row ops: the whole-call op
`verify_tree` of every backend (tree.py, above, checks the call and says what one step does).
"""

from __future__ import annotations

import torch

from ...bitmask import apply_bitmask
from ...rng import STREAM_RESIDUAL, STREAM_TARGET, keyed_uniform, sibling_stream
from ..interface import Ops, TreeCall
from .categorical import sample_from_weights, total_weight
from .rules import sampled_verdict
from .weights import is_greedy, truncated_weights


def verify_tree(call: TreeCall, ops: Ops, skips_rows_cheaply: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """interface.WholeCallOps.verify_tree in steps over the backend's per-row ops. skips_rows_cheaply: the backend's weigh_rows skips a row
    whose source is negative at next to no cost (the C kernels), so a walk without host reads steps over
    every row instead of judging every node at once."""
    return _Walk(call, ops, skips_rows_cheaply).run(call.validate)


class _Walk:
    """One call's checked inputs and the walk over them.

    draft: int64 [B, N], -1 where no node; parents: int64 [B, N]; logits: [B, N+1, V] (kept as
    [B*(N+1), V]); token_bitmasks: int32 [B, N+1, W] or None (None also when the logits come masked);
    temperature, top_k, top_p, min_p: [B]; seeds: int64 [B] (s_b); draft_probs: float [B, N, V] or None
    (argmax mode); without_replacement: the sibling scheme.
    """

    def __init__(self, call: TreeCall, ops: Ops, skips_rows_cheaply: bool):
        self.draft, self.parents, self.token_bitmasks = call.draft, call.parents, call.bitmask
        self.logits = call.logits.reshape(-1, call.logits.shape[-1]).contiguous()  # [B*(N+1), V]: a view unless strided
        self.temperature, self.top_k, self.top_p, self.min_p = call.temperature, call.top_k, call.top_p, call.min_p
        self.seeds, self.draft_probs, self.without_replacement = call.seeds, call.draft_probs, call.without_replacement
        self.ops, self.skips_rows_cheaply = ops, skips_rows_cheaply

    def run(self, validate: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Walk every row from the root -> (path [B, N], path_length [B], next_token [B]), int64.

        validate=True: each step judges the current node of the rows still walking, and the walk ends when
        none is (host reads). validate=False cannot learn where rows stop: where the backend skips rows at
        no cost (skips_rows_cheaply: the native CPU kernels), N + 1 steps run over every row and a row
        that has stopped is skipped inside the kernel, so only the rows on the walk are truncated;
        elsewhere, in argmax mode every node is judged at once (one truncation of all N + 1 logits rows, as
        a chain of K = N would: on a GPU one launch over every row costs less than N + 1 of them) and the
        walk looks its steps up, and in sampled mode N + 1 steps judge every row."""
        batch, nodes = self.draft.shape
        device = self.logits.device
        current = torch.full((batch,), -1, dtype=torch.int64, device=device)  # -1: the root
        walking = torch.ones(batch, dtype=torch.bool, device=device)
        path = torch.full((batch, nodes), -1, dtype=torch.int64, device=device)
        next_token = torch.zeros(batch, dtype=torch.int64, device=device)
        all_rows = torch.arange(batch, device=device)
        stepping = validate or self.draft_probs is not None or self.skips_rows_cheaply
        table = None if stepping else self._judge_every_node()
        for depth in range(nodes + 1):
            if table is not None:
                rows = all_rows
                child, token = (t.gather(1, current[:, None] + 1)[:, 0] for t in table)
            else:
                rows = walking.nonzero()[:, 0] if validate else all_rows
                if validate and rows.numel() == 0:
                    break
                at = current.index_select(0, rows)
                source = torch.where(walking.index_select(0, rows), rows * (nodes + 1) + at + 1, -1)
                child, token = self._step(rows, at, depth, validate, source)
            chosen = torch.full_like(current, -1).index_copy(0, rows, child)
            descend = walking & (chosen >= 0)
            stop = walking & ~descend
            next_token = torch.where(stop, torch.zeros_like(next_token).index_copy(0, rows, token), next_token)
            if depth < nodes:
                path[:, depth] = torch.where(descend, chosen, -1)
            current = torch.where(descend, chosen, current)
            walking = descend
        return path, (path >= 0).sum(-1), next_token

    def _judge_every_node(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Argmax mode at every index at once, each keyed by its depth -> (child, token), int64 [B, N+1]:
        what _step gives at the node whose children index x scores (x = 0: the root)."""
        batch, nodes = self.draft.shape
        device = self.logits.device
        rows = torch.arange(batch, device=device).repeat_interleave(nodes + 1)
        current = torch.arange(-1, nodes, device=device).repeat(batch)
        root = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        depth = torch.cat([root, _node_depths(self.parents) + 1], dim=1)
        child, token = self._step(rows, current, depth.reshape(-1), False, None)
        return child.view(batch, nodes + 1), token.view(batch, nodes + 1)

    def _children(self, rows: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """bool [R, N]: the present nodes whose parent is the current node (a smaller index)."""
        nodes = torch.arange(self.draft.shape[1], device=rows.device)
        parents = self.parents.index_select(0, rows)
        present = self.draft.index_select(0, rows) >= 0
        return present & (parents == current[:, None]) & (nodes > current[:, None])

    def _step(
        self,
        rows: torch.Tensor,
        current: torch.Tensor,
        depth: int | torch.Tensor,
        validate: bool,
        source: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Judge the children of each row's current node. rows: int64 [R]; current: int64 [R] (-1: root);
        depth: the walk's depth there (int, or int64 [R]); source: int64 [R], the row of the [B*(N+1), V]
        logits that scores those children (b * (N+1) + current + 1), -1 for a row that has stopped (not
        truncated where the backend skips rows; its results are ignored); None: logits row r (R = B*(N+1)).

        Returns (child int64 [R]: the node descended into, -1 to stop; token int64 [R]: the token committed
        when stopping)."""
        logits = self.logits
        if self.token_bitmasks is not None:  # a masked copy of the rows in use
            masks = self.token_bitmasks.reshape(-1, self.token_bitmasks.shape[-1])
            if source is not None:  # (indexing copies rows of this size far faster than index_select)
                taken = source.clamp(min=0)
                logits, masks = logits[taken], masks[taken]
                source = torch.where(source >= 0, torch.arange(source.shape[0], device=source.device), -1)
            logits = apply_bitmask(logits, masks)

        def pick(t):
            return None if t is None else t.index_select(0, rows)

        weights, sums = truncated_weights(
            self.ops,
            logits,
            pick(self.temperature),
            pick(self.top_k),
            pick(self.top_p),
            pick(self.min_p),
            source=source,
        )
        keys = pick(self.seeds) + depth
        children = self._children(rows, current)
        drafted = self.draft.index_select(0, rows)
        target_sample = sample_from_weights(self.ops, weights, keyed_uniform(keys, STREAM_TARGET), sums)
        match = children & (drafted == target_sample[:, None])
        argmax_child = _first_true(match)
        if self.draft_probs is None:
            return argmax_child, target_sample
        # the most children any row may have here: read when validating, else bounded by the depth
        # (a node at depth j - 1 has an index >= j - 1, so at most N - j nodes come after it)
        nodes = self.draft.shape[1]
        ranks = int(children.sum(-1).max()) if validate else (nodes if depth == 0 else nodes - depth)
        child, token = _sampled_step(
            self.ops,
            weights,
            sums,
            children,
            drafted,
            self.draft_probs,
            rows,
            keys,
            target_sample,
            ranks,
            self.without_replacement,
        )
        greedy = is_greedy(pick(self.temperature))  # greedy rows follow the argmax in either mode
        return torch.where(greedy, argmax_child, child), torch.where(greedy, target_sample, token)


def _node_depths(parents: torch.Tensor) -> torch.Tensor:
    """Each node's depth (the root's children: 0), by pointer jumping; a node whose parent is not an
    earlier node counts as a child of the root (it is never walked into). parents: int64 [B, N] -> [B, N]."""
    batch, nodes = parents.shape
    linked = (parents >= 0) & (parents < torch.arange(nodes, device=parents.device))
    root = torch.full((batch, 1), nodes, dtype=torch.int64, device=parents.device)  # a column for the root
    up = torch.cat([torch.where(linked, parents, nodes), root], dim=1)
    depth = torch.cat([linked.to(torch.int64), torch.zeros_like(root)], dim=1)
    for _ in range(max(nodes, 1).bit_length()):  # 2**steps ancestors >= N: every chain reaches the root
        depth = depth + depth.gather(1, up)
        up = up.gather(1, up)
    return depth[:, :nodes]


def _first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True of each row, -1 where none. mask: bool [R, N] -> int64 [R]."""
    if mask.shape[-1] == 0:
        return torch.full(mask.shape[:-1], -1, dtype=torch.int64, device=mask.device)
    return torch.where(mask.any(-1), mask.to(torch.int8).argmax(-1), -1)


def _sampled_step(
    ops: Ops,
    weights: torch.Tensor,
    sums: torch.Tensor,
    children: torch.Tensor,
    drafted: torch.Tensor,
    draft_probs: torch.Tensor,
    rows: torch.Tensor,
    keys: torch.Tensor,
    leaf_sample: torch.Tensor,
    ranks: int,
    without_replacement: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled rule at one node per row (module docstring): (child [R] or -1, token [R]).

    weights: float32 [R, V], p~ unnormalised, with sums: float64 [R, blocks], their block sums;
    children: bool [R, N]; drafted: int64 [R, N], the row's node tokens; draft_probs: float [B, N, V] and
    rows: int64 [R], the batch row of each;
    keys: int64 [R], s_b + depth; leaf_sample: int64 [R], the target-stream draw (a leaf's bonus);
    ranks: an upper bound on the children per row.
    """
    count = children.sum(-1)
    if ranks == 0:
        return torch.full_like(count, -1), leaf_sample
    order = torch.sort((~children).to(torch.int8), dim=-1, stable=True).indices  # children first, by index
    first = order[:, 0]
    q = draft_probs[rows, first]  # the children's q: [R, V]

    def token_of(node):
        return drafted.gather(1, node[:, None])[:, 0]

    first_token = torch.where(count > 0, token_of(first), -1)
    residual_uniforms = keyed_uniform(keys, STREAM_RESIDUAL)
    accepted, recovered = sampled_verdict(
        ops,
        first_token[:, None],
        weights[:, None],
        sums[:, None],
        q[:, None],
        keyed_uniform(keys, sibling_stream(0))[:, None],
        residual_uniforms[:, None],
    )
    child = torch.where(accepted[:, 0], first, -1)
    token = torch.where(count == 0, leaf_sample, recovered[:, 0])  # rank 0 judged, and its recovery
    if ranks >= 2:
        later_child, later_token = _later_siblings(
            ops,
            weights,
            sums,
            count,
            order,
            token_of,
            q,
            first_token,
            accepted[:, 0],
            keys,
            residual_uniforms,
            ranks,
            without_replacement,
        )
        later = count >= 2
        child = torch.where(later & (child < 0), later_child, child)
        token = torch.where(later, later_token, token)
    return child, token


def _later_siblings(
    ops,
    weights,
    sums,
    count,
    order,
    token_of,
    q,
    first_token,
    first_accepted,
    keys,
    residual_uniforms,
    ranks,
    without_replacement,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ranks 1.. of the sampled rule for rows whose first child was rejected.

    r is carried unnormalised, as a float32 row `residual` edited in place and its mass (r = residual /
    mass), and q as a float32 row `proposal` and a scale (q = proposal * scale): a rejection costs one
    subtraction, one clamp and one sum over V; q's renormalisation (without replacement) costs nothing.
    Returns (child [R] or -1, token [R]: the accepted child's token, or the draw from the final residual
    when every child was rejected). Shapes as in _sampled_step; order: int64 [R, N], children first."""
    target = weights / total_weight(sums)[..., None].float()  # p~ as truncated_probs gives it
    residual = target.clone()
    mass = residual.sum(-1).double()  # (a float32 sum, in cascades: a float64 accumulator is 20x slower)
    proposal = torch.where((count >= 2)[:, None], q, 0.0).float()  # a copy; q of other rows is never read
    scale = torch.ones_like(mass)
    left = proposal.sum(-1).double()  # q's mass, while q loses tokens (without replacement)
    child = torch.full_like(count, -1)
    token = torch.zeros_like(count)
    rejected, last = ~first_accepted & (count >= 1), first_token

    def column(values, tokens):
        return values.gather(1, tokens[:, None])[:, 0].double()

    for rank in range(1, ranks + 1):
        # r = max(0, r - q) renormalised, or r without the token where q(token) == 0 (judged without q)
        at = last.clamp(min=0)
        blind = column(proposal, at) * scale <= 0
        residual.addcmul_(proposal, torch.where(rejected & ~blind, mass * scale, 0.0).float()[:, None], value=-1)
        residual.clamp_(min=0).scatter_(
            1, at[:, None], torch.where(rejected & blind, 0.0, column(residual, at)).float()[:, None]
        )
        mass = residual.sum(-1).double()
        if without_replacement:  # q loses the token, renormalised
            left = torch.where(rejected, left - column(proposal, at), left)
            proposal.scatter_(1, at[:, None], torch.where(rejected, 0.0, column(proposal, at)).float()[:, None])
            scale = torch.where(rejected, torch.where(left > 0, 1.0 / left.clamp(min=1e-300), 0.0), scale)
        if rank == ranks:
            break
        node = order[:, rank]
        judged = rejected & (rank < count)
        candidate = torch.where(judged, token_of(node), 0)
        r_c = column(residual, candidate) / torch.where(mass > 0, mass, 1.0)
        q_c = column(proposal, candidate) * scale
        coin = keyed_uniform(keys, sibling_stream(rank))
        accept = judged & ~(coin * torch.where(q_c <= 0, 1.0, q_c) >= r_c)  # q(c) == 0: judged without q
        child = torch.where(accept, node, child)
        token = torch.where(accept, candidate, token)
        rejected, last = judged & ~accept, torch.where(judged, candidate, last)
    empty = (mass <= 0)[:, None]  # lost all its mass (only by rounding): draw from p~
    drawn = sample_from_weights(ops, torch.where(empty, target, residual), residual_uniforms)
    return child, torch.where(child >= 0, token, drawn)
