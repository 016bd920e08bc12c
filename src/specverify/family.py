"""The rest of the verifier family (SPEC §7): greedy-only, synthetic acceptance for benchmarks, and the
configurable `AcceptanceSampler` that picks one of them."""

from __future__ import annotations

import torch

from . import checks
from .contract import DRAFT_PROPOSALS
from .rng import STREAM_ACCEPT, keyed_uniform, per_row_seeds, row_keys
from .sampler import stochastic_acceptance_sampler


def greedy_acceptance_sampler(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor, token_bitmasks: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SPEC §3.3 for every row: accept iff the draft equals the argmax of the masked target logits.

    draft_tokens: int [B, K]; target_logits: float [B*(K+1), V] or [B, K+1, V];
    token_bitmasks: int32 [B, K+1, ceil(V/32)] or None. Returns (first_rejected_idx [B],
    recovered_tokens [B, K], bonus_tokens [B, 1]), int64, as stochastic_acceptance_sampler.
    """
    return stochastic_acceptance_sampler(
        draft_tokens, target_logits, 0.0, -1, -1, 1.0, 1.0, 0, token_bitmasks=token_bitmasks
    )


def compute_synthetic_acceptance_base_rate(p_avg: float, n: int) -> float:
    """The per-position acceptance rate r whose mean joint acceptance over n positions is p_avg.

    Position k (1-based) is reached with probability r**k, so the expected accepted length is
    sum_{k=1..n} r**k and its mean per drafted position is p_avg = (1/n) * sum_{k=1..n} r**k. The mean
    is increasing in r, 0 only at r = 0 and 1 only at r = 1, so the endpoints are returned exactly (as is
    p_avg itself for n = 1); otherwise r is found by bisection down to float resolution, and the closer
    of the last two candidates is returned. p_avg in [0, 1]; n >= 1. Returns r in [0, 1].
    """
    p_avg = checks.check_float("p_avg", p_avg, 0.0, 1.0, "in [0, 1]")
    n = checks.check_int("n", n, minimum=1)
    if p_avg in (0.0, 1.0) or n == 1:
        return p_avg
    low, high = 0.0, 1.0
    while low < (middle := (low + high) / 2) < high:
        low, high = (middle, high) if _mean_joint_acceptance(middle, n) < p_avg else (low, middle)
    return min((low, high), key=lambda r: abs(_mean_joint_acceptance(r, n) - p_avg))


def _mean_joint_acceptance(r: float, n: int) -> float:
    """(1/n) * sum_{k=1..n} r**k: the mean per drafted position of the expected accepted length."""
    return sum(r**k for k in range(1, n + 1)) / n


def synthetic_acceptance_sampler(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    base_acceptance_rate: float,
    num_draft_steps: int,
    seed: int | torch.Tensor,
    **sampling,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Benchmarking mode: each draft position is accepted independently with probability
    `base_acceptance_rate` (a keyed coin on the accept stream), whatever the target says.

    Recovered and bonus tokens are the target's own argmax-mode draws from p~, so the committed stream
    stays well formed. num_draft_steps must equal K. `sampling` takes the keyword arguments of
    stochastic_acceptance_sampler (temperature, top_k, max_k, top_p, min_top_p, token_bitmasks, min_p,
    validate); temperature defaults to 0 (greedy), top_k to -1 and top_p to 1.
    Returns (first_rejected_idx [B], recovered_tokens [B, K], bonus_tokens [B, 1]), int64.
    """
    rate = checks.check_float("base_acceptance_rate", base_acceptance_rate, 0.0, 1.0, "in [0, 1]")
    steps = checks.check_int("num_draft_steps", num_draft_steps, minimum=0)
    checks.check_tensor("draft_tokens", draft_tokens, checks.INDEX_DTYPES, "an int32 or int64 tensor [B, K]")
    if draft_tokens.dim() != 2 or draft_tokens.shape[1] != steps:
        raise ValueError(
            f"num_draft_steps must equal K = draft_tokens.shape[1] (got {steps} for shape {list(draft_tokens.shape)})"
        )
    allowed = {"temperature", "top_k", "max_k", "top_p", "min_top_p", "token_bitmasks", "min_p", "validate"}
    unknown = sorted(set(sampling) - allowed)
    if unknown:
        raise TypeError(
            f"synthetic_acceptance_sampler got unknown sampling arguments {unknown} (allowed: {sorted(allowed)})"
        )
    params = {"temperature": 0.0, "top_k": -1, "max_k": None, "top_p": 1.0, "min_top_p": None, **sampling}
    _, target_sample, bonus = stochastic_acceptance_sampler(
        torch.full_like(draft_tokens, -1),
        target_logits,
        params.pop("temperature"),
        params.pop("top_k"),
        params.pop("max_k"),
        params.pop("top_p"),
        params.pop("min_top_p"),
        seed,
        **params,
    )
    if params.get("validate", True):  # the verifier above saw only padding: the drafts' ids are checked here
        checks.check_draft_ids(draft_tokens, target_logits.shape[-1])
    batch = draft_tokens.shape[0]
    shared_seed, shared = checks.check_seed(seed, batch, target_sample.device)
    keys = row_keys(per_row_seeds(shared_seed, shared, batch, target_sample.device), steps)
    coins = keyed_uniform(keys, STREAM_ACCEPT) < rate
    present = (draft_tokens >= 0).to(torch.int64).cumprod(-1).bool()
    accepted = coins & present
    recovered = torch.where(accepted, draft_tokens.to(torch.int64), target_sample)
    return accepted.to(torch.int64).cumprod(-1).sum(-1), recovered, bonus


class AcceptanceSampler:
    """A configured verifier: synthetic when `synthetic_acceptance_rate` is set, else stochastic when
    `use_stochastic`, else greedy (SPEC §7). Configuration errors raise here, at construction.

    synthetic_acceptance_rate: the mean per-position acceptance p_avg in [0, 1] (converted with
    compute_synthetic_acceptance_base_rate over num_draft_steps), or None.
    """

    def __init__(
        self,
        synthetic_acceptance_rate: float | None = None,
        num_draft_steps: int = 1,
        use_stochastic: bool = False,
        draft_proposal: str = "argmax",
        vocab_size: int | None = None,
        relaxed_topk: int | None = None,
        relaxed_delta: float | None = None,
    ) -> None:
        self.num_draft_steps = checks.check_int("num_draft_steps", num_draft_steps, minimum=1)
        if draft_proposal not in DRAFT_PROPOSALS:
            raise ValueError(f'draft_proposal must be "argmax" or "sampled" (got {draft_proposal!r})')
        if (relaxed_topk is None) != (relaxed_delta is None):
            raise ValueError(
                "relaxed_topk and relaxed_delta must be given together or not at all "
                f"(got relaxed_topk={relaxed_topk!r}, relaxed_delta={relaxed_delta!r})"
            )
        if relaxed_topk is not None:
            if draft_proposal != "argmax":
                raise ValueError(f'relaxed_topk/relaxed_delta need draft_proposal="argmax" (got "{draft_proposal}")')
            checks.check_int("relaxed_topk", relaxed_topk, minimum=1)
            checks.check_float("relaxed_delta", relaxed_delta, 0.0, float("inf"), "a float >= 0")
        if vocab_size is not None:
            checks.check_int("vocab_size", vocab_size, minimum=1)
        if synthetic_acceptance_rate is not None:
            checks.check_float("synthetic_acceptance_rate", synthetic_acceptance_rate, 0.0, 1.0, "in [0, 1]")
        self.base_acceptance_rate = (
            None
            if synthetic_acceptance_rate is None
            else compute_synthetic_acceptance_base_rate(synthetic_acceptance_rate, self.num_draft_steps)
        )
        self.synthetic_acceptance_rate = synthetic_acceptance_rate
        self.use_stochastic = bool(use_stochastic)
        self.draft_proposal = draft_proposal
        self.vocab_size = vocab_size
        self.relaxed_topk = relaxed_topk
        self.relaxed_delta = relaxed_delta

    @property
    def mode(self) -> str:
        """ "synthetic", "stochastic" or "greedy": the verifier this configuration calls."""
        if self.base_acceptance_rate is not None:
            return "synthetic"
        return "stochastic" if self.use_stochastic else "greedy"

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        target_logits: torch.Tensor,
        *,
        seed: int | torch.Tensor | None = None,
        temperature: torch.Tensor | None = None,
        top_k: torch.Tensor | None = None,
        max_k: int | torch.Tensor | None = None,
        top_p: torch.Tensor | None = None,
        min_top_p: float | torch.Tensor | None = None,
        in_thinking_phase: torch.Tensor | None = None,
        token_bitmasks: torch.Tensor | None = None,
        draft_probs_full: torch.Tensor | None = None,
        min_p: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Verify with the configured mode. Missing sampling arguments default to temperature 1 (0 in
        synthetic mode), no top-k, top_p 1 and seed 0. Returns (first_rejected_idx, recovered, bonus)."""
        seed = 0 if seed is None else seed
        top_k = -1 if top_k is None else top_k
        top_p = 1.0 if top_p is None else top_p
        if self.mode == "synthetic":
            sampling = {
                "temperature": 0.0 if temperature is None else temperature,
                "top_k": top_k,
                "max_k": max_k,
                "top_p": top_p,
                "min_top_p": min_top_p,
                "token_bitmasks": token_bitmasks,
                "min_p": min_p,
            }
            return synthetic_acceptance_sampler(
                draft_tokens, target_logits, self.base_acceptance_rate, self.num_draft_steps, seed, **sampling
            )
        if self.mode == "greedy":
            return greedy_acceptance_sampler(draft_tokens, target_logits, token_bitmasks)
        return stochastic_acceptance_sampler(
            draft_tokens,
            target_logits,
            1.0 if temperature is None else temperature,
            top_k,
            max_k,
            top_p,
            min_top_p,
            seed,
            in_thinking_phase=in_thinking_phase,
            relaxed_topk=self.relaxed_topk,
            relaxed_delta=self.relaxed_delta,
            token_bitmasks=token_bitmasks,
            draft_proposal=self.draft_proposal,
            draft_probs_full=draft_probs_full,
            vocab_size=self.vocab_size,
            min_p=min_p,
        )
