"""`tree_acceptance_sampler` (SPEC §8): lossless verification of a draft tree, walked depth by depth.

A row's draft is a tree of N nodes; index 0 of the logits scores the root's children, index i+1 those of
node i. The walk starts at the root; at depth j it judges the children of the current node with keys
(s_b + j, stream) and either descends into one child or commits a token and stops. Every step is batched
over the rows still walking; only the logits rows on the walk are truncated (at most depth + 1 of the
N + 1 per row), read in place (no gathered copy), so the cost follows the depth, not the node count.
(With validate=False nothing may be read back to learn where rows stop: N + 1 steps run over every row,
and the native CPU kernels skip the rows that have stopped, so only the walk's rows are still truncated;
on backends that do not skip rows for free (Triton, torch) argmax mode judges every node in one
truncation and looks the walk up, and sampled mode truncates every row at each step.)

What one step does at the current node (p~ its truncated target, SPEC §2):
- "argmax" (and every greedy row, in either mode): draw y ~ p~ (target stream; the argmax for greedy
  rows), descend into the lowest-index child with token y, else commit y.
- "sampled": r = p~ and q = the children's draft distribution; each child c in index order is rejected
  iff u * q(c) >= r(c) (rank 0 on the chain's accept stream, rank k >= 1 on `rng.sibling_stream(k)`); on a
  rejection r = max(0, r - q) renormalised (without replacement q also loses c, renormalised). When every
  child is rejected a draw from r is committed (residual stream; p~ when r has no mass).
- a leaf (no child): the bonus, a draw from p~ (target stream).
Rank 0 is judged by `stages.rules.sampled_verdict`, the chain's own rule, so a tree whose nodes form one chain
gives the chain verifier's results bit for bit; later ranks carry r and q as float32 rows.
"""

from __future__ import annotations

import torch

from . import checks, kernels
from .bitmask import apply_bitmask, num_words
from .contract import DRAFT_PROPOSALS, SIBLING_DRAWS
from .kernels.stages.categorical import sample_from_weights, total_weight
from .kernels.stages.rules import sampled_verdict
from .kernels.stages.weights import is_greedy, truncated_weights
from .rng import STREAM_RESIDUAL, STREAM_TARGET, keyed_uniform, per_row_seeds, sibling_stream


def tree_acceptance_sampler(
    draft_tokens: torch.Tensor,
    parents: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: int | torch.Tensor,
    *,
    min_p: torch.Tensor | None = None,
    token_bitmasks: torch.Tensor | None = None,
    draft_proposal: str = "argmax",
    draft_probs: torch.Tensor | None = None,
    sibling_draws: str = "with_replacement",
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify a draft tree per request (SPEC §8): the accepted path and the token committed after it.

    draft_tokens: int32/int64 [B, N], each node's token; -1 is padding (anywhere).
    parents: int32/int64 [B, N]; -1 = a child of the root, else a present node with a smaller index.
    target_logits: float32/float16/bfloat16 [B, N+1, V] or [B*(N+1), V]; index 0 scores the root's
    children, index i+1 node i's children.
    temperature, top_k, top_p, min_p: [B] (or Python numbers for every row), as in
    stochastic_acceptance_sampler; seed: int or 0-d/[1] integer tensor shared by the batch, or [B].
    token_bitmasks: int32 [B, N+1, ceil(V/32)] or None, indexed as target_logits.
    draft_proposal: "argmax" or "sampled"; draft_probs: float [B, N, V], q of each node (siblings share
    it), required for "sampled" and an error for "argmax"; sibling_draws: "with_replacement" (siblings
    drawn i.i.d. from q) or "without_replacement" (each from q without the earlier siblings), checked in
    every mode and used only by "sampled".
    validate: check every value (SPEC §6) at every index in use; False reads nothing back to the host.
    validate=True walks only as deep as some row still walks, over the rows still walking (cost ~ depth),
    after one streaming pass over every index in use for NaN/+inf. Without host reads the walk cannot
    learn where rows stop: validate=False runs N + 1 steps over every row (sampled mode: each up to
    N - depth siblings deep), in which the native CPU kernels skip the rows that stopped (cost ~ depth
    again, plus a few small ops per step); where rows cannot be skipped for free (Triton on a GPU, where
    one launch over every row costs less than N + 1; the torch reference) argmax mode judges every node
    in one truncation instead (the cost of a chain of K = N).

    Returns int64 tensors on the device of target_logits: path [B, N] (the accepted nodes from depth 0
    down, -1 after them), path_length [B], next_token [B] (the recovered token or the bonus). Row b commits
    draft_tokens[b, path[b, :L]] then next_token[b] (see tree_committed_tokens).
    Padded nodes, and their parents, logits, masks and q rows, are ignored. With validate=False a node
    whose id or parent is out of range is treated as padding, and so is every node below it.
    """
    checks.check_tensor("draft_tokens", draft_tokens, checks.INDEX_DTYPES, "an int32 or int64 tensor [B, N]")
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must have shape [B, N] (got {list(draft_tokens.shape)})")
    batch, nodes = draft_tokens.shape
    checks.check_tensor("parents", parents, checks.INDEX_DTYPES, "an int32 or int64 tensor [B, N]")
    checks.check_shape("parents", parents, (batch, nodes), "[B, N]")
    logits = checks.check_logits_3d(target_logits, batch, nodes, positions="N")
    vocab, device = logits.shape[-1], logits.device
    if draft_proposal not in DRAFT_PROPOSALS:
        raise ValueError(f'draft_proposal must be "argmax" or "sampled" (got {draft_proposal!r})')
    if sibling_draws not in SIBLING_DRAWS:
        raise ValueError(f'sibling_draws must be "with_replacement" or "without_replacement" (got {sibling_draws!r})')
    temperature, top_k, top_p, min_p = checks.check_sampling_params(
        temperature, top_k, top_p, min_p, batch, device, "[B]"
    )
    seed, shared_seed = checks.check_seed(seed, batch, device)
    checks.check_masks_and_draft_probs(
        token_bitmasks, draft_proposal, draft_probs, "draft_probs", batch, nodes, vocab, num_words(vocab), positions="N"
    )
    checks.check_same_device(
        {
            "draft_tokens": draft_tokens,
            "parents": parents,
            "token_bitmasks": token_bitmasks,
            "draft_probs": draft_probs,
        },
        device,
        "target_logits",
    )

    draft, parents = draft_tokens.to(torch.int64), parents.to(torch.int64)
    masked = None
    if validate:
        masked = _check_values(draft, parents, logits, temperature, top_k, top_p, min_p, token_bitmasks, draft_probs)
    draft = torch.where((draft >= 0) & (draft < vocab), draft, -1)
    walk = _Walk(  # the checks' masked copy, when they made one, is walked as it is
        draft,
        parents,
        logits if masked is None else masked,
        token_bitmasks if masked is None else None,
        temperature,
        top_k,
        top_p,
        min_p,
        per_row_seeds(seed, shared_seed, batch, device),
        draft_probs,
        sibling_draws == "without_replacement",
    )
    return walk.run(validate)


def _check_values(
    draft: torch.Tensor,
    parents: torch.Tensor,
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    token_bitmasks: torch.Tensor | None,
    draft_probs: torch.Tensor | None,
) -> torch.Tensor | None:
    """The value rules of SPEC §6/§8 (host reads). Logits, masks and q are checked only where in use:
    index 0 and index i+1 of every present node i. Returns the masked logits [B, N+1, V] where
    token_bitmasks are given (made to check them), else None."""
    checks.check_draft_ids(draft, logits.shape[-1], second="node")
    present = draft >= 0
    checks.check_tree_parents(parents, present)
    in_use = torch.cat([torch.ones_like(present[:, :1]), present], dim=1)
    checks.check_finite_logits(
        "target_logits", logits, some_finite=token_bitmasks is None, in_use=in_use, second="index"
    )
    checks.check_sampling_values(temperature, top_k, top_p, min_p)
    if token_bitmasks is not None:
        masked = apply_bitmask(logits, token_bitmasks)
        checks.check_some_allowed("token_bitmasks", masked, in_use=in_use, second="index")
    if draft_probs is not None:
        checks.check_draft_probs(draft_probs, name="draft_probs", in_use=present, second="node")
        checks.check_sibling_draft_probs(draft_probs, parents, present)
    return masked if token_bitmasks is not None else None


class _Walk:
    """One call's checked inputs and the walk over them.

    draft: int64 [B, N], -1 where no node; parents: int64 [B, N]; logits: [B, N+1, V] (kept as
    [B*(N+1), V]); token_bitmasks: int32 [B, N+1, W] or None (None also when the logits come masked);
    temperature, top_k, top_p, min_p: [B]; seeds: int64 [B] (s_b); draft_probs: float [B, N, V] or None
    (argmax mode); without_replacement: the sibling scheme.
    """

    def __init__(
        self,
        draft,
        parents,
        logits,
        token_bitmasks,
        temperature,
        top_k,
        top_p,
        min_p,
        seeds,
        draft_probs,
        without_replacement,
    ):
        self.draft, self.parents, self.token_bitmasks = draft, parents, token_bitmasks
        self.logits = logits.reshape(-1, logits.shape[-1]).contiguous()  # [B*(N+1), V]: a view unless strided
        self.temperature, self.top_k, self.top_p, self.min_p = temperature, top_k, top_p, min_p
        self.seeds, self.draft_probs, self.without_replacement = seeds, draft_probs, without_replacement

    def run(self, validate: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Walk every row from the root -> (path [B, N], path_length [B], next_token [B]), int64.

        validate=True: each step judges the current node of the rows still walking, and the walk ends when
        none is (host reads). validate=False cannot learn where rows stop: where the backend skips rows at
        no cost (`skips_rows_cheaply`: the native CPU kernels), N + 1 steps run over every row and a row
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
        stepping = validate or self.draft_probs is not None or kernels.backend_for(self.logits).skips_rows_cheaply
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
            logits, pick(self.temperature), pick(self.top_k), pick(self.top_p), pick(self.min_p), source=source
        )
        keys = pick(self.seeds) + depth
        children = self._children(rows, current)
        drafted = self.draft.index_select(0, rows)
        target_sample = sample_from_weights(weights, keyed_uniform(keys, STREAM_TARGET), sums)
        match = children & (drafted == target_sample[:, None])
        argmax_child = _first_true(match)
        if self.draft_probs is None:
            return argmax_child, target_sample
        # the most children any row may have here: read when validating, else bounded by the depth
        # (a node at depth j - 1 has an index >= j - 1, so at most N - j nodes come after it)
        nodes = self.draft.shape[1]
        ranks = int(children.sum(-1).max()) if validate else (nodes if depth == 0 else nodes - depth)
        child, token = _sampled_step(
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
    drawn = sample_from_weights(torch.where(empty, target, residual), residual_uniforms)
    return child, torch.where(child >= 0, token, drawn)
