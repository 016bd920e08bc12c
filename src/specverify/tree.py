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
from .kernels.interface import TreeCall
from .rng import per_row_seeds


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
    call = TreeCall(  # the checks' masked copy, when they made one, is walked as it is
        draft=draft,
        parents=parents,
        logits=logits if masked is None else masked,
        bitmask=token_bitmasks if masked is None else None,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seeds=per_row_seeds(seed, shared_seed, batch, device),
        draft_probs=draft_probs,
        without_replacement=sibling_draws == "without_replacement",
        validate=validate,
    )
    return kernels.ops_for(logits).verify_tree(call)


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
