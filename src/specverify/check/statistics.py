"""Statistics on the target: the verifier's committed tokens against exact float64 laws, by chi-square (the
audit's, `audit.stats`), with power shown.

Thousands of rows with their own seeds per group of sampling parameters; the committed token at every
position is tested against p~ (argmax and sampled drafts), the first rejection against its exact law, and
a known-wrong law (the untruncated softmax) is shown to be rejected at the same sample size.
"""

from __future__ import annotations

import numpy as np
import torch

import specverify as sv

from ..audit.exact import first_rejection_law, truncated_distribution
from .targets import Target, run_verifier

STAT_GROUPS = [  # temperature, top_k, top_p, min_p, masked
    (1.0, -1, 1.0, 0.0, False),
    (0.7, 5, 1.0, 0.0, False),
    (1.3, -1, 0.8, 0.0, False),
    (1.0, 6, 0.7, 0.05, True),
]


def statistics_check(target: Target, rows_per_group: int = 20_000, seed: int = 10) -> dict:
    """Committed tokens follow p~ at every position (argmax and sampled drafts); f follows its exact law.
    V = 12, K = 3, rows_per_group rows for each of STAT_GROUPS -> the report's section (tests, p-values, power)."""
    try:
        from ..audit.stats import PASS_P_VALUE, POWER_P_VALUE, samples_p_value
    except ImportError:  # the audit's statistics need scipy
        return dict(skipped="scipy is not installed", passed=True, failures=[])
    rng = np.random.default_rng(seed)
    vocab, positions = 12, 3
    groups = len(STAT_GROUPS)
    logits = rng.normal(0, 1.5, size=(groups, positions + 1, vocab)).astype(np.float32)
    allowed = np.ones((groups, positions + 1, vocab), dtype=bool)
    for g, group in enumerate(STAT_GROUPS):
        if group[4]:
            allowed[g] = rng.random((positions + 1, vocab)) < 0.6
            allowed[g, :, logits[g].argmax(-1)] = True
    laws = np.array(
        [
            [truncated_distribution(logits[g, j], *STAT_GROUPS[g][:4], allowed[g, j]) for j in range(positions + 1)]
            for g in range(groups)
        ]
    )

    def column(i, dtype):
        return torch.tensor([group[i] for group in STAT_GROUPS], dtype=dtype).repeat_interleave(rows_per_group)

    n = groups * rows_per_group
    args = dict(
        target_logits=torch.as_tensor(logits).repeat_interleave(rows_per_group, 0),
        temperature=column(0, torch.float32),
        top_k=column(1, torch.int64),
        max_k=None,
        top_p=column(2, torch.float32),
        min_top_p=None,
        seed=torch.randint(-(2**62), 2**62, (n,), generator=torch.Generator().manual_seed(seed)),
        token_bitmasks=sv.pack_bitmask(torch.as_tensor(allowed)).repeat_interleave(rows_per_group, 0),
        min_p=column(3, torch.float32),
    )
    results, failures = [], []
    # drafts: "argmax" mode with each position's most likely token; "sampled" mode with drafts drawn from a
    # q that half agrees with p~ (q = .5 p~ + .5 uniform)
    q = 0.5 * laws[:, :positions] + 0.5 / vocab
    draws = np.stack(
        [[rng.choice(vocab, size=rows_per_group, p=q[g, j]) for j in range(positions)] for g in range(groups)]
    )
    modes = {
        "argmax": (torch.as_tensor(laws.argmax(-1)[:, :positions]).repeat_interleave(rows_per_group, 0), {}),
        "sampled": (
            torch.as_tensor(draws.transpose(0, 2, 1).reshape(n, positions)),
            dict(
                draft_proposal="sampled",
                draft_probs_full=torch.as_tensor(q, dtype=torch.float32).repeat_interleave(rows_per_group, 0),
            ),
        ),
    }
    for mode, (draft, extra) in modes.items():
        first, recovered, bonus = run_verifier(dict(draft_tokens=draft, **args, **extra), target)
        tokens, _ = sv.committed_tokens(first, recovered, bonus)
        first, tokens = first.numpy(), tokens.numpy()
        for g in range(groups):
            block = slice(g * rows_per_group, (g + 1) * rows_per_group)
            for j in range(positions + 1):
                reached = first[block] >= j
                p = samples_p_value(tokens[block][reached, j], laws[g, j])
                results.append(dict(mode=mode, group=g, position=j, n=int(reached.sum()), p_value=p))
                if p <= PASS_P_VALUE:
                    failures.append(f"{mode} group {g} position {j}: chi-square p = {p:.3g} (n = {int(reached.sum())})")
            if mode == "argmax":
                accept = [laws[g, j, int(draft[g * rows_per_group, j])] for j in range(positions)]
            else:
                accept = [float(np.minimum(laws[g, j], q[g, j]).sum()) for j in range(positions)]
            law = first_rejection_law(accept)
            p = samples_p_value(first[block], law)
            results.append(dict(mode=mode, group=g, position="f", n=rows_per_group, p_value=p))
            if p <= PASS_P_VALUE:
                failures.append(f"{mode} group {g}: first rejection chi-square p = {p:.3g}")
    # power: the untruncated softmax (a known-wrong law for a truncated group) is caught at the same size
    g = 2
    wrong = np.exp((logits[g, 0] - logits[g, 0].max()) / STAT_GROUPS[g][0])
    wrong /= wrong.sum()
    wrong_samples = rng.choice(vocab, size=rows_per_group, p=wrong)
    power_p = samples_p_value(wrong_samples, laws[g, 0])
    if power_p >= POWER_P_VALUE:
        failures.append(f"power: the untruncated law was not caught (p = {power_p:.3g}, n = {rows_per_group})")
    smallest = min(r["p_value"] for r in results)
    return dict(
        rows_per_group=rows_per_group,
        tests=len(results),
        smallest_p_value=smallest,
        power_p_value=power_p,
        failures=failures,
        passed=not failures,
    )
