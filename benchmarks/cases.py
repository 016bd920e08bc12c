"""The verifier cases of issue 24, shared by the benchmarks that measure them (bench_traffic.py: memory traffic
of the Triton kernels; bench_cpu_floor.py: the CPU kernels' time beside one read of the logits).

Each case is one `stochastic_acceptance_sampler` call with validate=False on `specverify.bench.inputs.make_batch`
logits (a few heavy head tokens over a Gaussian tail; "flat": the tail alone, scaled down), every row with
the case's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specverify.bench.inputs import make_batch


@dataclass(frozen=True)
class Case:
    """One row setting, applied to every row of the batch; flat: logits without heavy head tokens, * 0.1;
    block: the sampled drafts judged as a block (verification="block", SPEC §3.6)."""

    temperature: float
    top_k: int = -1
    top_p: float = 1.0
    min_p: float | None = None
    sampled: bool = False
    flat: bool = False
    block: bool = False


#: The cases of issue 24's table (the first four), then min-p, top-p alone and a flat row (many candidates), then
#: block verification (issue 32) beside token-wise sampled drafts, with and without truncation (rows on
#: candidates, rows walked by tiles).
CASES = {
    "argmax, temperature only": Case(0.8),
    "argmax, temperature + top-k 50 + top-p 0.9": Case(0.8, 50, 0.9),
    "greedy rows": Case(0.0),
    "sampled, temperature + top-k 50 + top-p 0.9": Case(0.8, 50, 0.9, sampled=True),
    "argmax, temperature + top-k 50 + top-p 0.9 + min-p 0.05": Case(0.8, 50, 0.9, min_p=0.05),
    "argmax, temperature + top-p 0.95": Case(1.0, top_p=0.95),
    "argmax, flat logits, temperature + top-p 0.9": Case(1.0, top_p=0.9, flat=True),
    "block, temperature + top-k 50 + top-p 0.9": Case(0.8, 50, 0.9, sampled=True, block=True),
    "sampled, temperature only": Case(0.8, sampled=True),
    "block, temperature only": Case(0.8, sampled=True, block=True),
}


def logits_for(case: Case, batch: int, positions: int, vocab: int, dtype: torch.dtype) -> dict:
    """The verifier's arguments for one case (validate=False), on make_batch's inputs."""
    made = make_batch(batch, positions, vocab, dtype)
    logits = made.target_logits
    if case.flat:
        logits = (torch.randn(logits.shape, generator=torch.Generator().manual_seed(1)) * 0.1).to(dtype)
    arguments = dict(
        draft_tokens=made.draft_tokens,
        target_logits=logits,
        temperature=torch.full((batch,), case.temperature),
        top_k=torch.full((batch,), case.top_k),
        max_k=None,
        top_p=torch.full((batch,), case.top_p),
        min_top_p=None,
        seed=made.seed,
        validate=False,
    )
    if case.min_p is not None:
        arguments["min_p"] = torch.full((batch,), case.min_p)
    if case.sampled:
        arguments.update(draft_proposal="sampled", draft_probs_full=made.draft_probs)
    if case.block:
        arguments["verification"] = "block"
    return arguments
