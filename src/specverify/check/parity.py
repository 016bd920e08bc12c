"""Parity: the same calls on the reference (default: the CPU) and on the candidate, every differing token
classified. Tokens must be identical except where a draw sits on a rounding boundary.

Each differing (row, position) is one of:
  boundary     the uniform lies within rtol (relative) of a float64 CDF boundary between the two tokens, or
               between the two devices' CDF boundaries (their rounding straddles it); for sampled drafts
               the accept coin u*q(d) is likewise within rtol of p~(d), or straddled;
  kept-set     the two devices' p~ have different supports (a top-k/top-p/min-p boundary rounded
               differently); its differing mass is reported, and above kept_mass it is a failure
               (kept-set-large);
  unexplained  anything else: a failure.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

import specverify as sv

from ..contract import GREEDY_TEMPERATURE, PAD
from ..rng import STREAM_ACCEPT, STREAM_RESIDUAL, STREAM_TARGET
from .targets import Target, run_truncated_probs, run_verifier


@dataclasses.dataclass
class Case:
    """One call of the verifier. args: its keyword arguments, CPU tensors (draft_tokens [B, K],
    target_logits [B, K+1, V], per-row parameters and seeds [B])."""

    name: str
    args: dict


def parity_cases(quick: bool = False, seed: int = 0, include_flat_256k: bool = True) -> list[Case]:
    """Calls that cover every rule, truncation, masks, dtypes and several vocabulary sizes."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    scale = 1 if quick else 8

    def base(batch, positions, vocab, dtype=torch.float32, logit_scale=2.0):
        def pick(values, dt):
            return torch.tensor(values, dtype=dt)[torch.randint(0, len(values), (batch,), generator=g)]

        logits = torch.randn(batch, positions + 1, vocab, generator=g) * logit_scale
        allowed = torch.rand(batch, positions + 1, vocab, generator=g) < 0.8
        allowed.scatter_(-1, logits.argmax(-1, keepdim=True), True)
        bitmask = sv.pack_bitmask(allowed)
        bitmask[::2] = -1  # half the rows unmasked
        draft = torch.where(
            torch.rand(batch, positions, generator=g) < 0.5,
            logits[:, :positions].argmax(-1),
            torch.randint(0, vocab, (batch, positions), generator=g),
        )
        draft[::5, positions // 2 :] = PAD
        return dict(
            draft_tokens=draft,
            target_logits=logits.to(dtype),
            temperature=pick([0.0, 0.5, 1.0, 1.5, 1e-5], torch.float32),
            top_k=pick([-1, 1, 5, 50, vocab // 2, vocab], torch.int64),
            max_k=None,
            top_p=pick([1.0, 0.95, 0.8, 0.5, 0.1], torch.float32),
            min_top_p=None,
            seed=torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g),
            token_bitmasks=bitmask,
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
        q = torch.stack([table[k] for k in kinds]).gather(
            0, choice[None, ..., None].expand(1, batch, positions, vocab)
        )[0]
        present = args["draft_tokens"] >= 0
        has_mass = q.sum(-1) > 0
        sampled = torch.multinomial(q.reshape(-1, vocab) + (~has_mass).reshape(-1, 1).float(), 1, generator=g).view(
            batch, positions
        )
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
        flat.update(
            temperature=torch.ones(flat["temperature"].shape),
            top_p=torch.full(flat["top_p"].shape, 0.9),
            top_k=torch.full(flat["top_k"].shape, -1),
            min_p=None,
            token_bitmasks=None,
        )
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
    common = dict(
        temperature=torch.ones(batch),
        top_k=torch.full((batch,), -1),
        max_k=None,
        top_p=torch.ones(batch),
        min_top_p=None,
        seed=seeds,
    )
    u = sv.keyed_uniform(keys, STREAM_TARGET)
    p = torch.stack([u / 2, u / 2, (1 - u) / 2, (1 - u) / 2], -1)
    argmax = dict(draft_tokens=torch.full((batch, positions), PAD), target_logits=p.log().float(), **common)
    ua = sv.keyed_uniform(keys, STREAM_ACCEPT)
    p = torch.stack([ua, 1 - ua], -1)
    sampled = dict(
        draft_tokens=torch.zeros(batch, positions, dtype=torch.int64),
        target_logits=p.log().float(),
        **common,
        draft_proposal="sampled",
        draft_probs_full=torch.nn.functional.one_hot(torch.zeros(batch, positions, dtype=torch.int64), 2).float(),
    )
    return [Case("on-boundary argmax", argmax), Case("on-boundary sampled", sampled)]


def _flat_params(args: dict):
    """A call's truncation inputs one row per (row, position): logits [B*(K+1), V], parameters [B*(K+1)],
    bitmask [B*(K+1), W] or None."""
    batch, positions = args["draft_tokens"].shape
    vocab = args["target_logits"].shape[-1]

    def rep(t):
        return None if t is None else t.repeat_interleave(positions + 1)

    bitmask = args.get("token_bitmasks")
    return (
        args["target_logits"].reshape(-1, vocab),
        rep(args["temperature"]),
        rep(args["top_k"]),
        rep(args["top_p"]),
        rep(args.get("min_p")),
        None if bitmask is None else bitmask.reshape(batch * (positions + 1), -1),
    )


def _target_probs(args: dict, target: Target = Target("cpu")) -> torch.Tensor:
    """p~ of every (row, position) of a call on the target: float32 [B, K+1, V]."""
    batch, positions = args["draft_tokens"].shape
    return run_truncated_probs(*_flat_params(args), target).view(batch, positions + 1, -1)


def _near_boundary(u: float, cdfs: list[np.ndarray], low: int, high: int, rtol: float) -> tuple[bool, float]:
    """Whether u is within rtol (relative) of a CDF boundary between tokens low..high, or straddled by the
    devices' boundaries. cdfs: the reference's and the candidate's, [V] each. Returns (explained, the
    smallest relative distance to a reference boundary)."""
    reference = cdfs[0][low:high]
    if len(reference) == 0:
        return False, float("inf")
    distance = float(np.min(np.abs(u - reference) / np.maximum(reference, 1e-300)))
    straddled = any(
        (min(a, b) - rtol * max(a, b) <= u <= max(a, b) + rtol * max(a, b))
        for a, b in zip(cdfs[0][low:high], cdfs[1][low:high])
    )
    return distance <= rtol or straddled, distance


def _cdf(p: np.ndarray) -> np.ndarray:
    """The CDF [V] of p [V], normalised when p has mass."""
    total = p.sum()
    return np.cumsum(p) / total if total > 0 else np.cumsum(p)


def _draw_mismatch(
    u: float, p_ref: np.ndarray, p_cand: np.ndarray, a: int, b: int, rtol: float, kept_mass: float
) -> tuple[str, float]:
    """Classify two different inverse-CDF draws a, b of one uniform from two devices' versions of a law
    (p_ref, p_cand: [V]) -> (kind, its measure: the differing mass or the distance to a boundary)."""
    if not np.array_equal(p_ref > 0, p_cand > 0):
        differing = float(p_ref[(p_ref > 0) != (p_cand > 0)].sum() + p_cand[(p_ref > 0) != (p_cand > 0)].sum())
        return ("kept-set" if differing <= kept_mass else "kept-set-large"), differing
    low, high = min(a, b), max(a, b)
    explained, distance = _near_boundary(u, [_cdf(p_ref), _cdf(p_cand)], low, high, rtol)
    return ("boundary" if explained else "unexplained"), distance


def _residual(p: np.ndarray, q: np.ndarray, d: int) -> np.ndarray:
    """The law [V] a rejected draft d is replaced from (SPEC §3.2): max(p - q, 0), or p without d when
    q(d) = 0; p itself when there is no draft or the residual has no mass. p, q: [V]."""
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
    draft = torch.where(((draft >= 0).to(torch.int64).cumprod(-1)).bool(), draft, PAD).numpy()
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
            near = _relaxed_near_tie(
                logits[b, j], int(draft[b, j]), args["relaxed_topk"], args["relaxed_delta"], tie_rtol
            )
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
                kind, distance = _draw_mismatch(
                    u, _residual(p_ref[b, j], q[b, j], d), _residual(p_cand[b, j], q[b, j], d), a, c, rtol, kept_mass
                )
        else:
            kind, distance = _draw_mismatch(
                float(uniforms[STREAM_TARGET][b, j]), p_ref[b, j], p_cand[b, j], a, c, rtol, kept_mass
            )
        counts[kind] += 1
        if len(details) < 20:
            details.append(dict(row=int(b), position=int(j), reference=a, candidate=c, kind=kind, measure=distance))
    mismatches = int((tokens_ref != tokens_cand).sum())
    return dict(case=case.name, positions=batch * (positions + 1), mismatches=mismatches, **counts, details=details)


def _relaxed_near_tie(x: np.ndarray, d: int, topk: int, delta: float, rtol: float) -> bool:
    """Whether the relaxed decision for draft d sits within rounding of one of its two boundaries. x: the
    masked logits [V] (float64)."""
    if d < 0:
        return False
    p = np.exp(x - x.max())
    p /= p.sum()
    close = abs(p[d] - (p.max() - delta)) <= rtol * max(p.max(), 1e-30) + 1e-7
    order = np.sort(p)[::-1]
    kth = order[min(topk, len(p)) - 1]
    tie = abs(p[d] - kth) <= rtol * max(kth, 1e-30) + 1e-9
    return bool(close or tie)


def parity_check(
    reference: Target,
    candidate: Target,
    quick: bool = False,
    rtol: float = 1e-6,
    kept_mass: float = 1e-4,
    cases: list[Case] | None = None,
) -> dict:
    """compare_case on every case (default: parity_cases(quick)) -> the report's section: per case and in
    total, and the mismatch rates on ordinary inputs and on draws placed on a boundary."""
    results = [
        compare_case(case, reference, candidate, rtol, kept_mass)
        for case in (cases if cases is not None else parity_cases(quick))
    ]
    total = {
        key: sum(r[key] for r in results)
        for key in ("positions", "mismatches", "boundary", "kept-set", "kept-set-large", "unexplained")
    }
    failures = [
        f"{r['case']}: {r['unexplained']} unexplained, {r['kept-set-large']} large kept-set differences"
        for r in results
        if r["unexplained"] or r["kept-set-large"]
    ]
    natural = [r for r in results if not r["case"].startswith("on-boundary")]
    constructed = [r for r in results if r["case"].startswith("on-boundary")]

    def rate(rs):
        return sum(r["mismatches"] for r in rs) / max(sum(r["positions"] for r in rs), 1)

    return dict(
        reference=str(reference),
        candidate=str(candidate),
        rtol=rtol,
        cases=results,
        total=total,
        mismatch_rate=total["mismatches"] / max(total["positions"], 1),
        natural_mismatch_rate=rate(natural),
        on_boundary_mismatch_rate=rate(constructed),
        failures=failures,
        passed=not failures,
    )
