"""Tree attention for one target forward over a draft tree (SPEC §8's layout): which node sees which,
each node's position, and which cache slots an accepted path keeps.

A step's block is the root (the last committed token) followed by the N tree nodes. Every query in the
block sees the committed context; the root sees itself; node i sees the root, its ancestors and itself,
never a sibling or a cousin. Node i sits at position context length + 1 + depth(i) (the root is at the
context length; the root's children have depth 0), exactly where it would sit in a plain context.
"""

from __future__ import annotations

import torch

from ...contract import PAD


def tree_nodes(tokens: torch.Tensor, parents: torch.Tensor, has_root: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Check a tree's types and shapes and read which nodes it has, as the verifier does: bool [B, N].

    tokens, parents: int [B, N] (SPEC §8); has_root: bool [B, 1], the rows that append a root.
    The values are not checked here: the tree's judge, `specverify.tree_acceptance_sampler` with
    validate=True, raises on them by name (ids out of range, a parent that is absent or not earlier), so the
    loop checks each tree once and reads nothing back to the host here. A node is in the tree when its id is
    in [0, vocab_size), its row has a root, and its parent is -1 or an earlier node in the tree: exactly the
    nodes the verifier's validate=False walk can reach, so the forward and the verdict read a tree alike.
    Any other node is scored as padding (its logits are finite and never used; `keep_path` drops it).
    """
    for name, value in (("tokens", tokens), ("parents", parents)):
        if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dim() != 2:
            raise TypeError(f"{name} must be an integer tensor [B, N] (got {value!r:.80})")
    if parents.shape != tokens.shape:
        raise ValueError(f"parents must have the shape of tokens {list(tokens.shape)} (got {list(parents.shape)})")
    if tokens.shape[0] != has_root.shape[0]:
        raise ValueError(f"tokens must have B = {has_root.shape[0]} rows (got {tokens.shape[0]})")
    earlier = torch.arange(tokens.shape[1], device=tokens.device)
    parents = parents.to(torch.int64)
    fits = (
        has_root & (tokens >= 0) & (tokens < vocab_size) & ((parents == PAD) | ((parents >= 0) & (parents < earlier)))
    )
    ancestry = tree_ancestry(parents, fits)
    return fits & ~(ancestry & ~fits[:, None, :]).any(-1)


def tree_ancestry(parents: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """bool [B, N, N]: [b, i, j] is true when present node j is node i or one of its ancestors.

    parents: int64 [B, N], valid as SPEC §8 for the present nodes; present: bool [B, N]. Padded nodes see
    only themselves. Computed by repeated squaring of the parent relation (log2 N matrix products).
    """
    batch, nodes = parents.shape
    eye = torch.eye(nodes, dtype=torch.bool, device=parents.device).expand(batch, nodes, nodes)
    linked = present & (parents >= 0)
    up = torch.zeros(batch, nodes, nodes, dtype=torch.bool, device=parents.device)
    up.scatter_(2, torch.where(linked, parents, 0)[..., None], linked[..., None])
    ancestry = eye | up
    reach = 1
    while reach < nodes:
        ancestry = (ancestry.float() @ ancestry.float()) > 0
        reach *= 2
    return ancestry


def tree_positions(lengths: torch.Tensor, ancestry: torch.Tensor) -> torch.Tensor:
    """Position ids of the block [root, node 0, ..., node N-1]: int64 [B, 1+N].

    lengths: int64 [B], the committed context before the root; ancestry: bool [B, N, N] (`tree_ancestry`).
    The root is at lengths[b]; node i at lengths[b] + 1 + depth(i) (a padded node: as a depth-0 node).
    """
    depths = ancestry.sum(-1) - 1
    return torch.cat([lengths[:, None], lengths[:, None] + 1 + depths], dim=1)


def tree_attention_mask(context: torch.Tensor, ancestry: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive 4D mask of the block [root, nodes] over [context slots, root, nodes].

    context: bool [B, L], the cache slots each row's committed context holds; ancestry: bool [B, N, N].
    Returns dtype [B, 1, 1+N, L+1+N]: 0 where a query attends, the dtype's lowest value elsewhere
    (transformers passes a prepared 4D mask to the attention as it is; eager and SDPA both add it).
    """
    batch, nodes = ancestry.shape[:2]
    sees_context = context[:, None, :].expand(batch, 1 + nodes, context.shape[1])
    sees_root = torch.ones(batch, 1 + nodes, 1, dtype=torch.bool, device=context.device)
    root_sees_nodes = torch.zeros(batch, 1, nodes, dtype=torch.bool, device=context.device)
    sees_nodes = torch.cat([root_sees_nodes, ancestry], dim=1)
    allowed = torch.cat([sees_context, sees_root, sees_nodes], dim=2)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=context.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def path_slots(
    path: torch.Tensor, path_length: torch.Tensor, parents: torch.Tensor, present: torch.Tensor
) -> torch.Tensor:
    """Validate an accepted path and give the node slots' new order: int64 [B, N], a gather index.

    path: int [B, N], the accepted nodes from depth 0 down (-1 padded, as `tree_acceptance_sampler` returns);
    path_length: int [B]; parents: int64 [B, N]; present: bool [B, N]. Entry j < path_length[b] is the node
    moved to slot j (so the kept nodes are contiguous, in depth order); later entries keep their slot.
    """
    batch, nodes = parents.shape
    path_length = torch.as_tensor(path_length, dtype=torch.int64, device=parents.device)
    path = torch.as_tensor(path, dtype=torch.int64, device=parents.device)
    if path.shape != (batch, nodes) or path_length.shape != (batch,):
        raise ValueError(
            f"path must be [B, N] = {[batch, nodes]} and path_length [B] = {[batch]} "
            f"(got {list(path.shape)} and {list(path_length.shape)})"
        )
    bad = (path_length < 0) | (path_length > nodes)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"path_length must be in [0, {nodes}] (got {int(path_length[row])} at row {row})")
    slots = torch.arange(nodes, device=parents.device)
    on_path = slots < path_length[:, None]
    node = path.clamp(0, max(nodes - 1, 0))
    expected_parent = torch.cat([torch.full_like(path[:, :1], PAD), path[:, :-1]], dim=1)
    wrong = on_path & (
        (path < 0) | (path >= nodes) | ~present.gather(1, node) | (parents.gather(1, node) != expected_parent)
    )
    if bool(wrong.any()):
        row, depth = (int(i) for i in wrong.nonzero()[0])
        raise ValueError(
            f"path must list present nodes from a child of the root down, each the parent of the next "
            f"(got node {int(path[row, depth])} at row {row}, depth {depth})"
        )
    return torch.where(on_path, node, slots)
