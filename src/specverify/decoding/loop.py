"""The decoding loops: plain sampling, and speculative decoding verified by `specverify`.

Both keep the same state: the target session holds each row's context except its last token, whose
logits the next step needs. Row b's n-th generated token is drawn with the key base_seed[b] + n, so in
"argmax" mode the speculative loop commits exactly the tokens the plain loop samples (SPEC §4), whatever
the drafter, K or the batch; in "sampled" mode it commits them with exactly the same distribution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import torch

import specverify

from .drafters import Drafter, pad_rows
from .model import PAD, LanguageModel, Session
from .params import RowParams, SamplingParams, base_seeds, row_params
from .result import GenerationResult, StepEvent

DRAFT_PROPOSALS = ("argmax", "sampled")

OnStep = Callable[[StepEvent], None]


class _Requests:
    """The batch being generated: each row's context, its generated tokens and whether it still runs."""

    def __init__(self, prompts: Sequence[Sequence[int]], max_tokens: int, stop_tokens: Iterable[int], seed):
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
            raise ValueError(f"prompts must be a non-empty list of token-id lists (got {prompts!r:.80})")
        for b, p in enumerate(prompts):
            if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or not p:
                raise ValueError(f"prompts[{b}] must be a non-empty list of token ids (got {p!r:.80})")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an int >= 0 (got {max_tokens!r})")
        self.contexts = [list(p) for p in prompts]
        self.generated: list[list[int]] = [[] for _ in prompts]
        self.active = [max_tokens > 0 for _ in prompts]
        self.max_tokens = max_tokens
        self.stop_tokens = frozenset(stop_tokens)
        self.base_seeds = base_seeds(seed, len(prompts))

    def seeds(self) -> torch.Tensor:
        """int64 [B]: the verifier's per-request seed, base + tokens generated so far."""
        return self.base_seeds + torch.tensor([len(g) for g in self.generated], dtype=torch.int64)

    def last_tokens(self) -> torch.Tensor:
        """int64 [B, 1]: each running row's last context token (not yet in the cache); -1 for finished rows."""
        return torch.tensor([[c[-1] if a else PAD] for c, a in zip(self.contexts, self.active)], dtype=torch.int64)

    def draft_limits(self, k: int) -> torch.Tensor:
        """int64 [B]: how many draft tokens each row can still use (one token of its budget is the
        verifier's own); 0 for finished rows."""
        return torch.tensor(
            [min(k, self.max_tokens - len(g) - 1) if a else 0 for g, a in zip(self.generated, self.active)],
            dtype=torch.int64,
        )

    def commit(self, row: int, tokens: list[int]) -> list[int]:
        """Append tokens to a running row, cut at its budget and after a stop token. Returns those kept."""
        kept = tokens[: self.max_tokens - len(self.generated[row])]
        for i, token in enumerate(kept):
            if token in self.stop_tokens:
                kept = kept[: i + 1]
                break
        self.contexts[row] += kept
        self.generated[row] += kept
        if len(self.generated[row]) >= self.max_tokens or (kept and kept[-1] in self.stop_tokens):
            self.active[row] = False
        return kept


def _prefill(target: LanguageModel, requests: _Requests, result: GenerationResult) -> Session:
    """A session holding every prompt but its last token."""
    start = time.perf_counter()
    session = target.session(len(requests.contexts))
    session.extend(pad_rows([c[:-1] for c in requests.contexts]), return_logits=False)
    result.prefill_seconds = time.perf_counter() - start
    return session


def _commit_step(
    requests: _Requests,
    result: GenerationResult,
    tokens: list[list[int]],
    drafted: list[int],
    first_rejected: list[int],
    on_step: OnStep | None,
) -> torch.Tensor:
    """Commit one step's tokens to the running rows, count it and report it. tokens[b]: what the
    verifier committed for row b. Returns int64 [B]: tokens kept per row (0 for finished rows)."""
    running = [b for b, a in enumerate(requests.active) if a]
    result.record([drafted[b] for b in running], [first_rejected[b] for b in running])
    kept_counts = torch.zeros(len(tokens), dtype=torch.int64)
    for b in running:
        kept = requests.commit(b, tokens[b])
        kept_counts[b] = len(kept)
        first = first_rejected[b]
        if on_step is not None and kept:
            on_step(StepEvent(b, kept, min(first, len(kept)), first < drafted[b] and len(kept) > first))
    return kept_counts


@torch.inference_mode()
def plain_generate(
    target: LanguageModel,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
    *,
    seed: int | Sequence[int] = 0,
    max_tokens: int = 128,
    stop_tokens: Iterable[int] = (),
    on_step: OnStep | None = None,
) -> GenerationResult:
    """Decode one token per target step with `specverify.sample(..., seed=base_seed + n)`.

    prompts: B token-id lists; params: one SamplingParams or one per row; seed: an int for the batch
    (row b uses seed + b * 0x9E3779B97F4A7C15) or one per row; stop_tokens: ids that end a row (kept).
    """
    requests = _Requests(prompts, max_tokens, stop_tokens, seed)
    rows = row_params(params, len(requests.contexts))
    result = GenerationResult(requests.generated)
    session = _prefill(target, requests, result)
    start = time.perf_counter()
    while any(requests.active):
        logits = session.extend(requests.last_tokens())[:, 0].float()
        on = rows.to(logits.device)
        seeds = requests.seeds().to(logits.device)
        drawn = specverify.sample(logits, on.temperature, on.top_k, on.top_p, seeds, on.min_p)
        zeros = [0] * len(drawn)
        _commit_step(requests, result, [[t] for t in drawn.tolist()], zeros, zeros, on_step)
    result.decode_seconds = time.perf_counter() - start
    return result


def _fit_draft(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    limits: torch.Tensor,
    sampled: bool,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Cut a drafter's proposal to what each row can use and to the longest row.

    draft_tokens: int [B, >= max(limits)]; draft_probs: float [B, K, V] or None; limits: int64 [B].
    Returns (tokens int64 [B, K'] right-padded with -1, probs float32 [B, K', V] in sampled mode (one-hot
    for a deterministic draft, zero at padding) else None, drafted lengths int64 [B]).
    """
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dim() != 2 or draft_tokens.shape[0] != len(limits):
        raise ValueError(f"the drafter must return tokens of shape [B={len(limits)}, K] (got {draft_tokens!r:.80})")
    tokens = draft_tokens[:, : int(limits.max()) if len(limits) else 0].to("cpu", torch.int64)
    positions = torch.arange(tokens.shape[1])
    real = ((tokens != PAD).cumprod(1) > 0) & (positions < limits[:, None])
    lengths = real.sum(1)
    width = int(lengths.max()) if len(lengths) else 0
    real = real[:, :width]
    tokens = torch.where(real, tokens[:, :width], PAD)
    if not sampled:
        return tokens, None, lengths
    if draft_probs is None:
        probs = torch.nn.functional.one_hot(tokens.clamp_min(0), vocab_size).float()
    elif draft_probs.shape[-1] != vocab_size:
        raise ValueError(
            f"the drafter's vocabulary must match the target's V = {vocab_size} (got {draft_probs.shape[-1]})"
        )
    else:
        probs = draft_probs[:, :width].to("cpu", torch.float32)
    return tokens, probs * real[..., None], lengths


@torch.inference_mode()
def speculative_generate(
    target: LanguageModel,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
    *,
    k: int = 4,
    seed: int | Sequence[int] = 0,
    max_tokens: int = 128,
    draft_proposal: str = "argmax",
    stop_tokens: Iterable[int] = (),
    on_step: OnStep | None = None,
) -> GenerationResult:
    """Speculative decoding: per step the drafter proposes up to k tokens per row, the target scores the
    context plus drafts in one pass, `specverify.stochastic_acceptance_sampler` decides, the committed
    tokens are appended and the target's cache rolled back past the rejected ones.

    Arguments as in `plain_generate`, plus k >= 0 draft tokens per step and draft_proposal: "argmax"
    (any draft; the output is token-identical to plain_generate with the same seed) or "sampled" (the
    drafter samples and passes its distributions; same output distribution as plain_generate).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0 (got {k!r})")
    if draft_proposal not in DRAFT_PROPOSALS:
        raise ValueError(f'draft_proposal must be "argmax" or "sampled" (got {draft_proposal!r})')
    sampled = draft_proposal == "sampled"
    requests = _Requests(prompts, max_tokens, stop_tokens, seed)
    rows: RowParams = row_params(params, len(requests.contexts))
    result = GenerationResult(requests.generated)
    session = _prefill(target, requests, result)
    start = time.perf_counter()
    while any(requests.active):
        seeds = requests.seeds()
        draft = drafter.propose(requests.contexts, k, params=rows, seeds=seeds, sampled=sampled)
        drafts, probs, drafted = _fit_draft(
            draft.tokens, draft.probs, requests.draft_limits(k), sampled, target.vocab_size
        )
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
            draft_proposal=draft_proposal,
            draft_probs_full=None if probs is None else probs.to(device),
            min_p=on.min_p,
        )
        committed, num = specverify.committed_tokens(first, recovered, bonus)
        tokens = [row[:n] for row, n in zip(committed.tolist(), num.tolist())]
        kept = _commit_step(requests, result, tokens, drafted.tolist(), first.tolist(), on_step)
        session.truncate(before + kept)
    result.decode_seconds = time.perf_counter() - start
    return result
