"""The C kernels' whole-call ops (interface.WholeCallOps). A chain call: every row's target draws, the
verdicts and the first rejection in one kernel call (native.draw_verdicts / draw_sampled_verdicts, the latter
also for block verification); a call with relaxed rows runs in stages (stages.chain) with this module's
fused draws for its sampled rows. A tree call: the walk of stages.tree.
"""

from __future__ import annotations

import torch

from ...contract import BOUNDARY_RTOL, GREEDY_TEMPERATURE
from ...rng import STREAM_ACCEPT, STREAM_RESIDUAL, STREAM_TARGET, stream_salt
from .. import native
from ..interface import ChainCall, TreeCall, block_size
from ..stages import chain, tree
from ..stages.categorical import total_weight
from ..stages.rules import argmax_verdict, ratio_test
from ..stages.weights import scratch_weights

#: The salts of the streams a chain call draws on (target, accept, residual), made once.
_CHAIN_SALTS = tuple(stream_salt(stream) for stream in (STREAM_TARGET, STREAM_ACCEPT, STREAM_RESIDUAL))


def verify_chain(call: ChainCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """interface.WholeCallOps.verify_chain on the C kernels."""
    if call.relaxed is not None:
        return chain.verify_chain(call, native, drawn_stage)
    return _fused_verdicts(call)


def verify_tree(call: TreeCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """interface.WholeCallOps.verify_tree on the C kernels: weigh_rows skips a stopped row at next to no
    cost, so a walk without host reads steps over every row."""
    return tree.verify_tree(call, native, skips_rows_cheaply=True)


def _fused_verdicts(call: ChainCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """argmax_verdict and greedy_verdict (draft_probs None), or sampled_verdict (block_verdict where
    call.block) for every row, with the first rejection, in one kernel call: the keyed draws from p~ (a
    greedy row's argmax), the padding of drafts that are not ids and the keys s_b + j applied inside it,
    the weights never written out but where sampled mode keeps a large kept set for its recovery.
    Returns (first_rejected_idx int64 [B], recovered int64 [B, K], bonus int64 [B, 1])."""
    masked = chain.masked_logits(call)
    block = block_size(masked.shape[-1])
    rules = (call.temperature, GREEDY_TEMPERATURE, call.top_k, call.top_p, call.min_p, BOUNDARY_RTOL, block)
    if call.draft_probs is None:
        return native.draw_verdicts(masked, call.draft_tokens, *rules, call.seed, call.shared_seed, _CHAIN_SALTS[0])
    dense = scratch_weights(masked.shape, masked.device)
    return native.draw_sampled_verdicts(
        masked,
        call.draft_tokens,
        *rules,
        call.seed,
        call.shared_seed,
        _CHAIN_SALTS,
        call.draft_probs,
        dense,
        call.block,
    )


def drawn_stage(rows: chain.Rows, reads_host: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """stages.chain.weighed_verdicts in fused draws (chain.StochasticStage; reads_host changes nothing
    here): the same verdicts bit for bit, each row weighed and drawn inside one kernel (_target_draws), the
    uniforms of every stream keyed there, the weights written out only where sampled mode hands a large kept
    set to the recovery."""
    draft, masked, seeds, draft_probs = rows.draft, rows.masked, rows.seeds, rows.draft_probs
    params = (rows.temperature, rows.top_k, rows.top_p, rows.min_p)
    batch, positions = draft.shape
    vocab = masked.shape[-1]
    per_position = positions + 1
    logits = masked.reshape(-1, vocab)
    if draft_probs is None:
        tokens = _target_draws(logits, per_position, *params, seeds).view(batch, per_position)
        accepted, recovered = argmax_verdict(draft, tokens[:, :positions])
        return accepted, recovered, tokens[:, positions]
    drawn = _target_draws(logits, per_position, *params, seeds, draft)
    tokens, at_draft, accept_uniforms, sums, kept = drawn
    target_mass = total_weight(sums.view(batch, per_position, sums.shape[-1]))[:, :positions]
    accepted, mode = ratio_test(draft, at_draft, target_mass, draft_probs, accept_uniforms)
    drawn = native.recover_kept_rows(
        kept, sums, target_mass, draft_probs, draft, mode, seeds, _CHAIN_SALTS[2], block_size(vocab)
    )
    return accepted, torch.where(accepted, draft, drawn), tokens.view(batch, per_position)[:, positions]


def _target_draws(
    masked_logits: torch.Tensor,
    per_position: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    seeds: torch.Tensor,
    draft: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
    """The keyed target draws y from p~ of every row of a chain call, in one native.draw_rows call: the
    tokens that truncated_weights and sample_from_weights give, the weights never written out. masked_logits: [B * per_position, V], row b * per_position + j keyed by seeds[b] + j
    (STREAM_TARGET); params and seeds (int64): per request [B] -> int64 [B * per_position]. With draft
    (int64 [B, per_position - 1], -1: none), sampled mode: also the draft tokens' weights, the ratio test's
    uniforms (STREAM_ACCEPT), the block sums and the kept weights for native.recover_kept_rows (a dense
    part may live in this thread's scratch buffer: use it before the next call)."""
    vocab = masked_logits.shape[-1]
    dense = None if draft is None else scratch_weights(masked_logits.shape, masked_logits.device)
    return native.draw_rows(
        masked_logits.detach(),
        per_position,
        temperature,
        GREEDY_TEMPERATURE,
        top_k,
        top_p,
        min_p,
        BOUNDARY_RTOL,
        block_size(vocab),
        seeds,
        _CHAIN_SALTS[0],
        draft,
        _CHAIN_SALTS[1],
        dense,
    )
