"""The state both decoding loops keep, and the steps they share: a batch of requests being generated
(`BatchState`), the prefill before the first step, the commit after each, and the end of a generation.

The target session holds each row's context except its last token, whose logits the next step needs.
Row b's n-th generated token is keyed by `specverify.request_seed(base_seed[b], n)` (`BatchState.seeds`,
SPEC §4), whatever was drafted: this is what makes the loops' output independent of the drafter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import torch

from ...contract import DRAFT_PROPOSALS, PAD, VERIFICATIONS
from ...rng import request_seed
from ..constraints.grammar import Grammar, GrammarMatchers, grammar_rows
from ..constraints.thinking import ThinkingRegions
from ..drafting.base import pad_rows
from ..engines.base import LanguageModel, Session, check_context
from ..params import base_seeds
from .result import GenerationResult, StepEvent
from .warmup import warm_up

OnStep = Callable[[StepEvent], None]
GrammarArg = Grammar | Sequence[Grammar | None] | None


class BatchState:
    """The batch being generated: each row's context, its generated tokens, whether it still runs and
    whether it is inside a thinking region (`thinking`, all False without regions)."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int | Sequence[int],
        stop_tokens: Iterable[int],
        seed,
        regions: ThinkingRegions | None,
    ):
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
            raise ValueError(f"prompts must be a non-empty list of token-id lists (got {prompts!r:.80})")
        for b, p in enumerate(prompts):
            if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or not p:
                raise ValueError(f"prompts[{b}] must be a non-empty list of token ids (got {p!r:.80})")
        self.max_tokens = [max_tokens] * len(prompts) if not isinstance(max_tokens, Sequence) else list(max_tokens)
        if len(self.max_tokens) != len(prompts) or not all(
            isinstance(m, int) and not isinstance(m, bool) and m >= 0 for m in self.max_tokens
        ):
            raise ValueError(f"max_tokens must be an int >= 0 or one per prompt (got {max_tokens!r:.80})")
        self.contexts = [list(p) for p in prompts]
        self.generated: list[list[int]] = [[] for _ in prompts]
        self.active = [m > 0 for m in self.max_tokens]
        self.stop_tokens = frozenset(stop_tokens)
        self.base_seeds = base_seeds(seed, len(prompts))
        if regions is not None and not isinstance(regions, ThinkingRegions):
            raise ValueError(f"thinking must be a ThinkingRegions or None (got {regions!r:.80})")
        self.regions = regions
        self.thinking = [regions is not None and regions.inside(p) for p in prompts]

    def seeds(self) -> torch.Tensor:
        """int64 [B]: the verifier's per-request seed, the key of each row's next token (SPEC §4)."""
        counts = torch.tensor([len(g) for g in self.generated], dtype=torch.int64)  # lengths: valid by construction
        return request_seed(self.base_seeds, counts, validate=False)

    def last_tokens(self) -> torch.Tensor:
        """int64 [B, 1]: each running row's last context token (not yet in the cache); -1 for finished rows."""
        return torch.tensor([[c[-1] if a else PAD] for c, a in zip(self.contexts, self.active)], dtype=torch.int64)

    def draft_budgets(self) -> list[int]:
        """How many draft tokens each row can still use (one token of its budget is the verifier's own);
        0 for finished rows."""
        return [m - len(g) - 1 if a else 0 for g, a, m in zip(self.generated, self.active, self.max_tokens)]

    def through_stop(self, drafts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Each draft's length cut just after its first stop token. drafts: int64 [B, K], -1 padded;
        lengths: int64 [B] -> int64 [B]."""
        stop = self.stop_tokens
        ends = [next((i + 1 for i, t in enumerate(row) if t in stop), len(row)) for row in drafts.tolist()]
        return torch.minimum(lengths, torch.tensor(ends, dtype=torch.int64))

    def free(self) -> list[bool]:
        """Per row: the grammar does not apply this step (the row is inside a thinking region, or finished)."""
        return [t or not a for t, a in zip(self.thinking, self.active)]

    def commit(self, row: int, tokens: list[int]) -> list[int]:
        """Append tokens to a running row, cut at its budget, after a stop token and after a thinking
        boundary (see `thinking`). Returns those kept."""
        kept = tokens[: self.max_tokens[row] - len(self.generated[row])]
        for i, token in enumerate(kept):
            if token in self.stop_tokens:
                kept = kept[: i + 1]
                break
        if self.regions is not None:
            kept = self.regions.cut(kept)
            self.thinking[row] = self.regions.inside(kept, self.thinking[row])
        self.contexts[row] += kept
        self.generated[row] += kept
        if len(self.generated[row]) >= self.max_tokens[row] or (kept and kept[-1] in self.stop_tokens):
            self.active[row] = False
        return kept


def prefill(target: LanguageModel, requests: BatchState, result: GenerationResult) -> Session:
    """A session holding every prompt but its last token, after checking that every request fits the
    target's context and after the one-time warm-up (`warmup`), so that neither is timed as decoding."""
    check_context(target, requests.contexts, requests.max_tokens)
    start = time.perf_counter()
    session = target.session(len(requests.contexts))
    session.extend(pad_rows([c[:-1] for c in requests.contexts]), return_logits=False)
    result.prefill_seconds = time.perf_counter() - start
    result.warmup_seconds = warm_up(target.vocab_size, session.lengths.device)
    return session


def grammar_matchers(grammar: GrammarArg, requests: BatchState, vocab_size: int) -> GrammarMatchers | None:
    """The grammar state of a generation, or None when no row is constrained."""
    rows = grammar_rows(grammar, len(requests.contexts))
    for g in rows:
        if g is not None and not g.stop_tokens <= requests.stop_tokens:
            raise ValueError(
                f"the grammar's stop tokens {sorted(g.stop_tokens)} must be among stop_tokens "
                f"(got {sorted(requests.stop_tokens)})"
            )
    return None if all(g is None for g in rows) else GrammarMatchers(rows, vocab_size)


def commit_step(
    requests: BatchState,
    result: GenerationResult,
    tokens: list[list[int]],
    drafted: list[int],
    first_rejected: list[int],
    on_step: OnStep | None,
    matchers: GrammarMatchers | None,
) -> list[list[int]]:
    """Commit one step's tokens to the running rows, count it, advance the grammar of the rows that were
    constrained (not thinking) and report it. tokens[b]: what the verifier committed for row b.
    Returns the tokens kept per row (none for finished rows)."""
    running = [b for b, a in enumerate(requests.active) if a]
    result.record([drafted[b] for b in running], [first_rejected[b] for b in running])
    free = requests.free()
    kept_rows: list[list[int]] = [[] for _ in tokens]
    for b in running:
        kept = kept_rows[b] = requests.commit(b, tokens[b])
        if matchers is not None and not free[b]:
            matchers.advance(b, kept)
        first = first_rejected[b]
        if on_step is not None and kept:
            on_step(StepEvent(b, kept, min(first, len(kept)), first < drafted[b] and len(kept) > first))
    return kept_rows


def finish(result: GenerationResult, matchers: GrammarMatchers | None, start: float) -> GenerationResult:
    result.decode_seconds = time.perf_counter() - start
    result.grammar_complete = None if matchers is None else matchers.complete()
    return result


def check_verification(verification: str, sampled: bool) -> None:
    """Raise ValueError unless verification is "token" or "block", and "block" only with sampled proposals
    (SPEC §3.6)."""
    if verification not in VERIFICATIONS:
        raise ValueError(f'verification must be "token" or "block" (got {verification!r})')
    if verification == "block" and not sampled:
        raise ValueError('verification="block" needs draft_proposal="sampled" (SPEC §3.6)')


def check_draft_proposal(draft_proposal: str) -> bool:
    """Raise ValueError unless draft_proposal is "argmax" or "sampled" -> whether it is "sampled"."""
    if draft_proposal not in DRAFT_PROPOSALS:
        raise ValueError(f'draft_proposal must be "argmax" or "sampled" (got {draft_proposal!r})')
    return draft_proposal == "sampled"
