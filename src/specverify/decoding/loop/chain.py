"""The chain loops: plain sampling, and speculative decoding of draft chains verified by
`specverify.stochastic_acceptance_sampler`.

Both keep the state of `state.BatchState` and key row b's n-th token by `request_seed(base_seed[b], n)`, so in
"argmax" mode the speculative loop commits exactly the tokens the plain loop samples (SPEC §4), whatever the
drafter, K or the batch; in "sampled" mode it commits them with exactly the same distribution. Both apply
the same grammar masks (`constraints.grammar.GrammarMatchers`) and track the same thinking regions
(`constraints.thinking.ThinkingRegions`), so that holds for constrained output too. Only relaxed
acceptance inside thinking regions (speculative loop, `relaxed=`) departs from it, deliberately.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch

import specverify

from ...contract import PAD
from ..constraints.grammar import GrammarMatchers
from ..constraints.thinking import ThinkingRegions
from ..drafting.base import Drafter, drafter_evidence
from ..drafting.draft_length import DraftLength, draft_length_policy
from ..engines.base import LanguageModel, Session
from ..params import RowParams, SamplingParams, row_params
from .result import GenerationResult
from .state import (
    BatchState,
    GrammarArg,
    OnStep,
    check_draft_proposal,
    check_verification,
    commit_step,
    finish,
    grammar_matchers,
    prefill,
)


@torch.inference_mode()
def plain_generate(
    target: LanguageModel,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
    *,
    seed: int | Sequence[int] = 0,
    max_tokens: int | Sequence[int] = 128,
    stop_tokens: Iterable[int] = (),
    on_step: OnStep | None = None,
    grammar: GrammarArg = None,
    thinking: ThinkingRegions | None = None,
) -> GenerationResult:
    """Decode one token per target step with `specverify.sample(..., seed=request_seed(base_seed, n))`.

    prompts: B token-id lists; params: one SamplingParams or one per row; seed: an int for the batch
    (row b's base seed is seed + b) or one base seed per row; max_tokens: the most tokens a row
    generates, one int for all or one per row; stop_tokens: ids that end a row (kept);
    grammar: one Grammar for every row, one (or None) per row, or None; its stop tokens must be among
    stop_tokens; thinking: the tokens that open and close thinking regions, where the grammar does not apply.
    """
    requests = BatchState(prompts, max_tokens, stop_tokens, seed, thinking)
    rows = row_params(params, len(requests.contexts))
    matchers = grammar_matchers(grammar, requests, target.vocab_size)
    result = GenerationResult(requests.generated)
    session = prefill(target, requests, result)
    start = time.perf_counter()
    no_drafts = torch.empty(len(requests.contexts), 0, dtype=torch.int64)
    while any(requests.active):
        mask = None if matchers is None else matchers.masks(no_drafts, requests.free())[1][:, 0]
        tokens = _sample_step(session, requests, rows, requests.seeds(), mask)
        zeros = [0] * len(tokens)
        commit_step(requests, result, tokens, zeros, zeros, on_step, matchers)
    return finish(result, matchers, start)


def _sample_step(
    session: Session, requests: BatchState, rows: RowParams, seeds: torch.Tensor, mask: torch.Tensor | None
) -> list[list[int]]:
    """One plain decoding step: the target scores each running row's last token, and one keyed draw per
    row (`specverify.sample`) gives its next token, the one the verifier commits when no token is drafted
    (SPEC §4). seeds: int64 [B]; mask: int32 [B, ceil(V/32)] or None -> one token per row."""
    logits = session.extend(requests.last_tokens())[:, 0].float()
    device = logits.device
    on = rows.to(device)
    mask = None if mask is None else mask.to(device)
    drawn = specverify.sample(
        logits, on.temperature, on.top_k, on.top_p, seeds.to(device), on.min_p, token_bitmask=mask
    )
    return [[t] for t in drawn.tolist()]


def _shorten(
    tokens: torch.Tensor, probs: torch.Tensor | None, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Keep the first lengths[b] draft tokens of each row, and only as many columns as the longest.

    tokens: int64 [B, K]; probs: float32 [B, K, V] or None; lengths: int64 [B], each <= the row's real
    tokens. Returns (tokens int64 [B, K'] right-padded with -1, probs [B, K', V] zero at padding, lengths).
    """
    width = int(lengths.max()) if len(lengths) else 0
    real = torch.arange(width) < lengths[:, None]
    tokens = torch.where(real, tokens[:, :width], PAD)
    return tokens, None if probs is None else probs[:, :width] * real[..., None], lengths


def _fit_draft(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    limits: list[int],
    sampled: bool,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Cut a drafter's proposal to what each row can use and to the longest row.

    draft_tokens: int [B, >= max(limits)]; draft_probs: float [B, K, V] or None; limits: each row's
    chosen draft length (B ints).
    Returns (tokens int64 [B, K'] right-padded with -1, probs float32 [B, K', V] in sampled mode (one-hot
    for a deterministic draft, zero at padding) else None, drafted lengths int64 [B]).
    """
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dim() != 2 or draft_tokens.shape[0] != len(limits):
        raise ValueError(f"the drafter must return tokens of shape [B={len(limits)}, K] (got {draft_tokens!r:.80})")
    width = max(limits, default=0)
    if width == 0:  # no row drafts (most steps where drafts fail): nothing to cut
        none = torch.empty(len(limits), 0, dtype=torch.int64)
        return (
            none,
            torch.empty(len(limits), 0, vocab_size) if sampled else None,
            torch.zeros(len(limits), dtype=torch.int64),
        )
    tokens = draft_tokens[:, :width].to("cpu", torch.int64)
    lengths = torch.minimum(((tokens != PAD).cumprod(1) > 0).sum(1), torch.tensor(limits, dtype=torch.int64))
    probs = None
    if sampled and draft_probs is None:
        probs = torch.nn.functional.one_hot(tokens.clamp_min(0), vocab_size).float()
    elif sampled and draft_probs.shape[-1] != vocab_size:
        raise ValueError(
            f"the drafter's vocabulary must match the target's V = {vocab_size} (got {draft_probs.shape[-1]})"
        )
    elif sampled:
        probs = draft_probs[:, : tokens.shape[1]].to("cpu", torch.float32)
    return _shorten(tokens, probs, lengths)


def _constrain_draft(
    drafts: torch.Tensor,
    probs: torch.Tensor | None,
    lengths: torch.Tensor,
    requests: BatchState,
    matchers: GrammarMatchers | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Cut each draft after its first stop token (nothing after it would be kept), after its first
    thinking boundary and after its first token the grammar refuses.

    drafts: int64 [B, K]; probs: float32 [B, K, V] or None; lengths: int64 [B]. Returns (drafts [B, K'],
    probs [B, K', V] or None, lengths [B], bitmasks int32 [B, K'+1, ceil(V/32)] or None without a grammar).
    """
    if requests.stop_tokens and drafts.shape[1]:
        drafts, probs, lengths = _shorten(drafts, probs, requests.through_stop(drafts, lengths))
    if requests.regions is not None:
        drafts, probs, lengths = _shorten(drafts, probs, requests.regions.draft_lengths(drafts, lengths))
    if matchers is None:
        return drafts, probs, lengths, None
    kept, masks = matchers.masks(drafts, requests.free())
    drafts, probs, lengths = _shorten(drafts, probs, kept)
    return drafts, probs, lengths, masks[:, : drafts.shape[1] + 1]


def _relaxed_arguments(
    relaxed: tuple[int, float] | None, requests: BatchState, sampled: bool
) -> dict[str, int | float | None]:
    """The verifier's relaxed_topk/relaxed_delta from relaxed = (topk, delta), checked against the loop's settings."""
    if relaxed is None:
        return {"relaxed_topk": None, "relaxed_delta": None}
    if not isinstance(relaxed, Sequence) or len(relaxed) != 2:
        raise ValueError(f"relaxed must be a pair (relaxed_topk, relaxed_delta) (got {relaxed!r:.80})")
    if requests.regions is None:
        raise ValueError("relaxed acceptance needs thinking regions (thinking=ThinkingRegions(begin, end))")
    if sampled:
        raise ValueError('relaxed acceptance needs draft_proposal="argmax" (SPEC §3.4)')
    return {"relaxed_topk": relaxed[0], "relaxed_delta": relaxed[1]}


@torch.inference_mode()
def speculative_generate(
    target: LanguageModel,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
    *,
    k: int | str | DraftLength = "auto",
    seed: int | Sequence[int] = 0,
    max_tokens: int | Sequence[int] = 128,
    draft_proposal: str = "argmax",
    stop_tokens: Iterable[int] = (),
    on_step: OnStep | None = None,
    grammar: GrammarArg = None,
    thinking: ThinkingRegions | None = None,
    relaxed: tuple[int, float] | None = None,
    verification: str = "token",
) -> GenerationResult:
    """Speculative decoding: per step the drafter proposes up to k tokens per row, the target scores the
    context plus drafts in one pass, `specverify.stochastic_acceptance_sampler` decides, the committed
    tokens are appended and the target's cache rolled back past the rejected ones.

    Arguments as in `plain_generate`, plus k: the draft length, "auto" (default: chosen every step per
    batch from each row's running acceptance and the measured cost of each width, see `draft_length`;
    0 is among the choices, so a step can be a plain one), an int >= 0 (fixed) or a `DraftLength`
    policy; and draft_proposal: "argmax" (any draft; the output is token-identical to plain_generate
    with the same seed, whatever the K schedule) or "sampled" (the drafter samples and passes its
    distributions; same output distribution as plain_generate).
    Under a grammar a draft ends at its first refused token, which its mask makes the verifier reject:
    a token that violates the grammar is never committed. relaxed = (relaxed_topk, relaxed_delta): the
    verifier's lossy relaxed rule (SPEC §3.4) for the rows inside a thinking region; needs `thinking`
    and "argmax" proposals. verification: "token" (default) or "block" (SPEC §3.6: sampled drafts judged as a
    block, at least as many accepted in expectation; needs "sampled" proposals).
    """
    policy = draft_length_policy(k)
    sampled = check_draft_proposal(draft_proposal)
    check_verification(verification, sampled)
    requests = BatchState(prompts, max_tokens, stop_tokens, seed, thinking)
    rows: RowParams = row_params(params, len(requests.contexts))
    relaxed_arguments = _relaxed_arguments(relaxed, requests, sampled)
    matchers = grammar_matchers(grammar, requests, target.vocab_size)
    result = GenerationResult(requests.generated)
    session = prefill(target, requests, result)
    result.warmup_seconds += policy.begin(target, session, requests.last_tokens())
    start = time.perf_counter()
    while any(requests.active):
        step_start = time.perf_counter()
        seeds = requests.seeds()
        evidence = drafter_evidence(drafter, requests.contexts)
        lengths = policy.choose(requests.draft_budgets(), evidence)
        probing = policy.probes and any(a and n == 0 for a, n in zip(requests.active, lengths))
        draft = drafter.propose(
            requests.contexts, max(max(lengths), int(probing)), params=rows, seeds=seeds, sampled=sampled
        )
        probes = _probe_tokens(draft.tokens, lengths, requests.active) if probing else None
        drafts, probs, drafted = _fit_draft(draft.tokens, draft.probs, lengths, sampled, target.vocab_size)
        drafts, probs, drafted, masks = _constrain_draft(drafts, probs, drafted, requests, matchers)
        forward_start = time.perf_counter()
        if drafts.shape[1] == 0:  # no row drafts: a plain step (the token the verifier commits at K = 0)
            before = None  # and nothing to roll back
            tokens = _sample_step(session, requests, rows, seeds, None if masks is None else masks[:, 0])
            first = [0] * len(tokens)
        else:
            before = session.lengths.to("cpu", copy=True)
            logits = session.extend(torch.cat([requests.last_tokens(), drafts], 1)).float()
            device = logits.device
            on = rows.to(device)
            first, recovered, bonus = specverify.stochastic_acceptance_sampler(
                drafts.to(device),
                logits,
                on.temperature,
                on.top_k,
                None,
                on.top_p,
                None,
                seeds.to(device),
                in_thinking_phase=torch.tensor(requests.thinking, device=device) if relaxed is not None else None,
                token_bitmasks=None if masks is None else masks.to(device),
                draft_proposal=draft_proposal,
                draft_probs_full=None if probs is None else probs.to(device),
                min_p=on.min_p,
                verification=verification,
                **relaxed_arguments,
            )
            committed, num = specverify.committed_tokens(first, recovered, bonus)
            tokens = [row[:n] for row, n in zip(committed.tolist(), num.tolist())]
            first = first.tolist()
        forward_seconds = time.perf_counter() - forward_start  # after the copy to the host: the device is done
        drafted = drafted.tolist()
        kept = commit_step(requests, result, tokens, drafted, first, on_step, matchers)
        if before is not None:
            session.truncate(before + torch.tensor([len(t) for t in kept]))
        hits = [None if p is None else t[:1] == [p] for p, t in zip(probes or [None] * len(kept), kept)]
        policy.observe(
            drafted, first, hits, drafts.shape[1] + 1, forward_seconds, time.perf_counter() - step_start, evidence
        )
    return finish(result, matchers, start)


def _probe_tokens(tokens: torch.Tensor, lengths: list[int], active: list[bool]) -> list[int | None]:
    """The one-token probe of each running row given no draft: its drafter's first token (None where it
    proposed nothing, the row drafts, or it has finished). tokens: int [B, >= 1]; lengths: B draft lengths."""
    first = tokens[:, 0].tolist() if tokens.shape[1] else [PAD] * len(active)
    return [t if a and n == 0 and t != PAD else None for t, n, a in zip(first, lengths, active)]
