"""The torch reference backend (SPECVERIFY_BACKEND=torch): every op of kernels/interface.py in plain torch.

It runs on any device torch runs on (MPS, XPU, ... and CPU or CUDA where the compiled backend cannot),
and it is the reference the compiled backends are tested against. No full-vocabulary sort: the top-k
and nucleus thresholds by radix selection (selection.py), and no read of tensor data to the host (a
shortcut that needs one, such as `torch.topk` for a small largest top_k, would make every call sync).
"""

from __future__ import annotations

import sys

import torch

from ..backend import Backend
from ..interface import FROM_RESIDUAL, HOLDS_ABOVE_MINUS_INF, HOLDS_NAN_OR_INF, WITHOUT_DRAFT, ChainCall, TreeCall
from ..stages import chain, tree
from ..stages.categorical import block_sums, cdf_walk
from .selection import largest_reaching_threshold


def _scaled_weights(logits: torch.Tensor, temperature: torch.Tensor, greedy_below: float, out: torch.Tensor):
    """exp((x - max x) / T) in float32 into out, the max entry exactly 1; greedy rows use T = 1.
    logits: float32 [N, V]; temperature: float [N]; out: float32 [N, V]."""
    top = logits.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    inverse = 1.0 / torch.where(temperature < greedy_below, 1.0, temperature.float())[:, None]
    return torch.sub(logits, top, out=out).mul_(inverse).exp_()


def _top_k_threshold(weights: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """The k-th largest weight of each row; 0 for rows without a limit (top_k <= 0 or >= V).
    weights: float32 [N, V]; top_k: int64 [N] -> float32 [N]."""
    vocab = weights.shape[-1]
    limited = (top_k > 0) & (top_k < vocab)
    kth = largest_reaching_threshold(weights, torch.where(limited, top_k, 1).to(torch.float64))
    return torch.where(limited, kth, torch.zeros_like(kth))


def _nucleus_threshold(weights: torch.Tensor, top_p: torch.Tensor, rtol: float) -> torch.Tensor:
    """Smallest weight of the shortest most-likely prefix whose mass reaches top_p of the row's mass;
    0 for rows with top_p >= 1. weights: float32 [N, V] (top-k truncated); top_p: float [N] -> float32 [N]."""
    mass = weights.sum(-1, dtype=torch.float64)
    target = top_p.to(torch.float64) * mass * (1 - rtol)
    threshold = largest_reaching_threshold(weights, target, weights)
    return torch.where(top_p >= 1, torch.zeros_like(threshold), threshold)


def _truncate(weights, top_k, top_p, min_p, rtol) -> torch.Tensor:
    """Every weight outside the kept set of SPEC §2 steps 3-5 zeroed. weights: float32 [N, V] -> [N, V]."""
    threshold = _top_k_threshold(weights, top_k)
    after_top_k = torch.where(weights >= threshold[:, None], weights, 0.0)
    threshold = torch.maximum(threshold, _nucleus_threshold(after_top_k, top_p, rtol))
    if min_p is not None:
        # the largest weight is exactly 1, so min_p * max(p) is min_p itself
        threshold = torch.maximum(threshold, min_p.float() * (1 - rtol))
    return torch.where(weights >= threshold[:, None], weights, 0.0)


def weigh_rows(logits, temperature, greedy_below, top_k, top_p, min_p, rtol, block, out, source=None):
    """interface.weigh_rows: the weights written into out, their block sums returned (a skipped row is
    weighed as row 0, its sums zeroed)."""
    x = logits.detach() if source is None else logits.detach().index_select(0, source.clamp(min=0))
    x = x.float()
    weights = _scaled_weights(x, temperature, greedy_below, out)
    truncated = _truncate(weights, top_k, top_p, min_p, rtol)
    one_hot = torch.zeros_like(truncated).scatter_(1, argmax_rows(x)[:, None], 1.0)
    torch.where((temperature < greedy_below)[:, None], one_hot, truncated, out=out)
    sums = block_sums(out, block)
    return sums if source is None else sums.masked_fill_((source < 0)[:, None], 0.0)


def argmax_rows(values: torch.Tensor) -> torch.Tensor:
    """interface.argmax_rows."""
    return torch.nan_to_num(values.float(), nan=float("-inf")).argmax(-1)


def scan_rows(values: torch.Tensor, in_use: torch.Tensor | None = None) -> torch.Tensor:
    """interface.scan_rows by one max reduction (it propagates NaN and +inf)."""
    top = values.amax(-1)
    flags = torch.where(torch.isnan(top) | (top == float("inf")), HOLDS_NAN_OR_INF, 0)
    flags = flags | torch.where(top == float("-inf"), 0, HOLDS_ABOVE_MINUS_INF)
    if in_use is not None:
        flags = torch.where(in_use, flags, 0)
    return flags.to(torch.uint8)


def recover_rows(weights, weight_sums, mass, draft_probs, draft, mode, uniforms, block):
    """interface.recover_rows with the residual materialised: one full-size tensor, p~ - q where q is used
    (else p~), clamped, then edited in place."""
    batch, positions, vocab = draft_probs.shape
    target_probs = weights[:, :positions] / mass[..., None].to(weights.dtype)
    column = draft.clamp(min=0)[..., None]
    uses_q = (mode == FROM_RESIDUAL)[..., None].to(target_probs.dtype)
    residual = torch.addcmul(target_probs, draft_probs.to(target_probs.dtype), uses_q, value=-1).clamp_(min=0)
    at_draft = residual.gather(-1, column)
    residual.scatter_(-1, column, torch.where((mode == WITHOUT_DRAFT)[..., None], 0.0, at_draft))
    empty = residual.amax(-1, keepdim=True) <= 0
    residual = torch.where(empty, target_probs, residual, out=residual).view(-1, vocab)
    drawn = cdf_walk(residual, block_sums(residual, block), block, uniforms.reshape(-1))
    return drawn.view(batch, positions)


#: interface.sample_rows: the two-level walk in float64, for weights of any float dtype and layout.
sample_rows = cdf_walk


def relaxed_rows(logits: torch.Tensor, draft: torch.Tensor, k: int, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """interface.relaxed_rows with the softmax materialised. Tokens are ranked by logit (which orders them
    as their probabilities), ties by id."""
    positions = draft.shape[1]
    x = logits[:, :positions].float()
    top1 = argmax_rows(x)
    column = draft.clamp(min=0)[..., None]
    at_draft = x.gather(-1, column)
    top = x.gather(-1, top1[..., None])
    ids = torch.arange(x.shape[-1], device=x.device)
    rank = ((x > at_draft) | ((x == at_draft) & (ids < column))).sum(-1)
    total = torch.exp(x - top).sum(-1, dtype=torch.float64)
    p_draft = torch.exp(at_draft - top)[..., 0].double() / total
    close = p_draft >= 1 / total - delta
    return (draft >= 0) & (p_draft > 0) & (rank < k) & close, top1


def verify_chain(call: ChainCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """interface.WholeCallOps.verify_chain: the stages of stages.chain over the ops above."""
    return chain.verify_chain(call, sys.modules[__name__])


def verify_tree(call: TreeCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """interface.WholeCallOps.verify_tree: the walk of stages.tree over the ops above (a skipped row is
    weighed all the same, so a walk without host reads judges every node of an argmax-mode tree at once)."""
    return tree.verify_tree(call, sys.modules[__name__], skips_rows_cheaply=False)


BACKEND = Backend(name="torch", ops=sys.modules[__name__])
