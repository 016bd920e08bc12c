"""What peers run in the verifier's place, on the benchmark's inputs: a sort-based sampler (HF warpers, vLLM's
native path), FlashInfer's sort-free samplers (CUDA) and Modular MAX's CPU verifier, each where it imports."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .inputs import Batch


def sort_based_baseline(batch: Batch) -> torch.Tensor:
    """What peers do (HF warpers, vLLM's native path): sort, cumulative sum, mask, softmax, and an
    exponential race. Returns one sampled token per position: int64 [B*(K+1)]."""
    positions = batch.target_logits.shape[0] // batch.temperature.shape[0]
    logits = batch.target_logits.float()
    temperature = batch.temperature.clamp(min=1e-5).repeat_interleave(positions)[:, None]
    top_k = batch.top_k.repeat_interleave(positions)
    top_p = batch.top_p.repeat_interleave(positions)[:, None]
    sorted_logits, order = torch.sort(logits / temperature, dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1])
    outside_k = (top_k[:, None] > 0) & (ranks >= top_k[:, None])
    sorted_logits = sorted_logits.masked_fill(outside_k, float("-inf"))
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    outside_p = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    sorted_logits = sorted_logits.masked_fill(outside_p, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    race = probs / torch.empty_like(probs).exponential_()
    return order.gather(1, race.argmax(-1, keepdim=True))[:, 0]


def flashinfer_calls(batch: Batch) -> tuple[dict[str, Callable[[], object]], str | None]:
    """FlashInfer's sort-free samplers on the same inputs, where `flashinfer` imports (CUDA only): top-k/top-p
    sampling from the logits of every position, and the chain speculative sampling of sampled drafts from
    the target's probabilities (no per-request seeds, min-p or masks), timed with and without the softmax
    that makes those probabilities. Returns ({case name: call}, why there are none); a call that fails its
    first run is left out, with a line on stdout that says why."""
    if batch.target_logits.device.type != "cuda":
        return {}, "FlashInfer runs on CUDA only"
    try:
        sampling = importlib.import_module("flashinfer.sampling")
    except Exception as error:
        return {}, f"flashinfer is not importable ({type(error).__name__}: {error})"
    requests, positions = batch.draft_tokens.shape
    logits = batch.target_logits.float()

    def per_row(t):
        return t.repeat_interleave(positions + 1)

    top_k, top_p = (
        per_row(torch.where(batch.top_k > 0, batch.top_k, logits.shape[-1])).int(),
        per_row(batch.top_p).float(),
    )
    target_probs = torch.softmax(logits, -1).view(requests, positions + 1, -1)
    draft = batch.draft_tokens.int()

    def chain(probs: torch.Tensor) -> object:
        return sampling.chain_speculative_sampling(batch.draft_probs, draft, probs)

    calls = {
        "flashinfer top_k_top_p_sampling_from_logits": lambda: sampling.top_k_top_p_sampling_from_logits(
            logits, top_k, top_p
        ),
        "flashinfer chain_speculative_sampling": lambda: chain(target_probs),
        "flashinfer softmax + chain_speculative_sampling": lambda: chain(
            torch.softmax(logits, -1).view(requests, positions + 1, -1)
        ),
    }
    working = {}
    for name, run in calls.items():
        try:
            run()
            working[name] = run
        except Exception as error:
            print(f"{name}: skipped ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
    return working, None


def max_verifier(batch: Batch) -> Callable[[], object] | None:
    """Modular MAX's CPU verifier, when its package is importable (an optional extra)."""
    try:
        sampling = importlib.import_module("max.nn.sampling")
    except ImportError:
        return None
    return lambda: sampling.stochastic_acceptance_sampler(
        batch.draft_tokens,
        batch.target_logits,
        batch.temperature,
        batch.top_k,
        -1,
        batch.top_p,
        float(batch.top_p.min()),
        batch.seed,
    )
