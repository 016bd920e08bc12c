"""A chain verifier call in stages (SPEC §1-§5), over a backend's per-row ops: the whole-call op
`verify_chain` of the torch reference, and of the C kernels where a call has relaxed rows.

check (done by the caller) -> mask -> per rule, the rows it judges (known on the host when validating,
else every row) -> the rule's verdicts (stochastic rows through the backend's stage: weighed_verdicts
here, or the C kernels' fused draws) -> merged -> first rejection. A small argmax-mode call whose values
were read to the host is judged on Python lists instead (_verify_read).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...bitmask import apply_bitmask
from ...rng import (
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    STREAM_TARGET,
    keyed_uniform,
    keyed_uniform_read,
    per_row_seeds,
    row_keys,
)
from ..interface import ChainCall, Ops, Relaxed
from .categorical import sample_from_weights
from .rules import (
    argmax_verdict,
    block_verdict,
    first_rejections_read,
    greedy_verdict,
    relaxed_verdict,
    sampled_verdict,
)
from .weights import greedy_tokens, is_greedy, keyed_draws_read, per_position_rows, truncated_weights


@dataclass(frozen=True)
class Rows:
    """The rows a rule judges: a chain call's checked inputs, restricted to them."""

    draft: torch.Tensor  # int64 [R, K], -1 from a row's first non-id on
    masked: torch.Tensor  # float [R, K + 1, V], the grammar mask applied
    temperature: torch.Tensor  # float [R]
    top_k: torch.Tensor  # int [R]
    top_p: torch.Tensor  # float [R]
    min_p: torch.Tensor | None  # float [R]
    draft_probs: torch.Tensor | None  # float [R, K, V] (sampled drafts) or None
    seeds: torch.Tensor | None = None  # int64 [R], s_r: position j keyed by s_r + j (None until a rule samples)

    def pick(self, index: torch.Tensor | None, seeds: torch.Tensor | None = None) -> Rows:
        """These rows restricted to `index` (sorted, distinct; None: all), with `seeds` [R] for every row."""
        fields = (self.draft, self.masked, self.temperature, self.top_k, self.top_p, self.min_p, self.draft_probs)
        return Rows(*(_pick(t, index) for t in fields), seeds=_pick(seeds, index))


#: A backend's stage for the rows sampled from p~: (rows, reads_host) -> (accepted bool [R, K], recovered
#: int64 [R, K], bonus int64 [R]).
StochasticStage = Callable[[Rows, bool], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class _Plan:
    """Which work a call needs, known on the host without reading device data unless validating."""

    stochastic_rows: tuple[int, ...] | None  # rows sampled from p~ (None: all rows, not known on the host)
    greedy_rows: tuple[int, ...] | None  # greedy rows (None: all rows)
    relaxed_rows: tuple[int, ...] | None  # relaxed rows (None: all rows)
    reads_host: bool = False  # small tensors may be read to the host (a validating call)


def masked_logits(call: ChainCall) -> torch.Tensor:
    """The call's logits with its grammar mask applied (the checks' copy where they made one). [B, K+1, V]."""
    if call.masked is not None:
        return call.masked
    return call.logits if call.bitmask is None else apply_bitmask(call.logits, call.bitmask)


def verify_chain(call: ChainCall, ops: Ops, stochastic: StochasticStage | None = None) -> tuple[torch.Tensor, ...]:
    """interface.WholeCallOps.verify_chain in stages over the backend's per-row ops. stochastic: the
    backend's stage for the rows sampled from p~ (None: weighed_verdicts on its weigh_rows and sample_rows)."""
    masked = masked_logits(call)
    positions = call.draft_tokens.shape[1]
    params = (call.temperature, call.top_k, call.top_p, call.min_p)
    if call.host is not None and call.host.draft is not None:
        return _verify_read(ops, call.host.draft, masked, params, call.host.temperatures, (call.seed, call.shared_seed))
    draft = _draft_or_padding(call.draft_tokens, masked.shape[-1]) if positions else call.draft_tokens.to(torch.int64)
    rows = Rows(draft, masked, *params, call.draft_probs)
    stochastic = stochastic or functools.partial(weighed_verdicts, ops, block=call.block)
    return _verify(ops, rows, (call.seed, call.shared_seed), _plan(call), call.relaxed, stochastic)


def _plan(call: ChainCall) -> _Plan:
    """Which rows each rule judges: read to the host in a validating call, else every row."""
    if call.host is None:
        return _Plan(stochastic_rows=None, greedy_rows=None, relaxed_rows=None)
    batch = call.draft_tokens.shape[0]
    greedy = is_greedy(call.temperature).tolist()
    thinking = [False] * batch if call.relaxed is None else call.relaxed.thinking.tolist()
    return _Plan(
        stochastic_rows=tuple(row for row in range(batch) if not greedy[row]),
        greedy_rows=tuple(row for row in range(batch) if greedy[row]),
        relaxed_rows=tuple(row for row in range(batch) if thinking[row] and not greedy[row]),
        reads_host=True,
    )


def _verify_read(
    ops: Ops,
    draft: list[list[int]],
    masked: torch.Tensor,
    params: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    temperatures: list[float],
    seed: tuple[int | torch.Tensor, bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verdicts of a small argmax-mode batch on the CPU with its values read to the host (a checking
    call): the outputs of _verify bit for bit, with the bookkeeping on Python lists, since at such sizes the
    fixed cost of each torch op, not the vocabulary pass, is what a call costs. draft: B lists of K checked
    ids (-1: none); masked: [B, K+1, V] CPU; params: the rows' checked temperature, top_k, top_p, min_p
    [B]; temperatures: the temperatures as a list; seed: the checked seed and whether it is shared. Every position's y comes from keyed_draws_read (a
    greedy row's is its argmax, which both rules commit: _verify relies on it too)."""
    batch, per_position, vocab = masked.shape
    target = keyed_draws_read(ops, masked.reshape(-1, vocab), params, temperatures, seed, per_position)
    rows = [target[row * per_position : (row + 1) * per_position] for row in range(batch)]
    first, recovered, bonus = first_rejections_read(draft, rows)  # a row's first -1 is its first rejection
    return (
        torch.tensor(first, dtype=torch.int64),
        torch.tensor(recovered, dtype=torch.int64).view(batch, per_position - 1),
        torch.tensor(bonus, dtype=torch.int64).view(batch, 1),
    )


def _draft_or_padding(draft_tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """int64 [B, K] with -1 at every position from a row's first non-id (-1, or out of range) onward."""
    draft = draft_tokens.to(torch.int64)
    present = ((draft >= 0) & (draft < vocab)).to(torch.int64).cumprod(-1).bool()
    return torch.where(present, draft, -1)


def _verify(
    ops: Ops,
    every: Rows,
    seed: tuple[int | torch.Tensor, bool],
    plan: _Plan,
    relaxed: Relaxed | None,
    stochastic: StochasticStage,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verdicts of every row for checked arguments. every: the call's rows [B]; seed: the checked seed
    and whether it is shared (checks.check_seed), spread to rows only where a row samples; stochastic: the
    backend's stage for the rows sampled from p~ (weighed_verdicts, or a fused one).

    Each rule runs on the rows the plan gives it (all rows when the plan does not know); every
    computation is row-independent, so a row's outputs do not depend on which rows ran beside it.
    """
    batch, positions = every.draft.shape
    device = every.masked.device
    outputs = None  # (accepted bool [B, K], recovered int64 [B, K], bonus int64 [B]), zeros until a rule writes

    rows = plan.stochastic_rows
    if rows is not None and 2 * len(rows) >= batch:
        rows = None  # cheaper to run every row than to copy most of the logits
    # p~ of a greedy row is one-hot at its argmax, so the stochastic rules commit for it what the greedy
    # rule does: when they run on every row, greedy rows need nothing more
    greedy_done = rows is None
    if _any(rows):
        index = _index(rows, batch, device)
        parts = stochastic(every.pick(index, per_row_seeds(*seed, batch, device)), plan.reads_host)
        outputs = _merge(outputs, parts, index, None, batch)

    rows = plan.relaxed_rows
    if relaxed is not None and _any(rows):
        index = _index(rows, batch, device)
        parts = relaxed_verdict(ops, _pick(every.draft, index), _pick(every.masked, index), relaxed.topk, relaxed.delta)
        thinking = relaxed.thinking & ~is_greedy(every.temperature) if rows is None else None
        outputs = _merge(outputs, parts, index, thinking, batch)

    rows = plan.greedy_rows
    if not greedy_done and _any(rows):
        index = _index(rows, batch, device)
        target_argmax = greedy_tokens(ops, _pick(every.masked, index))
        parts = (*greedy_verdict(_pick(every.draft, index), target_argmax[:, :positions]), target_argmax[:, positions])
        outputs = _merge(outputs, parts, index, None, batch)

    accepted, recovered, bonus = outputs if outputs is not None else _zeros(batch, positions, device)
    return _first_rejection(accepted), recovered, bonus[:, None]


def _any(rows: tuple[int, ...] | None) -> bool:
    """Whether a rule has rows to judge (None: every row may need it)."""
    return rows is None or len(rows) > 0


def _index(rows: tuple[int, ...] | None, batch: int, device: torch.device) -> torch.Tensor | None:
    """The rows as an int64 index tensor; None for every row (None, or all `batch` rows)."""
    return None if rows is None or len(rows) == batch else torch.tensor(rows, dtype=torch.int64, device=device)


def _pick(value: torch.Tensor | None, index: torch.Tensor | None) -> torch.Tensor | None:
    """value restricted to the given rows (sorted, distinct; None: value itself)."""
    return value if index is None or value is None else value.index_select(0, index)


def _zeros(batch: int, positions: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch outputs before any rule writes: (accepted bool [B, K], recovered int64 [B, K], bonus int64 [B])."""
    return (
        torch.zeros(batch, positions, dtype=torch.bool, device=device),
        torch.zeros(batch, positions, dtype=torch.int64, device=device),
        torch.zeros(batch, dtype=torch.int64, device=device),
    )


def _merge(
    outputs: tuple | None, parts: tuple, index: torch.Tensor | None, rule_rows: torch.Tensor | None, batch: int
) -> tuple:
    """Write a rule's outputs over the batch outputs (None: all zeros, made only where some stay): at the
    rows of `index`, or where `rule_rows` (bool [B]) holds, or at every row when both are None. Outputs
    without a counterpart in `parts` stay as they are."""
    covers_all = index is None and rule_rows is None
    if outputs is None:
        if covers_all and len(parts) == 3:
            return parts
        outputs = _zeros(batch, parts[0].shape[1], parts[0].device)
    merged = []
    for position, output in enumerate(outputs):
        if position >= len(parts):
            merged.append(output)
        elif covers_all:
            merged.append(parts[position])
        elif rule_rows is not None:
            merged.append(torch.where(rule_rows.view(-1, *[1] * (output.dim() - 1)), parts[position], output))
        else:
            merged.append(output.index_copy(0, index, parts[position]))
    return tuple(merged)


def weighed_verdicts(
    ops: Ops, rows: Rows, reads_host: bool, block: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SPEC §3.1/3.2 (§3.6 with `block`) for the given rows (their seeds set), on the weights of weigh_rows;
    reads_host: the uniforms may be keyed on the host (a validating call) -> (accepted bool [R, K],
    recovered int64 [R, K], bonus int64 [R])."""
    draft, masked, seeds, draft_probs = rows.draft, rows.masked, rows.seeds, rows.draft_probs
    batch, positions = draft.shape
    vocab = masked.shape[-1]
    per_position = positions + 1
    weights, sums = truncated_weights(
        ops,
        masked.reshape(-1, vocab),
        *(per_position_rows(t, per_position) for t in (rows.temperature, rows.top_k, rows.top_p, rows.min_p)),
    )
    keys = row_keys(seeds, per_position)
    uniform = keyed_uniform_read if reads_host else keyed_uniform
    target_uniforms = uniform(keys, STREAM_TARGET)
    if draft_probs is None:
        target_sample = sample_from_weights(ops, weights, target_uniforms.view(-1), sums).view(batch, per_position)
        accepted, recovered = argmax_verdict(draft, target_sample[:, :positions])
        return accepted, recovered, target_sample[:, positions]
    weights, sums = weights.view(batch, per_position, vocab), sums.view(batch, per_position, sums.shape[-1])
    accepted, recovered = (block_verdict if block else sampled_verdict)(
        ops,
        draft,
        weights,
        sums,
        draft_probs,
        uniform(keys[:, :positions], STREAM_ACCEPT),
        uniform(keys[:, :positions], STREAM_RESIDUAL),
    )
    bonus = sample_from_weights(ops, weights[:, positions], target_uniforms[:, positions], sums[:, positions])
    return accepted, recovered, bonus


def _first_rejection(accepted: torch.Tensor) -> torch.Tensor:
    """Index of the first False per row, K when none. accepted: bool [B, K] -> int64 [B]."""
    return torch.cumprod(accepted, -1, dtype=torch.int64).sum(-1)
