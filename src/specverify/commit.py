"""What a verifier's output commits (SPEC §1), and acceptance statistics over a batch."""

from __future__ import annotations

import torch

from .contract import PAD


def _check_integer_tensors(*arguments: tuple[str, object, str]) -> None:
    """Each (name, value, layout such as "[B, K]") is an integer tensor with as many dims as its layout."""
    for name, value, layout in arguments:
        if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dtype == torch.bool:
            got = f"dtype {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise TypeError(f"{name} must be an integer tensor {layout} (got {got})")
        if value.dim() != layout.count(",") + 1:
            raise ValueError(f"{name} must have shape {layout} (got {list(value.shape)})")


def committed_tokens(
    first_rejected_idx: torch.Tensor, recovered_tokens: torch.Tensor, bonus_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens each row commits: `recovered[:f+1]` when f < K, `recovered[:K] + [bonus]` when f == K.

    first_rejected_idx: int [B]; recovered_tokens: int [B, K]; bonus_tokens: int [B, 1].
    Returns (tokens: int64 [B, K+1], padded with -1 after the committed ones; num_committed: int64 [B] = f+1).
    """
    _check_integer_tensors(
        ("first_rejected_idx", first_rejected_idx, "[B]"),
        ("recovered_tokens", recovered_tokens, "[B, K]"),
        ("bonus_tokens", bonus_tokens, "[B, 1]"),
    )
    batch, positions = recovered_tokens.shape
    if tuple(first_rejected_idx.shape) != (batch,) or tuple(bonus_tokens.shape) != (batch, 1):
        raise ValueError(
            f"first_rejected_idx must be [B] and bonus_tokens [B, 1] with B = {batch} "
            f"(got {list(first_rejected_idx.shape)} and {list(bonus_tokens.shape)})"
        )
    out_of_range = (first_rejected_idx < 0) | (first_rejected_idx > positions)
    if bool(out_of_range.any()):
        row = int(out_of_range.nonzero()[0, 0])
        raise ValueError(
            f"first_rejected_idx must be in [0, K = {positions}] (got {int(first_rejected_idx[row])} at row {row})"
        )
    candidates = torch.cat([recovered_tokens, bonus_tokens], dim=1).to(torch.int64)
    num_committed = first_rejected_idx.to(torch.int64) + 1
    positions = torch.arange(positions + 1, device=candidates.device)
    tokens = torch.where(positions < num_committed[:, None], candidates, PAD)
    return tokens, num_committed


def tree_committed_tokens(
    draft_tokens: torch.Tensor, path: torch.Tensor, path_length: torch.Tensor, next_token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens each row commits after tree verification (SPEC §8): the tokens of the accepted path's
    nodes, `draft_tokens[b, path[b, :L]]`, then `next_token[b]`.

    draft_tokens: int [B, N]; path: int [B, N] (node indices, -1 after the path); path_length: int [B];
    next_token: int [B]. Returns (tokens: int64 [B, N+1], padded with -1 after the committed ones;
    count: int64 [B] = L + 1).
    """
    _check_integer_tensors(
        ("draft_tokens", draft_tokens, "[B, N]"),
        ("path", path, "[B, N]"),
        ("path_length", path_length, "[B]"),
        ("next_token", next_token, "[B]"),
    )
    batch, nodes = draft_tokens.shape
    if (
        tuple(path.shape) != (batch, nodes)
        or tuple(path_length.shape) != (batch,)
        or tuple(next_token.shape) != (batch,)
    ):
        raise ValueError(
            f"path must be [B, N] = {[batch, nodes]}, path_length and next_token [B] = [{batch}] "
            f"(got {list(path.shape)}, {list(path_length.shape)} and {list(next_token.shape)})"
        )
    length = path_length.to(torch.int64)
    out_of_range = (length < 0) | (length > nodes)
    if bool(out_of_range.any()):
        row = int(out_of_range.nonzero()[0, 0])
        raise ValueError(f"path_length must be in [0, N = {nodes}] (got {int(length[row])} at row {row})")
    on_path = torch.arange(nodes, device=path.device) < length[:, None]
    bad = on_path & ((path < 0) | (path >= nodes))
    if bool(bad.any()):
        row, depth = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"path must hold node indices in [0, {nodes}) before path_length (got {int(path[row, depth])} at row {row}, depth {depth})"
        )
    nodes_on_path = draft_tokens.to(torch.int64).gather(1, torch.where(on_path, path.to(torch.int64), 0))
    tokens = torch.full((batch, nodes + 1), PAD, dtype=torch.int64, device=draft_tokens.device)
    tokens[:, :nodes] = torch.where(on_path, nodes_on_path, PAD)
    tokens.scatter_(1, length[:, None], next_token.to(torch.int64)[:, None])
    return tokens, length + 1


def acceptance_counts(first_rejected_idx: torch.Tensor, num_drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per draft position j: how many rows drafted a token at j, and how many of those had it accepted.

    first_rejected_idx: int [B]; num_drafts: int [B], the drafted (non-padding) length of each row.
    Returns (drafted, accepted): int64 [max num_drafts] each; accepted / drafted is the acceptance rate.
    """
    width = int(num_drafts.max()) if num_drafts.numel() else 0
    positions = torch.arange(width, device=num_drafts.device)
    drafted = positions < num_drafts[:, None]
    accepted = drafted & (positions < first_rejected_idx[:, None])
    return drafted.sum(0), accepted.sum(0)
