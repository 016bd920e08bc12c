#!/usr/bin/env python
"""Run specverify's exactness, statistical and parity checks on a CUDA device.

    python scripts/check_cuda.py                 # on cuda (Triton kernels), against the CPU; exits 0 with a
                                                 # message if no CUDA
    python scripts/check_cuda.py --quick         # smaller sizes (about a minute on a GPU, plus Triton's compiles)
    python scripts/check_cuda.py --candidate-backend torch --quick
                                                 # the torch reference path on CUDA instead
    python scripts/check_cuda.py --device cpu --candidate-fallback --quick
                                                 # the same logic on the CPU: compiled kernels vs torch path
    TRITON_INTERPRET=1 python scripts/check_cuda.py --device cpu --candidate-backend triton --quick
                                                 # the Triton kernels under the interpreter, on the CPU

On the GPU machine, with the project's sources on the path (no install needed), the whole GPU evidence is:

    PYTHONPATH=src python scripts/check_cuda.py --quick && PYTHONPATH=src python -m specverify.cli bench --device cuda

Three sections, each on the device under test (the "candidate"):

1. exactness: `truncated_probs` against the float64 oracle `specverify.audit.exact.truncated_distribution`
   (same kept set, probabilities within float32 rounding) over a grid of temperatures, top-k, top-p, min-p,
   masks, ties and dtypes; plus the SPEC §2 top-p conditions on a nearly flat 256k vocabulary; greedy rows
   equal the argmax; `keyed_uniform` is bit-identical to the CPU's.
2. statistics: thousands of rows with their own seeds per group; the committed token at every position is
   chi-square tested against the exact float64 law p~ (argmax and sampled drafts), the first rejection
   against its exact law, and a known-wrong law is shown to be rejected at the same sample size (power).
3. parity: the same inputs on the reference (default: the CPU) and on the candidate. Tokens must be
   identical except where a draw sits on a rounding boundary. Every differing (row, position) is classified:
     boundary   the uniform lies within --rtol (relative) of a float64 CDF boundary between the two tokens,
                or between the two devices' CDF boundaries (their rounding straddles it); for sampled
                drafts the accept coin u*q(d) is likewise within --rtol of p~(d), or straddled;
     kept-set   the two devices' p~ have different supports (a top-k/top-p/min-p boundary rounded
                differently); its differing mass is reported, and above --kept-set-mass it is a failure;
     unexplained anything else: a failure.
   The section reports how often each happens.

The last line of the output is one JSON object with every result. Exit status: 0 when every check passed
(or when there is no CUDA device to check), 1 when a check failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import sys
import time
from typing import Iterator

import numpy as np
import torch

import specverify as sv
from specverify.audit.exact import first_rejection_law, truncated_distribution
from specverify import kernels

STREAM_TARGET, STREAM_ACCEPT, STREAM_RESIDUAL = 0, 1, 2
GREEDY_TEMPERATURE = 1e-5
#: A correct sampler passes each chi-square test at this level; the wrong variant must fall below POWER_P.
PASS_P = 1e-4
POWER_P = 1e-6


# ---------------------------------------------------------------------------------------------------------
# Where a computation runs


@dataclasses.dataclass(frozen=True)
class Target:
    """A device, and the backend that runs there: None for the device's default (CPU: the compiled C
    kernels; CUDA: Triton), or "torch", "native", "triton" (SPECVERIFY_BACKEND). native=False is the older
    spelling of backend="torch"."""

    device: str
    native: bool = True
    perturb_ulps: int = 0  # test hook: nudge float32 logits by this many ulps to emulate other rounding
    backend: str | None = None

    @property
    def forced_backend(self) -> str | None:
        return self.backend or (None if self.native else "torch")

    def __str__(self) -> str:
        text = self.device
        if self.forced_backend:
            text += " (torch path)" if self.forced_backend == "torch" else f" ({self.forced_backend})"
        return text + (f" (+-{self.perturb_ulps} ulp)" if self.perturb_ulps else "")


@contextlib.contextmanager
def running_on(target: Target) -> Iterator[None]:
    """Inside the block, specverify runs on the target's backend (SPECVERIFY_BACKEND), when it names one."""
    with kernels.forced(target.forced_backend):
        yield


def _to(value, target: Target, perturb: bool = False):
    if not isinstance(value, torch.Tensor):
        return value
    if perturb and target.perturb_ulps and value.dtype == torch.float32:
        value = perturb_ulps(value, target.perturb_ulps, seed=1234)
    return value.to(target.device)


def perturb_ulps(x: torch.Tensor, ulps: int, seed: int) -> torch.Tensor:
    """x with every finite entry moved by `ulps` float32 ulps up or down at random."""
    g = torch.Generator().manual_seed(seed)
    away = torch.rand(x.shape, generator=g) < 0.5  # away from zero, or towards it
    moved = (x.contiguous().view(torch.int32) + torch.where(away, ulps, -ulps).to(torch.int32)).view(torch.float32)
    keep = torch.isfinite(moved) & torch.isfinite(x) & (x != 0) & (torch.signbit(moved) == torch.signbit(x))
    return torch.where(keep, moved, x)


def run_verifier(args: dict, target: Target):
    """stochastic_acceptance_sampler on the target; outputs back on the CPU."""
    moved = {name: _to(value, target, perturb=name == "target_logits") for name, value in args.items()}
    with running_on(target):
        out = sv.stochastic_acceptance_sampler(**moved)
    if target.device.startswith("cuda"):
        torch.cuda.synchronize()
    return tuple(t.cpu() for t in out)


def run_truncated_probs(logits2d, temperature, top_k, top_p, min_p, bitmask, target: Target) -> torch.Tensor:
    with running_on(target):
        probs = sv.truncated_probs(
            _to(logits2d, target, perturb=True), _to(temperature, target), _to(top_k, target), _to(top_p, target),
            _to(min_p, target), _to(bitmask, target),
        )
    return probs.cpu()


# ---------------------------------------------------------------------------------------------------------
# 1. Exactness


def exactness_check(target: Target, quick: bool = False) -> dict:
    """truncated_probs on the target against the float64 oracle; greedy = argmax; uniforms bit-identical."""
    rng = np.random.default_rng(7)
    failures: list[str] = []
    worst_abs = 0.0
    rows_checked = 0

    def compare(logits, temperature, top_k, top_p, min_p, allowed, dtype, label):
        nonlocal worst_abs, rows_checked
        n, vocab = logits.shape
        x = torch.as_tensor(logits, dtype=torch.float32).to(dtype)
        bitmask = None if allowed is None else sv.pack_bitmask(torch.as_tensor(allowed))
        got = run_truncated_probs(
            x, torch.as_tensor(temperature, dtype=torch.float32), torch.as_tensor(top_k, dtype=torch.int64),
            torch.as_tensor(top_p, dtype=torch.float32), torch.as_tensor(min_p, dtype=torch.float32), bitmask, target,
        ).double().numpy()
        exact_logits = x.float().double().numpy()
        for row in range(n):
            want = truncated_distribution(
                exact_logits[row], float(np.float32(temperature[row])), int(top_k[row]), float(np.float32(top_p[row])),
                float(np.float32(min_p[row])), None if allowed is None else allowed[row],
            )
            rows_checked += 1
            if not np.array_equal(got[row] > 0, want > 0):
                failures.append(f"{label} row {row}: kept set differs ({int((got[row] > 0).sum())} vs {int((want > 0).sum())} tokens)")
                continue
            error = np.abs(got[row] - want)
            worst_abs = max(worst_abs, float(error.max()))
            if not np.all(error <= 2e-6 + 1e-4 * want):
                failures.append(f"{label} row {row}: probabilities differ by {error.max():.3g}")

    vocab = 40
    grid = list(itertools.product([0.0, 0.3, 1.0, 2.5], [-1, 1, 3, vocab, vocab + 5], [1.0, 0.9, 0.5, 0.05], [0.0, 0.1, 0.6]))
    if quick:
        grid = grid[::3]
    params = [np.array(column) for column in zip(*grid)]
    for ties, dtype in [(False, torch.float32), (True, torch.float32), (False, torch.float16), (False, torch.bfloat16)]:
        logits = rng.normal(0, 2, size=(len(grid), vocab))
        logits = np.round(logits) if ties else logits
        compare(logits, *params, None, dtype, f"grid ties={ties} {dtype}")
    n, vocab = (8, 5000) if quick else (48, 5000)
    allowed = rng.random((n, vocab)) < 0.7
    compare(
        rng.normal(0, 3, size=(n, vocab)), rng.choice([0.5, 1.0, 1.7], size=n), rng.choice([-1, 1, 7, 100, 4000], size=n),
        rng.choice([1.0, 0.95, 0.7, 0.2], size=n), rng.choice([0.0, 0.01, 0.3], size=n), allowed, torch.float32, "V=5000 masked",
    )

    flat = nucleus_conditions(target, vocab=256_000, rows=2 if quick else 8, top_p=0.99, scale=1e-2)
    if flat["worst_excess"] > 1e-5 or flat["worst_deficit"] > 1e-5 or not flat["threshold_sets"]:
        failures.append(f"nearly flat 256k vocabulary, top_p 0.99: kept set off by {max(flat['worst_excess'], flat['worst_deficit']):.3g} of the mass")

    # greedy rows are the argmax; keyed uniforms are bit-identical to the CPU's
    logits = torch.randn(64, 3000, generator=torch.Generator().manual_seed(3))
    logits[::3, 7] = logits[::3].amax(-1) + 0  # ties with the max: the lowest id wins
    with running_on(target):
        greedy = sv.sample(_to(logits, target), 0.0, -1, 1.0, 0).cpu()
    if not torch.equal(greedy, logits.argmax(-1)):
        failures.append("greedy sample is not the argmax")
    keys = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63)] + list(range(1000)), dtype=torch.int64)
    for stream in (STREAM_TARGET, STREAM_ACCEPT, STREAM_RESIDUAL):
        if not torch.equal(sv.keyed_uniform(_to(keys, target), stream).cpu(), sv.keyed_uniform(keys, stream)):
            failures.append(f"keyed_uniform stream {stream} differs from the CPU")
    return dict(rows=rows_checked, worst_abs_error=worst_abs, flat_256k=flat, failures=failures, passed=not failures)


def nucleus_conditions(target: Target, vocab: int, rows: int, top_p: float, scale: float, seed: int = 0) -> dict:
    """SPEC §2 step 4 on a nearly flat vocabulary, in float64 on the float32 weights exp((x - max) / T):
    the kept set is {w >= t}; its mass reaches top_p; the mass strictly above t does not (else t could
    be higher). Returns the worst relative excess / deficit (each should be <= ~1e-6)."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    probs = run_truncated_probs(logits, torch.ones(rows), torch.full((rows,), -1), torch.full((rows,), top_p), None, None, target)
    weights = torch.exp(logits - logits.amax(-1, keepdim=True)).double()
    worst_excess, worst_deficit, threshold_sets = -1.0, -1.0, True
    for row in range(rows):
        w, kept = weights[row], probs[row] > 0
        total, t = w.sum(), w[kept].min()
        worst_excess = max(worst_excess, float((w[w > t].sum() / total) / top_p - 1))
        worst_deficit = max(worst_deficit, float(1 - (w[kept].sum() / total) / top_p))
        threshold_sets &= bool(torch.equal(kept, w >= t))
    return dict(vocab=vocab, rows=rows, top_p=top_p, worst_excess=worst_excess, worst_deficit=worst_deficit, threshold_sets=threshold_sets)


# ---------------------------------------------------------------------------------------------------------
# 2. Statistics


def chi_square_p_value(samples: np.ndarray, law: np.ndarray) -> float:
    """p-value of ids against law [V]; bins expected < 5 pooled; a sample where the law is 0 gives 0."""
    from scipy import stats

    counts = np.bincount(np.asarray(samples).reshape(-1), minlength=len(law)).astype(np.float64)
    if counts[law == 0].sum() > 0:
        return 0.0
    expected = law * counts.sum()
    big = expected >= 5
    observed = np.concatenate([counts[big], [counts[~big].sum()]])
    expected = np.concatenate([expected[big], [expected[~big].sum()]])
    keep = expected > 0
    if keep.sum() < 2:
        return 1.0
    return float(stats.chisquare(observed[keep], expected[keep]).pvalue)


STAT_GROUPS = [  # temperature, top_k, top_p, min_p, masked
    (1.0, -1, 1.0, 0.0, False),
    (0.7, 5, 1.0, 0.0, False),
    (1.3, -1, 0.8, 0.0, False),
    (1.0, 6, 0.7, 0.05, True),
]


def statistics_check(target: Target, rows_per_group: int = 20_000, seed: int = 10) -> dict:
    """Committed tokens follow p~ at every position (argmax and sampled drafts); f follows its exact law."""
    try:
        import scipy  # noqa: F401
    except ImportError:
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
    laws = np.array([[truncated_distribution(logits[g, j], *STAT_GROUPS[g][:4], allowed[g, j]) for j in range(positions + 1)] for g in range(groups)])
    column = lambda i, dtype: torch.tensor([group[i] for group in STAT_GROUPS], dtype=dtype).repeat_interleave(rows_per_group)  # noqa: E731
    n = groups * rows_per_group
    args = dict(
        target_logits=torch.as_tensor(logits).repeat_interleave(rows_per_group, 0), temperature=column(0, torch.float32),
        top_k=column(1, torch.int64), max_k=None, top_p=column(2, torch.float32), min_top_p=None,
        seed=torch.randint(-(2**62), 2**62, (n,), generator=torch.Generator().manual_seed(seed)),
        token_bitmasks=sv.pack_bitmask(torch.as_tensor(allowed)).repeat_interleave(rows_per_group, 0), min_p=column(3, torch.float32),
    )
    results, failures = [], []
    # drafts: "argmax" mode with each position's most likely token; "sampled" mode with drafts drawn from a
    # q that half agrees with p~ (q = .5 p~ + .5 uniform)
    q = 0.5 * laws[:, :positions] + 0.5 / vocab
    draws = np.stack([[rng.choice(vocab, size=rows_per_group, p=q[g, j]) for j in range(positions)] for g in range(groups)])
    modes = {
        "argmax": (torch.as_tensor(laws.argmax(-1)[:, :positions]).repeat_interleave(rows_per_group, 0), {}),
        "sampled": (torch.as_tensor(draws.transpose(0, 2, 1).reshape(n, positions)),
                    dict(draft_proposal="sampled", draft_probs_full=torch.as_tensor(q, dtype=torch.float32).repeat_interleave(rows_per_group, 0))),
    }
    for mode, (draft, extra) in modes.items():
        first, recovered, bonus = run_verifier(dict(draft_tokens=draft, **args, **extra), target)
        tokens, _ = sv.committed_tokens(first, recovered, bonus)
        first, tokens = first.numpy(), tokens.numpy()
        for g in range(groups):
            block = slice(g * rows_per_group, (g + 1) * rows_per_group)
            for j in range(positions + 1):
                reached = first[block] >= j
                p = chi_square_p_value(tokens[block][reached, j], laws[g, j])
                results.append(dict(mode=mode, group=g, position=j, n=int(reached.sum()), p_value=p))
                if p <= PASS_P:
                    failures.append(f"{mode} group {g} position {j}: chi-square p = {p:.3g} (n = {int(reached.sum())})")
            if mode == "argmax":
                accept = [laws[g, j, int(draft[g * rows_per_group, j])] for j in range(positions)]
            else:
                accept = [float(np.minimum(laws[g, j], q[g, j]).sum()) for j in range(positions)]
            law = first_rejection_law(accept)
            p = chi_square_p_value(first[block], law)
            results.append(dict(mode=mode, group=g, position="f", n=rows_per_group, p_value=p))
            if p <= PASS_P:
                failures.append(f"{mode} group {g}: first rejection chi-square p = {p:.3g}")
    # power: the untruncated softmax (a known-wrong law for a truncated group) is caught at the same size
    g = 2
    wrong = np.exp((logits[g, 0] - logits[g, 0].max()) / STAT_GROUPS[g][0])
    wrong /= wrong.sum()
    wrong_samples = rng.choice(vocab, size=rows_per_group, p=wrong)
    power_p = chi_square_p_value(wrong_samples, laws[g, 0])
    if power_p >= POWER_P:
        failures.append(f"power: the untruncated law was not caught (p = {power_p:.3g}, n = {rows_per_group})")
    smallest = min(r["p_value"] for r in results)
    return dict(rows_per_group=rows_per_group, tests=len(results), smallest_p_value=smallest, power_p_value=power_p,
                failures=failures, passed=not failures)


# ---------------------------------------------------------------------------------------------------------
# 3. Parity


@dataclasses.dataclass
class Case:
    name: str
    args: dict  # CPU tensors; per-request seeds [B]


def parity_cases(quick: bool = False, seed: int = 0, include_flat_256k: bool = True) -> list[Case]:
    """Calls that cover every rule, truncation, masks, dtypes and several vocabulary sizes."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    scale = 1 if quick else 8

    def base(batch, positions, vocab, dtype=torch.float32, logit_scale=2.0):
        pick = lambda values, dt: torch.tensor(values, dtype=dt)[torch.randint(0, len(values), (batch,), generator=g)]  # noqa: E731
        logits = torch.randn(batch, positions + 1, vocab, generator=g) * logit_scale
        allowed = torch.rand(batch, positions + 1, vocab, generator=g) < 0.8
        allowed.scatter_(-1, logits.argmax(-1, keepdim=True), True)
        bitmask = sv.pack_bitmask(allowed)
        bitmask[::2] = -1  # half the rows unmasked
        draft = torch.where(torch.rand(batch, positions, generator=g) < 0.5, logits[:, :positions].argmax(-1),
                            torch.randint(0, vocab, (batch, positions), generator=g))
        draft[::5, positions // 2:] = -1
        return dict(
            draft_tokens=draft, target_logits=logits.to(dtype),
            temperature=pick([0.0, 0.5, 1.0, 1.5, 1e-5], torch.float32), top_k=pick([-1, 1, 5, 50, vocab // 2, vocab], torch.int64),
            max_k=None, top_p=pick([1.0, 0.95, 0.8, 0.5, 0.1], torch.float32), min_top_p=None,
            seed=torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g), token_bitmasks=bitmask,
            min_p=pick([0.0, 0.0, 0.05, 0.3], torch.float32),
        )

    def with_q(args, kinds=("softmax", "zero", "one-hot", "target")):
        batch, positions = args["draft_tokens"].shape
        vocab = args["target_logits"].shape[-1]
        softmax = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 2, -1)
        one_hot = torch.nn.functional.one_hot(args["draft_tokens"].clamp(min=0), vocab).float()
        target = _target_probs(args)[:, :positions]
        table = {"softmax": softmax, "zero": torch.zeros_like(softmax), "one-hot": one_hot, "target": target}
        choice = torch.randint(0, len(kinds), (batch, positions), generator=g)
        q = torch.stack([table[k] for k in kinds]).gather(0, choice[None, ..., None].expand(1, batch, positions, vocab))[0]
        present = args["draft_tokens"] >= 0
        has_mass = q.sum(-1) > 0
        sampled = torch.multinomial(q.reshape(-1, vocab) + (~has_mass).reshape(-1, 1).float(), 1, generator=g).view(batch, positions)
        args["draft_tokens"] = torch.where(present & has_mass, sampled, args["draft_tokens"])
        return {**args, "draft_proposal": "sampled", "draft_probs_full": q}

    cases.append(Case("argmax V=1000", base(64 * scale, 4, 1000)))
    cases.append(Case("argmax V=50 fp16", base(64 * scale, 3, 50, torch.float16)))
    cases.append(Case("argmax V=5000 bf16", base(16 * scale, 2, 5000, torch.bfloat16)))
    cases.append(Case("sampled V=1000", with_q(base(64 * scale, 4, 1000))))
    cases.append(Case("sampled V=64", with_q(base(64 * scale, 4, 64))))
    relaxed = base(64 * scale, 4, 300)
    relaxed.update(in_thinking_phase=torch.rand(64 * scale, generator=g) < 0.5, relaxed_topk=3, relaxed_delta=0.2)
    cases.append(Case("relaxed V=300", relaxed))
    cases.append(Case("argmax V=32000", base(4 * scale, 2, 32000, logit_scale=3.0)))
    cases.extend(boundary_cases(64 * scale, seed=seed + 1))
    if include_flat_256k:
        flat = base(2 * (1 if quick else 4), 1, 256_000, logit_scale=1e-2)
        flat.update(temperature=torch.ones(flat["temperature"].shape), top_p=torch.full(flat["top_p"].shape, 0.9),
                    top_k=torch.full(flat["top_k"].shape, -1), min_p=None, token_bitmasks=None)
        cases.append(Case("argmax flat V=256000", flat))
    return cases


def boundary_cases(batch: int, seed: int = 1) -> list[Case]:
    """Draws placed on a CDF boundary on purpose: each row's logits are log-probabilities whose CDF (in
    float64) passes exactly through that row's uniform, so the token drawn depends on float32 rounding
    alone. This measures how the two targets round where it matters (natural mismatches are very rare).
    "argmax": p = [u/2, u/2, (1-u)/2, (1-u)/2] at every position (the boundary after token 1 is u);
    "sampled": draft 0 with q one-hot at 0 and p~(0) = u_accept (the coin u * q(d) >= p~(d) is a tie)."""
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g)
    positions = 2
    keys = seeds[:, None] + torch.arange(positions + 1)
    common = dict(temperature=torch.ones(batch), top_k=torch.full((batch,), -1), max_k=None, top_p=torch.ones(batch),
                  min_top_p=None, seed=seeds)
    u = sv.keyed_uniform(keys, STREAM_TARGET)
    p = torch.stack([u / 2, u / 2, (1 - u) / 2, (1 - u) / 2], -1)
    argmax = dict(draft_tokens=torch.full((batch, positions), -1), target_logits=p.log().float(), **common)
    ua = sv.keyed_uniform(keys, STREAM_ACCEPT)
    p = torch.stack([ua, 1 - ua], -1)
    sampled = dict(draft_tokens=torch.zeros(batch, positions, dtype=torch.int64), target_logits=p.log().float(), **common,
                   draft_proposal="sampled", draft_probs_full=torch.nn.functional.one_hot(torch.zeros(batch, positions, dtype=torch.int64), 2).float())
    return [Case("on-boundary argmax", argmax), Case("on-boundary sampled", sampled)]


def _flat_params(args: dict):
    batch, positions = args["draft_tokens"].shape
    vocab = args["target_logits"].shape[-1]
    rep = lambda t: None if t is None else t.repeat_interleave(positions + 1)  # noqa: E731
    bitmask = args.get("token_bitmasks")
    return (args["target_logits"].reshape(-1, vocab), rep(args["temperature"]), rep(args["top_k"]), rep(args["top_p"]),
            rep(args.get("min_p")), None if bitmask is None else bitmask.reshape(batch * (positions + 1), -1))


def _target_probs(args: dict, target: Target = Target("cpu")) -> torch.Tensor:
    batch, positions = args["draft_tokens"].shape
    return run_truncated_probs(*_flat_params(args), target).view(batch, positions + 1, -1)


def _near_boundary(u: float, cdfs: list[np.ndarray], low: int, high: int, rtol: float) -> tuple[bool, float]:
    """Whether u is within rtol (relative) of a CDF boundary between tokens low..high, or straddled by the
    devices' boundaries. Returns (explained, the smallest relative distance to a reference boundary)."""
    reference = cdfs[0][low:high]
    if len(reference) == 0:
        return False, float("inf")
    distance = float(np.min(np.abs(u - reference) / np.maximum(reference, 1e-300)))
    straddled = any(
        (min(a, b) - rtol * max(a, b) <= u <= max(a, b) + rtol * max(a, b)) for a, b in zip(cdfs[0][low:high], cdfs[1][low:high])
    )
    return distance <= rtol or straddled, distance


def _cdf(p: np.ndarray) -> np.ndarray:
    total = p.sum()
    return np.cumsum(p) / total if total > 0 else np.cumsum(p)


def _draw_mismatch(u: float, p_ref: np.ndarray, p_cand: np.ndarray, a: int, b: int, rtol: float, kept_mass: float) -> tuple[str, float]:
    """Classify two different inverse-CDF draws of one uniform from two devices' versions of a law."""
    if not np.array_equal(p_ref > 0, p_cand > 0):
        differing = float(p_ref[(p_ref > 0) != (p_cand > 0)].sum() + p_cand[(p_ref > 0) != (p_cand > 0)].sum())
        return ("kept-set" if differing <= kept_mass else "kept-set-large"), differing
    low, high = min(a, b), max(a, b)
    explained, distance = _near_boundary(u, [_cdf(p_ref), _cdf(p_cand)], low, high, rtol)
    return ("boundary" if explained else "unexplained"), distance


def _residual(p: np.ndarray, q: np.ndarray, d: int) -> np.ndarray:
    if d < 0:
        return p
    if q[d] > 0:
        r = np.maximum(p - q, 0.0)
    else:
        r = p.copy()
        r[d] = 0.0
    return r if r.sum() > 0 else p


def compare_case(case: Case, reference: Target, candidate: Target, rtol: float = 1e-6, kept_mass: float = 1e-4) -> dict:
    """Run one case on both targets and classify every differing (row, position)."""
    args = case.args
    batch, positions = args["draft_tokens"].shape
    ref = run_verifier(args, reference)
    cand = run_verifier(args, candidate)
    counts = {"boundary": 0, "kept-set": 0, "kept-set-large": 0, "unexplained": 0}
    tie_rtol = max(rtol, 4 * candidate.perturb_ulps * 2.0**-23)  # a perturbed candidate saw other logits
    details = []
    if all(torch.equal(x, y) for x, y in zip(ref, cand)):
        return dict(case=case.name, positions=batch * (positions + 1), mismatches=0, **counts, details=details)

    p_ref = _target_probs(args, reference).double().numpy()
    p_cand = _target_probs(args, candidate).double().numpy()
    seeds = args["seed"].to(torch.int64)
    keys = seeds[:, None] + torch.arange(positions + 1)
    uniforms = {s: sv.keyed_uniform(keys, s).numpy() for s in (STREAM_TARGET, STREAM_ACCEPT, STREAM_RESIDUAL)}
    temperature = args["temperature"]
    greedy = (temperature < GREEDY_TEMPERATURE).numpy()
    relaxed = np.zeros(batch, dtype=bool)
    if args.get("in_thinking_phase") is not None:
        relaxed = args["in_thinking_phase"].numpy() & ~greedy
    sampled = args.get("draft_proposal") == "sampled"
    q = args["draft_probs_full"].double().numpy() if sampled else None
    draft = args["draft_tokens"].to(torch.int64)
    draft = torch.where(((draft >= 0).to(torch.int64).cumprod(-1)).bool(), draft, -1).numpy()
    logits = args["target_logits"].reshape(batch, positions + 1, -1).float()
    if args.get("token_bitmasks") is not None:
        logits = logits.masked_fill(~sv.unpack_bitmask(args["token_bitmasks"], logits.shape[-1]), float("-inf"))
    logits = logits.double().numpy()
    # per position: recovered (positions < K) and bonus (position K)
    tokens_ref = torch.cat([ref[1], ref[2]], 1).numpy()
    tokens_cand = torch.cat([cand[1], cand[2]], 1).numpy()
    for b, j in zip(*np.nonzero(tokens_ref != tokens_cand)):
        a, c = int(tokens_ref[b, j]), int(tokens_cand[b, j])
        kind, distance = "unexplained", float("inf")
        if greedy[b]:
            x = logits[b, j]
            near_tie = abs(x[a] - x[c]) <= tie_rtol * max(abs(x[a]), abs(x[c]), 1e-30)
            kind = "boundary" if near_tie else "unexplained"
        elif relaxed[b] and j < positions:
            near = _relaxed_near_tie(logits[b, j], int(draft[b, j]), args["relaxed_topk"], args["relaxed_delta"], tie_rtol)
            kind = "boundary" if near else "unexplained"
        elif sampled and j < positions:
            d = int(draft[b, j])
            if d >= 0 and (a == d) != (c == d):  # one device accepted, the other rejected: the coin u * q(d) vs p~(d)
                u = float(uniforms[STREAM_ACCEPT][b, j])
                qd = q[b, j, d] if q[b, j, d] > 0 else 1.0
                values = [p_ref[b, j, d], p_cand[b, j, d]]
                straddled = (u * qd >= values[0]) != (u * qd >= values[1])
                distance = min(abs(u * qd - v) / max(v, 1e-300) for v in values)
                kind = "boundary" if straddled or distance <= rtol else "unexplained"
                if kind == "unexplained" and not np.array_equal(p_ref[b, j] > 0, p_cand[b, j] > 0):
                    kind = "kept-set"
            else:
                u = float(uniforms[STREAM_RESIDUAL][b, j])
                kind, distance = _draw_mismatch(u, _residual(p_ref[b, j], q[b, j], d), _residual(p_cand[b, j], q[b, j], d), a, c, rtol, kept_mass)
        else:
            kind, distance = _draw_mismatch(float(uniforms[STREAM_TARGET][b, j]), p_ref[b, j], p_cand[b, j], a, c, rtol, kept_mass)
        counts[kind] += 1
        if len(details) < 20:
            details.append(dict(row=int(b), position=int(j), reference=a, candidate=c, kind=kind, measure=distance))
    mismatches = int((tokens_ref != tokens_cand).sum())
    return dict(case=case.name, positions=batch * (positions + 1), mismatches=mismatches, **counts, details=details)


def _relaxed_near_tie(x: np.ndarray, d: int, topk: int, delta: float, rtol: float) -> bool:
    """Whether the relaxed decision for draft d sits within rounding of one of its two boundaries."""
    if d < 0:
        return False
    p = np.exp(x - x.max())
    p /= p.sum()
    close = abs(p[d] - (p.max() - delta)) <= rtol * max(p.max(), 1e-30) + 1e-7
    order = np.sort(p)[::-1]
    kth = order[min(topk, len(p)) - 1]
    tie = abs(p[d] - kth) <= rtol * max(kth, 1e-30) + 1e-9
    return bool(close or tie)


def parity_check(reference: Target, candidate: Target, quick: bool = False, rtol: float = 1e-6, kept_mass: float = 1e-4,
                 cases: list[Case] | None = None) -> dict:
    results = [compare_case(case, reference, candidate, rtol, kept_mass) for case in (cases if cases is not None else parity_cases(quick))]
    total = {key: sum(r[key] for r in results) for key in ("positions", "mismatches", "boundary", "kept-set", "kept-set-large", "unexplained")}
    failures = [f"{r['case']}: {r['unexplained']} unexplained, {r['kept-set-large']} large kept-set differences"
                for r in results if r["unexplained"] or r["kept-set-large"]]
    natural = [r for r in results if not r["case"].startswith("on-boundary")]
    constructed = [r for r in results if r["case"].startswith("on-boundary")]
    rate = lambda rs: sum(r["mismatches"] for r in rs) / max(sum(r["positions"] for r in rs), 1)  # noqa: E731
    return dict(reference=str(reference), candidate=str(candidate), rtol=rtol, cases=results, total=total,
                mismatch_rate=total["mismatches"] / max(total["positions"], 1), natural_mismatch_rate=rate(natural),
                on_boundary_mismatch_rate=rate(constructed), failures=failures, passed=not failures)


# ---------------------------------------------------------------------------------------------------------
# Driver


def _print_report(report: dict, out=None) -> None:
    out = out or sys.stdout
    print(f"specverify check: candidate {report['candidate']} against reference {report['reference']}", file=out)
    if "exactness" in report:
        e = report["exactness"]
        flat = e["flat_256k"]
        print(f"  exactness   {'PASS' if e['passed'] else 'FAIL'}  {e['rows']} rows vs float64 oracle, worst |p - exact| {e['worst_abs_error']:.2e}; "
              f"flat V=256000 top_p {flat['top_p']}: excess {flat['worst_excess']:.2e}, deficit {flat['worst_deficit']:.2e}", file=out)
    if "statistics" in report:
        s = report["statistics"]
        if "skipped" in s:
            print(f"  statistics  SKIP  {s['skipped']}", file=out)
        else:
            print(f"  statistics  {'PASS' if s['passed'] else 'FAIL'}  {s['tests']} chi-square tests, {s['rows_per_group']} rows/group, "
                  f"smallest p {s['smallest_p_value']:.3g}; power: wrong law p {s['power_p_value']:.3g}", file=out)
    if "parity" in report:
        p = report["parity"]
        print(f"  parity      {'PASS' if p['passed'] else 'FAIL'}  {p['total']['mismatches']} of {p['total']['positions']} positions differ: "
              f"boundary {p['total']['boundary']}, kept-set {p['total']['kept-set']}, kept-set-large {p['total']['kept-set-large']}, "
              f"unexplained {p['total']['unexplained']}; rate on ordinary inputs {p['natural_mismatch_rate']:.2e}, "
              f"on draws placed on a boundary {p['on_boundary_mismatch_rate']:.2e}", file=out)
        print(f"    {'case':<24} {'positions':>10} {'differ':>7} {'boundary':>9} {'kept-set':>9} {'unexplained':>12}", file=out)
        for r in p["cases"]:
            print(f"    {r['case']:<24} {r['positions']:>10} {r['mismatches']:>7} {r['boundary']:>9} {r['kept-set'] + r['kept-set-large']:>9} {r['unexplained']:>12}", file=out)
            for d in r["details"][:5]:
                what = "differing mass" if d["kind"].startswith("kept-set") else "relative distance to the nearest boundary"
                print(f"      row {d['row']} position {d['position']}: token {d['reference']} vs {d['candidate']} ({d['kind']}, "
                      f"{what} {d['measure']:.2e})", file=out)
    for section in ("exactness", "statistics", "parity"):
        for failure in report.get(section, {}).get("failures", []):
            print(f"  FAILED {section}: {failure}", file=out)


def run_checks(candidate: Target, reference: Target, quick: bool, rows_per_group: int, rtol: float, kept_mass: float,
               sections=("exactness", "statistics", "parity")) -> dict:
    report: dict = dict(candidate=str(candidate), reference=str(reference), torch=torch.__version__)
    if candidate.device.startswith("cuda"):
        report["device_name"] = torch.cuda.get_device_name(torch.device(candidate.device))
    started = time.time()
    if "exactness" in sections:
        report["exactness"] = exactness_check(candidate, quick)
    if "statistics" in sections:
        report["statistics"] = statistics_check(candidate, rows_per_group)
    if "parity" in sections:
        report["parity"] = parity_check(reference, candidate, quick, rtol, kept_mass)
    report["seconds"] = round(time.time() - started, 1)
    report["passed"] = all(report[s]["passed"] for s in sections)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="the device under test (default: cuda)")
    parser.add_argument("--reference", default="cpu", help="the device it is compared with (default: cpu)")
    parser.add_argument("--candidate-fallback", action="store_true", help="on the CPU: test the torch path (no compiled kernels)")
    parser.add_argument("--reference-fallback", action="store_true", help="on the CPU: the reference uses the torch path")
    parser.add_argument("--candidate-backend", choices=["torch", "native", "triton"], default=None,
                        help="force the candidate's backend (default: the device's own: CUDA -> triton, CPU -> native)")
    parser.add_argument("--perturb-ulps", type=int, default=0, help="self-test: nudge the candidate's float32 logits by N ulps")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--rows", type=int, default=None, help="rows per statistical group (default 20000, quick 4000)")
    parser.add_argument("--rtol", type=float, default=1e-6, help="relative distance to a CDF boundary that explains a mismatch")
    parser.add_argument("--kept-set-mass", type=float, default=1e-4, help="largest differing mass of a kept-set difference")
    parser.add_argument("--sections", default="exactness,statistics,parity")
    options = parser.parse_args(argv)
    sections = tuple(s for s in options.sections.split(",") if s)
    if set(sections) - {"exactness", "statistics", "parity"}:
        parser.error(f"unknown sections {sorted(set(sections) - {'exactness', 'statistics', 'parity'})}")

    for device in (options.device, options.reference):
        if device.startswith("cuda") and not torch.cuda.is_available():
            print(f"check_cuda: no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False); nothing was "
                  "checked. Use --device cpu --candidate-fallback to run the same checks on the CPU.")
            print(json.dumps(dict(skipped=True, reason="no CUDA device", passed=True)))
            return 0
        try:
            torch.empty(1, device=device)
        except (RuntimeError, AssertionError) as error:
            print(f"check_cuda: cannot use device {device!r}: {error}")
            print(json.dumps(dict(skipped=True, reason=f"device {device} unusable", passed=False)))
            return 2

    candidate = Target(options.device, native=not options.candidate_fallback, perturb_ulps=options.perturb_ulps,
                       backend=options.candidate_backend)
    reference = Target(options.reference, native=not options.reference_fallback)
    rows = options.rows or (4000 if options.quick else 20_000)
    report = run_checks(candidate, reference, options.quick, rows, options.rtol, options.kept_set_mass, sections)
    _print_report(report)
    print(json.dumps(report, default=float))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
