"""vLLM's flat speculative-decoding layout mapped onto specverify's padded contract, and back.

In one vLLM step request b owns n_b draft ids (flat, T = sum n_b) and n_b + 1 logits rows, request after
request: its n_b target positions, then its bonus row (flat logits [T + B, V]). specverify takes drafts
[B, K] padded with -1 and logits [B, K+1, V] with K = max n_b. Everything here is tensor ops on the
logits' device (no host sync, no Python loop over tokens); when every request drafts K tokens the
logits and draft probabilities are views, not copies. Nothing here imports vLLM.
"""

from __future__ import annotations

import torch

from ...contract import PAD


def _check_batch(name: str, value: torch.Tensor, batch: int) -> None:
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.shape[0] != batch:
        got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{name} must be a tensor [B] = [{batch}] (got {got})")


def draft_counts(cu_num_draft_tokens: torch.Tensor) -> torch.Tensor:
    """n_b from vLLM's inclusive cumulative sum. cu_num_draft_tokens: int [B] -> int64 [B]."""
    cu = cu_num_draft_tokens.to(torch.int64)
    return torch.diff(cu, prepend=cu.new_zeros(1))


def _flat_positions(counts: torch.Tensor, num_tokens: int, max_spec_len: int) -> torch.Tensor:
    """For each flat draft token t, its padded index b * K + j. counts: int64 [B] -> int64 [T]."""
    batch = counts.shape[0]
    starts = torch.cumsum(counts, 0) - counts
    owner = torch.repeat_interleave(torch.arange(batch, device=counts.device), counts, output_size=num_tokens)
    offset = torch.arange(num_tokens, device=counts.device) - starts[owner]
    return owner * max_spec_len + offset


def padded_drafts(draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor, max_spec_len: int) -> torch.Tensor:
    """vLLM's flat drafts as specverify's [B, K] rows padded with -1 (ragged rows, rows without drafts).

    draft_token_ids: int [T]; cu_num_draft_tokens: int [B], inclusive cumsum of n_b; max_spec_len: K >= max n_b.
    Returns int [B, K] (a view of the input when every row drafts K tokens, else a new int64 tensor).
    """
    batch = cu_num_draft_tokens.shape[0]
    num_tokens = draft_token_ids.shape[0]
    if draft_token_ids.dim() != 1:
        raise ValueError(f"draft_token_ids must be a flat tensor [T] (got {list(draft_token_ids.shape)})")
    if num_tokens > batch * max_spec_len:
        raise ValueError(
            f"draft_token_ids must hold at most B * max_spec_len = {batch * max_spec_len} ids (got {num_tokens})"
        )
    if num_tokens == batch * max_spec_len:
        return draft_token_ids.view(batch, max_spec_len)
    padded = torch.full((batch * max_spec_len,), PAD, dtype=torch.int64, device=draft_token_ids.device)
    if num_tokens:
        where = _flat_positions(draft_counts(cu_num_draft_tokens), num_tokens, max_spec_len)
        padded.index_copy_(0, where, draft_token_ids.to(torch.int64))
    return padded.view(batch, max_spec_len)


def padded_logits(
    logits: torch.Tensor, bonus_logits_indices: torch.Tensor, cu_num_draft_tokens: torch.Tensor, max_spec_len: int
) -> torch.Tensor:
    """vLLM's flat logits [T + B, V] as specverify's [B, K+1, V].

    Position j <= n_b of row b is flat row bonus_b - n_b + j (its targets, then its bonus); a padded
    position j > n_b repeats the bonus row (never committed: a row's first -1 is its first rejection).
    bonus_logits_indices: int [B]; cu_num_draft_tokens: int [B]. A view when T = B * K, else one gather.
    """
    batch = bonus_logits_indices.shape[0]
    _check_batch("cu_num_draft_tokens", cu_num_draft_tokens, batch)
    rows, vocab = logits.shape
    per_row = max_spec_len + 1
    if rows == batch * per_row:
        return logits.view(batch, per_row, vocab)
    counts = draft_counts(cu_num_draft_tokens)
    back = (counts[:, None] - torch.arange(per_row, device=logits.device)).clamp(min=0)
    index = bonus_logits_indices.to(torch.int64)[:, None] - back
    return logits.index_select(0, index.view(-1)).view(batch, per_row, vocab)


def padded_draft_probs(draft_probs: torch.Tensor, cu_num_draft_tokens: torch.Tensor, max_spec_len: int) -> torch.Tensor:
    """vLLM's flat draft distributions [T, V] as specverify's [B, K, V]; padded positions are all-zero
    rows ("no distribution", SPEC §3.2; they are padding anyway). A view when T = B * K."""
    batch = cu_num_draft_tokens.shape[0]
    num_tokens, vocab = draft_probs.shape
    if num_tokens == batch * max_spec_len:
        return draft_probs.view(batch, max_spec_len, vocab)
    padded = draft_probs.new_zeros(batch * max_spec_len, vocab)
    if num_tokens:
        where = _flat_positions(draft_counts(cu_num_draft_tokens), num_tokens, max_spec_len)
        padded.index_copy_(0, where, draft_probs)
    return padded.view(batch, max_spec_len, vocab)


def sampling_rows(
    temperature: torch.Tensor | None, top_k: torch.Tensor | None, top_p: torch.Tensor | None, vocab_size: int
) -> tuple[torch.Tensor | float, torch.Tensor | int, torch.Tensor | float]:
    """vLLM's per-request temperature / top_k / top_p ([B] tensors, None when no row uses them) in
    specverify's conventions: None -> greedy 0.0 / no limit -1 / 1.0 for every row; a top_k of vocab_size
    (vLLM's "no limit") -> -1. Greedy rows hold temperature 0.0 in vLLM, below our 1e-5 threshold."""
    if top_k is not None:
        top_k = torch.where(top_k >= vocab_size, PAD, top_k)
    return (
        0.0 if temperature is None else temperature,
        PAD if top_k is None else top_k,
        1.0 if top_p is None else top_p,
    )


def vllm_output(first_rejected_idx: torch.Tensor, recovered: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """specverify's verdicts as vLLM's sampled_token_ids: int32 [B, K+1], row b's f_b + 1 committed
    tokens then -1 (vLLM's PLACEHOLDER_TOKEN_ID). first_rejected_idx: int [B]; recovered: int [B, K];
    bonus: int [B, 1]."""
    tokens = torch.cat([recovered, bonus], dim=1)
    keep = torch.arange(tokens.shape[1], device=tokens.device)[None, :] <= first_rejected_idx[:, None]
    return torch.where(keep, tokens, PAD).to(torch.int32)
