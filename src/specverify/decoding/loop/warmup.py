"""One-time work done before anything is timed.

The first verifier call in a process builds (or loads) the compiled CPU kernels and starts their thread
pool; timed inside a decode, that second or so made a fresh install report no speedup at all. `warm_up`
makes one small call per verifier mode and one plain sample, through the public API only, on the real
vocabulary, so that every lazily built piece exists before the first timed step. It runs once per
(vocabulary size, device) and process; later calls return at once.
"""

from __future__ import annotations

import time

import torch

import specverify

_warmed: set[tuple[int, str]] = set()

#: Draft positions of the warm-up calls: enough to take the verifier's batched paths, cheap at any V.
WARM_UP_DRAFT = 2


def _verify_each_mode(vocab_size: int, device: torch.device) -> None:
    """One verifier call per mode on logits [2, WARM_UP_DRAFT + 1, vocab_size]: greedy and sampling rows
    with every truncation, argmax and sampled proposals, a grammar mask, relaxed thinking rows."""
    batch, k = 2, WARM_UP_DRAFT
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, k + 1, vocab_size, generator=generator).to(device)
    draft = torch.zeros(batch, k, dtype=torch.int64, device=device)
    temperature = torch.tensor([0.0, 0.7], device=device)
    top_k = torch.tensor([0, 20], device=device)
    top_p = torch.tensor([1.0, 0.9], device=device)
    min_p = torch.tensor([0.0, 0.05], device=device)
    seed = torch.tensor([1, 2], device=device)
    common = (draft, logits, temperature, top_k, None, top_p, None, seed)
    masks = specverify.pack_bitmask(torch.ones(batch, k + 1, vocab_size, dtype=torch.bool)).to(device)
    probs = torch.nn.functional.one_hot(draft, vocab_size).float()
    specverify.stochastic_acceptance_sampler(*common, min_p=min_p)
    specverify.stochastic_acceptance_sampler(*common, token_bitmasks=masks, min_p=min_p)
    specverify.stochastic_acceptance_sampler(*common, draft_proposal="sampled", draft_probs_full=probs)
    thinking = torch.ones(batch, dtype=torch.bool, device=device)
    specverify.stochastic_acceptance_sampler(*common, in_thinking_phase=thinking, relaxed_topk=10, relaxed_delta=0.5)
    specverify.sample(logits[:, 0], temperature, top_k, top_p, seed, min_p)


def warm_up(vocab_size: int, device: torch.device | str = "cpu") -> float:
    """Build and load everything the verifier builds lazily, for logits of this vocabulary on this device.

    Returns the seconds it took (0.0 when this process had already warmed up for (vocab_size, device)).
    """
    device = torch.device(device)
    key = (vocab_size, str(device))
    if key in _warmed:
        return 0.0
    start = time.perf_counter()
    with torch.inference_mode():
        _verify_each_mode(vocab_size, device)
    _warmed.add(key)
    return time.perf_counter() - start
