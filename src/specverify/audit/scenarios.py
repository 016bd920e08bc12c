"""Chain scenarios: the matrix, what each scenario must commit (exact float64 laws from exact.py) and
how one is run as one batched call of a chain verifier (SPEC §1).

A scenario is one situation run as one batched call: every row has the same target logits, sampling
parameters and draft law, and its own seed; each row's draft at position j is drawn independently from
the draft law of j (padding included). Rows are therefore independent copies, and at each position the
committed token, given that the position was reached, has one exact law: `exact_laws`.

Scenarios are built from fixed seeds (one per name), so the matrix is the same on every run, and each
sits away from every truncation boundary (`check_well_posed`), so float32 rounding in a verifier
cannot legitimately change what it keeps.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import torch

from ..contract import PAD
from .blocks import outcome_law
from .calls import Observation, batched_call, min_p_and_mask, row_problems, shape_problems
from .exact import (
    GREEDY_TEMPERATURE,
    argmax_position_law,
    first_rejection_law,
    greedy_position_law,
    mixed_position_law,
    relaxed_position_law,
    sampled_position_law,
    truncated_distribution,
)
from .verifier import Verifier

SMALL_VOCAB = 12
LLM_VOCAB = 4096
SMALL_ROWS = 50_000
LLM_ROWS = 8_000
#: --quick runs the scenarios marked quick with this fraction of their rows.
QUICK_FRACTION = 0.1
#: Relative margin a scenario keeps from every top-p / min-p / relaxed-delta boundary: well above the
#: float32 rounding of a mass summed over V = 4096 tokens, well below a tail token's share of it.
BOUNDARY_MARGIN = 1e-5


@dataclass(frozen=True, eq=False)
class Scenario:
    """One audited situation. K = draft positions, V = vocabulary.

    logits: float32 [K+1, V], already rounded to `dtype` (what the verifier receives);
    draft_law: float64 [K, V+1], the law each row's draft at position j is drawn from, last column = -1;
    allowed: bool [K+1, V] grammar mask or None; draft_probs: float32 [K, V], every row's
    draft_probs_full ("sampled" only); relaxed: (relaxed_topk, relaxed_delta) with every row thinking;
    verification: how sampled drafts are judged, "token" (SPEC §3.2) or "block" (§3.6).
    """

    name: str
    about: str
    logits: np.ndarray
    draft_law: np.ndarray
    rows: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    allowed: np.ndarray | None = None
    draft_proposal: str = "argmax"
    draft_probs: np.ndarray | None = None
    relaxed: tuple[int, float] | None = None
    dtype: str = "float32"
    quick: bool = False
    verification: str = "token"
    tree = False  # a chain scenario, for the chain verifier

    @property
    def positions(self) -> int:
        """K."""
        return self.draft_law.shape[0]

    @property
    def vocab(self) -> int:
        """V."""
        return self.logits.shape[-1]

    @property
    def lossless(self) -> bool:
        """Relaxed rows are lossy by design; every other scenario must commit p~ exactly."""
        return self.relaxed is None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def setting(self) -> str:
        """The sampling parameters in a few words, e.g. 'T=0.8 · top-k 6 · top-p 0.8 · mask'."""
        parts = ["greedy" if self.greedy else f"T={self.temperature:g}"]
        parts += [f"top-k {self.top_k}"] if self.top_k > 0 else []
        parts += [f"top-p {self.top_p:g}"] if self.top_p < 1 else []
        parts += [f"min-p {self.min_p:g}"] if self.min_p > 0 else []
        parts += [f"relaxed top-{self.relaxed[0]} δ {self.relaxed[1]:g}"] if self.relaxed else []
        parts += ["mask"] if self.allowed is not None else []
        parts += ["block verification"] if self.verification == "block" else []
        parts += ["padding"] if self.draft_law[:, -1].any() else []
        parts += [self.dtype] if self.dtype != "float32" else []
        return " · ".join(parts)

    def masked_logits(self, position: int) -> np.ndarray:
        """float64 [V]: the logits of a position with disallowed tokens at -inf."""
        x = self.logits[position].astype(np.float64)
        return x if self.allowed is None else np.where(self.allowed[position], x, -np.inf)

    def target(self, position: int) -> np.ndarray:
        """p~ of a position, float64 [V]."""
        allowed = None if self.allowed is None else self.allowed[position]
        return truncated_distribution(
            self.logits[position], self.temperature, self.top_k, self.top_p, self.min_p, allowed
        )

    @cached_property
    def laws(self) -> Laws:
        """exact_laws(self), computed once (the LLM-shaped ones take a second)."""
        return exact_laws(self)

    def draw(self, rows: int, rng: np.random.Generator) -> np.ndarray:
        """int64 [N, K]: each row's draft at j drawn from the draft law of j; after the first PAD, all PAD."""
        V = self.vocab
        drafts = np.stack([rng.choice(V + 1, size=rows, p=law / law.sum()) for law in self.draft_law], axis=1)
        drafts = np.where(drafts == V, PAD, drafts).reshape(rows, self.positions)
        padded = np.cumsum(drafts < 0, axis=1) > 0
        return np.where(padded, PAD, drafts).astype(np.int64)

    def arguments(self, drafts: np.ndarray, seeds: np.ndarray, device: str) -> tuple[tuple, dict]:
        """(the eight positional arguments, the optional ones this scenario needs) of the batched call.
        drafts: int64 [N, K]; seeds: int64 [N]."""
        rows, K = drafts.shape

        def to(array, dtype):
            return torch.as_tensor(array, dtype=dtype, device=device)

        logits = torch.from_numpy(self.logits).to(getattr(torch, self.dtype))
        positional = (
            to(drafts, torch.int64),
            logits.to(device)[None].expand(rows, K + 1, self.vocab).contiguous(),
            to(np.full(rows, self.temperature), torch.float32),
            to(np.full(rows, self.top_k), torch.int64),
            self.top_k if self.top_k > 0 else -1,  # max_k: the largest top_k, -1 when unlimited
            to(np.full(rows, self.top_p), torch.float32),
            float(np.float32(self.top_p)),  # min_top_p: min(top_p), as the float32 tensor holds it
            to(seeds, torch.int64),
        )
        optional = min_p_and_mask(self.min_p, self.allowed, rows, device)
        if self.draft_proposal == "sampled":
            probs = torch.from_numpy(self.draft_probs).to(device)
            optional["draft_proposal"] = "sampled"
            optional["draft_probs_full"] = probs[None].expand(rows, *probs.shape).contiguous()
        if self.verification == "block":
            optional["verification"] = "block"
        if self.relaxed is not None:
            optional["in_thinking_phase"] = torch.ones(rows, dtype=torch.bool, device=device)
            optional["relaxed_topk"], optional["relaxed_delta"] = self.relaxed
        return positional, optional

    def observe(self, verifier: Verifier, rows: int, seed: int, device: str = "cpu") -> Observation:
        """Draw the drafts and seeds, make the one batched call, and collect what each row committed."""
        drafts, (first, recovered, bonus), seconds = batched_call(verifier, self, rows, seed, device)
        problems = tuple(contract_problems(drafts, first, recovered, bonus, self.vocab))
        K = self.positions
        committed = np.full((rows, K + 1), PAD, dtype=np.int64)
        if not problems:
            tokens = np.concatenate([recovered, bonus], axis=1)
            reached = np.arange(K + 1)[None, :] <= first[:, None]
            committed[reached] = tokens[reached]
        return Observation(first, committed, seconds, problems)


@dataclass(frozen=True)
class Laws:
    """What a scenario must commit, exactly. target, committed: float64 [K+1, V]; accept: [K];
    first_rejection: [K+1]. committed[j] is the law of the token committed at j given that j is reached
    (the first rejection is >= j); it equals target[j] for every lossless scenario."""

    target: np.ndarray
    committed: np.ndarray
    accept: np.ndarray
    first_rejection: np.ndarray


def _law_given_draft(scenario: Scenario, position: int):
    """The rule that judges a row at a position: d -> (P(accept), committed law [V]) (SPEC §3)."""
    if scenario.greedy:
        masked = scenario.masked_logits(position)
        return lambda draft: greedy_position_law(masked, draft)
    if scenario.relaxed is not None:
        masked = scenario.masked_logits(position)
        return lambda draft: relaxed_position_law(masked, draft, *scenario.relaxed)
    target = scenario.target(position)
    if scenario.draft_proposal == "sampled":
        q = scenario.draft_probs[position].astype(np.float64)
        return lambda draft: sampled_position_law(target, q, draft)
    return lambda draft: argmax_position_law(target, draft)


def exact_laws(scenario: Scenario) -> Laws:
    """The exact laws of a scenario: each position's rule averaged over its draft law; the bonus
    position K is committed from p~ (greedy: its argmax) only when every draft was accepted."""
    if scenario.verification == "block":
        return _block_laws(scenario)
    K = scenario.positions
    target = np.stack([scenario.target(j) for j in range(K + 1)])
    judged = [mixed_position_law(scenario.draft_law[j], _law_given_draft(scenario, j)) for j in range(K)]
    accept = np.array([a for a, _ in judged])
    committed = np.stack([law for _, law in judged] + [target[K]])
    return Laws(target, committed, accept, first_rejection_law(accept))


def _block_laws(scenario: Scenario) -> Laws:
    """The exact laws of a block-verified scenario (SPEC §3.6; drafts drawn from q, position by position,
    each row's drafts ending at its first padding). The token committed at a reached position follows p~
    there, as for every lossless rule whose target does not depend on the prefix; the first rejection's
    law is the longest kept prefix's, from audit.blocks' enumeration of every draft block and coin, mixed
    over the rows' draft lengths."""
    K, V = scenario.positions, scenario.vocab
    target = np.stack([scenario.target(j) for j in range(K + 1)])
    q = scenario.draft_probs.astype(np.float64)
    if not (q.sum(-1) > 0).all():
        raise ValueError(f"{scenario.name}: a block scenario draws every draft from q (a row of q is all zero)")
    q = q / q.sum(-1, keepdims=True)  # the law the drafts are drawn from (float32 rows sum to 1 within 1e-7)
    first = np.zeros(K + 1)
    reach = 1.0  # P(a row drafts at least j tokens)
    for drafted in range(K + 1):
        padded = scenario.draft_law[drafted, V] / scenario.draft_law[drafted].sum() if drafted < K else 1.0
        share, reach = reach * padded, reach * (1 - padded)
        if share == 0:
            continue
        laws = outcome_law(lambda prefix: target[len(prefix)], lambda prefix: q[len(prefix)], V, drafted)
        for outcome, probability in laws.items():
            first[len(outcome) - 1] += share * probability
    first /= first.sum()  # 1 up to float64 rounding, which chi-square's bookkeeping would not forgive
    reached = np.cumsum(first[::-1])[::-1]  # P(first rejection >= j)
    accept = np.divide(reached[1:], reached[:-1], out=np.zeros(K), where=reached[:-1] > 0)
    return Laws(target, target.copy(), accept, first)


def contract_problems(
    drafts: np.ndarray, first: np.ndarray, recovered: np.ndarray, bonus: np.ndarray, vocab: int
) -> list[str]:
    """SPEC §1 on one call's outputs (drafts [N, K]; first [N]; recovered [N, K]; bonus [N, 1]): shapes;
    0 <= first <= K; nothing accepted at or past a padding; accepted tokens equal the drafts; committed
    ids in [0, V). Each problem names a row."""
    rows, K = drafts.shape
    wrong = shape_problems(
        {
            "first_rejected_idx": (first, (rows,)),
            "recovered_tokens": (recovered, (rows, K)),
            "bonus_tokens": (bonus, (rows, 1)),
        }
    )
    if wrong:
        return wrong
    present = (drafts >= 0).sum(1) if K else np.zeros(rows, dtype=np.int64)
    accepted = np.arange(K)[None, :] < first[:, None]
    committed = np.concatenate([recovered, bonus], axis=1)
    reached = np.arange(K + 1)[None, :] <= first[:, None]
    return [
        *row_problems((first < 0) | (first > K), f"first_rejected_idx outside [0, {K}]"),
        *row_problems(first > present, "a draft accepted at or after padding"),
        *row_problems(
            (accepted & (recovered != drafts)).any(1), "an accepted position's recovered token differs from its draft"
        ),
        *row_problems(
            (reached & ((committed < 0) | (committed >= vocab))).any(1), f"a committed token outside [0, {vocab})"
        ),
    ]


def check_kept_sets_stable(scenario, where: str = "position") -> None:
    """Raise ValueError if a kept set changes when top_p or min_p move by BOUNDARY_MARGIN: such a scenario
    would judge float32 rounding, not the verifier. scenario: a Scenario (or a tree's, whose logits
    indices are named `where` = "index"), with positions + 1 targets."""
    for factor in (1 - BOUNDARY_MARGIN, 1 + BOUNDARY_MARGIN):
        moved = replace(scenario, top_p=min(1.0, scenario.top_p * factor), min_p=scenario.min_p * factor)
        for j in range(scenario.positions + 1):
            if not np.array_equal(scenario.target(j) > 0, moved.target(j) > 0):
                raise ValueError(f"scenario {scenario.name}: {where} {j} sits on a top-p/min-p boundary")


def check_well_posed(scenario: Scenario) -> None:
    """Raise ValueError if a kept set, or a relaxed verdict, changes when top_p, min_p or relaxed_delta
    move by BOUNDARY_MARGIN: such a scenario would judge float32 rounding, not the verifier."""
    check_kept_sets_stable(scenario)
    if scenario.relaxed is None or scenario.greedy:
        return
    topk, delta = scenario.relaxed
    for j in range(scenario.positions):
        masked = scenario.masked_logits(j)
        for draft in np.flatnonzero(scenario.draft_law[j, :-1]):
            shifts = (-BOUNDARY_MARGIN, 0.0, BOUNDARY_MARGIN)
            if len({relaxed_position_law(masked, int(draft), topk, delta + shift)[0] for shift in shifts}) > 1:
                raise ValueError(
                    f"scenario {scenario.name}: draft {draft} at position {j} sits on the relaxed delta boundary"
                )


# ---- building the matrix ----------------------------------------------------------------------------


def named_rng(name: str) -> np.random.Generator:
    """The generator a scenario (chain or tree) is built from, fixed by its name."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def small_logits(rng: np.random.Generator, positions: int, vocab: int) -> np.ndarray:
    """float32 [K+1, V]: normal scores, sd 1.5."""
    return rng.normal(0, 1.5, size=(positions + 1, vocab)).astype(np.float32)


def _llm_logits(rng: np.random.Generator, positions: int, vocab: int) -> np.ndarray:
    """float32 [K+1, V] shaped like a language model's: a Zipf tail (score -1.1 log(1 + rank)) under
    a few heavy head tokens, token ids shuffled per position."""
    rank = np.arange(vocab)
    rows = []
    for _ in range(positions + 1):
        head = np.zeros(vocab)
        head[:4] = np.sort(rng.uniform(0.5, 2.0, 4))[::-1]
        scores = -1.1 * np.log1p(rank) + head + rng.normal(0, 0.3, vocab)
        rows.append(scores[rng.permutation(vocab)])
    return np.array(rows, dtype=np.float32)


def _round_to(logits: np.ndarray, dtype: str) -> np.ndarray:
    return torch.from_numpy(logits).to(getattr(torch, dtype)).float().numpy()


def grammar_mask(rng: np.random.Generator, logits: np.ndarray, disallowed: float) -> np.ndarray:
    """bool [K+1, V]: each token disallowed with probability `disallowed`; the most likely token is
    disallowed at position 0 (so the mask matters even to greedy rows) and the second always allowed."""
    allowed = rng.random(logits.shape) >= disallowed
    order = np.argsort(-logits, axis=-1)
    allowed[np.arange(len(logits)), order[:, 1]] = True
    allowed[0, order[0, 0]] = False
    return allowed


def _draft_model(rng: np.random.Generator, logits: np.ndarray, noise: float) -> np.ndarray:
    """float64 [K, V]: a smaller model's full distribution, softmax of the target's scores plus noise."""
    scores = logits[:-1].astype(np.float64) + rng.normal(0, noise, size=logits[:-1].shape)
    q = np.exp(scores - scores.max(-1, keepdims=True))
    return q / q.sum(-1, keepdims=True)


def draft_distribution(rng: np.random.Generator, kind: str, logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """float64 [K, V], a draft distribution q: 'model' (a noisy smaller model), 'close' (0.7 p~ + 0.3
    random), 'disagree' (a spiky random law), 'outside' (80% on the lowest-scored token, which p~ drops
    when it truncates, 20% on p~'s top), 'avoid-top' (random, 0 at p~'s top) or 'zero' (no distribution)."""
    K, V = targets.shape[0] - 1, targets.shape[1]
    if kind == "model":
        return _draft_model(rng, logits, noise=1.0 if V <= 64 else 0.5)
    q = np.zeros((K, V))
    for j in range(K):
        top = int(np.argmax(targets[j]))
        if kind == "close":
            q[j] = 0.7 * targets[j] + 0.3 * rng.dirichlet(np.ones(V))
        elif kind == "disagree":
            q[j] = rng.dirichlet(np.full(V, 0.3))
        elif kind == "outside":
            q[j, int(np.argmin(logits[j]))] = 0.8
            q[j, top] += 0.2
        elif kind == "avoid-top":
            q[j] = rng.dirichlet(np.ones(V))
            q[j, top] = 0.0
            q[j] /= q[j].sum()
        elif kind != "zero":
            raise ValueError(f"unknown draft distribution {kind!r}")
    return q


def _draft_law(kind: str, targets: np.ndarray, logits: np.ndarray, q: np.ndarray | None, padding: tuple) -> np.ndarray:
    """float64 [K, V+1]: how each row's draft at j is drawn: 'agree' (p~'s top), 'disagree' (the least
    likely kept token), 'outside' (half p~'s top, half the lowest-scored token), 'q' (from q; uniform where
    q is zero); then the share padding[j] of the rows pads position j (the last column, -1)."""
    K, V = targets.shape[0] - 1, targets.shape[1]
    law = np.zeros((K, V + 1))
    for j in range(K):
        p = targets[j]
        if kind == "agree":
            law[j, int(np.argmax(p))] = 1.0
        elif kind == "disagree":
            law[j, int(np.argmin(np.where(p > 0, p, np.inf)))] = 1.0
        elif kind == "outside":
            law[j, int(np.argmax(p))] += 0.5
            law[j, int(np.argmin(logits[j]))] += 0.5
        elif kind == "q":
            law[j, :V] = q[j] / q[j].sum() if q[j].sum() else 1.0 / V
        else:
            raise ValueError(f"unknown draft kind {kind!r}")
    share = np.array([padding[j] if j < len(padding) else 0.0 for j in range(K)])
    law *= (1 - share)[:, None]
    law[:, V] = share
    return law


def scenario(
    name: str,
    about: str,
    *,
    drafts: str = "q",
    q: str | None = None,
    proposal: str = "argmax",
    positions: int = 3,
    vocab: int = SMALL_VOCAB,
    rows: int = SMALL_ROWS,
    shape: str = "small",
    mask: float = 0.0,
    padding: tuple = (),
    dtype: str = "float32",
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
    relaxed: tuple[int, float] | None = None,
    quick: bool = False,
    verification: str = "token",
) -> Scenario:
    """Build one scenario from a few words. drafts: a kind of _draft_law ('q' draws them from the draft
    distribution of kind `q`, which "sampled" scenarios also pass as draft_probs_full); mask: the share of
    disallowed tokens; padding[j]: the share of rows padded at position j; shape: 'small' or 'llm'."""
    rng = named_rng(name)
    logits = _round_to((_llm_logits if shape == "llm" else small_logits)(rng, positions, vocab), dtype)
    allowed = grammar_mask(rng, logits, mask) if mask else None
    base = Scenario(
        name,
        about,
        logits,
        np.zeros((positions, vocab + 1)),
        rows,
        temperature,
        top_k,
        top_p,
        min_p,
        allowed,
        proposal,
        relaxed=relaxed,
        dtype=dtype,
        quick=quick,
        verification=verification,
    )
    targets = np.stack([base.target(j) for j in range(positions + 1)])
    q_law = draft_distribution(rng, q, logits, targets) if q else None
    return replace(
        base,
        draft_law=_draft_law(drafts, targets, logits, q_law, padding),
        draft_probs=q_law.astype(np.float32) if proposal == "sampled" else None,
    )


def scenario_matrix() -> list[Scenario]:
    """Every scenario of the default audit; those marked quick make up --quick."""
    llm = dict(shape="llm", vocab=LLM_VOCAB, rows=LLM_ROWS)
    return [
        # "argmax" drafts (SPEC §3.1): the committed token is a sample of p~ whatever the draft
        scenario(
            "argmax/plain/agree",
            "no truncation; each draft is its position's most likely token",
            drafts="agree",
            quick=True,
        ),
        scenario(
            "argmax/top-k/disagree",
            "each draft is the least likely token top-k keeps",
            drafts="disagree",
            positions=2,
            temperature=0.7,
            top_k=5,
        ),
        scenario(
            "argmax/top-p/outside",
            "half the drafts sit outside the nucleus",
            drafts="outside",
            temperature=1.3,
            top_p=0.8,
            quick=True,
        ),
        scenario("argmax/min-p", "drafts sampled from a draft model", q="model", min_p=0.15),
        scenario(
            "argmax/top-k+top-p",
            "top-p measured on the top-k-renormalised mass (SPEC §2 step 4)",
            q="model",
            top_k=4,
            top_p=0.55,
            quick=True,
        ),
        scenario(
            "argmax/mix+mask",
            "every truncation and a grammar mask; some drafts are disallowed",
            q="model",
            temperature=0.8,
            top_k=6,
            top_p=0.8,
            min_p=0.05,
            mask=0.4,
            quick=True,
        ),
        scenario(
            "argmax/greedy+mask",
            "greedy rows commit the masked argmax",
            q="model",
            temperature=0.0,
            mask=0.4,
            quick=True,
        ),
        scenario(
            "argmax/padding",
            "ragged drafts: a quarter end after 1 token, half the rest after 2",
            drafts="agree",
            temperature=0.9,
            top_p=0.9,
            padding=(0.0, 0.25, 0.5),
            quick=True,
        ),
        scenario("argmax/bfloat16", "bfloat16 target logits", q="model", temperature=0.8, top_k=8, dtype="bfloat16"),
        scenario(
            "argmax/llm",
            "LLM-shaped: a few heavy tokens and a long tail; drafts from a draft model",
            q="model",
            top_p=0.93,
            quick=True,
            **llm,
        ),
        # "sampled" drafts (SPEC §3.2): accept with min(1, p~/q), else sample the residual
        scenario("sampled/close", "q close to p~", q="close", proposal="sampled", top_p=0.9, quick=True),
        scenario(
            "sampled/disagree",
            "q far from p~",
            q="disagree",
            proposal="sampled",
            temperature=1.2,
            top_k=6,
            top_p=0.8,
            quick=True,
        ),
        scenario(
            "sampled/outside", "q puts 80% of its mass outside the nucleus", q="outside", proposal="sampled", top_p=0.7
        ),
        scenario(
            "sampled/no-distribution",
            "q all zero: judged without a distribution; drafts uniform",
            q="zero",
            proposal="sampled",
            top_k=8,
            quick=True,
        ),
        scenario(
            "sampled/fixed-draft",
            "each draft is p~'s top, a token q cannot sample (q(d) = 0)",
            drafts="agree",
            q="avoid-top",
            proposal="sampled",
            temperature=0.9,
        ),
        scenario(
            "sampled/mix+mask+padding",
            "truncations, a grammar mask and ragged drafts",
            q="model",
            proposal="sampled",
            temperature=0.9,
            top_k=7,
            min_p=0.05,
            mask=0.3,
            padding=(0.0, 0.2, 0.4),
        ),
        scenario(
            "sampled/greedy",
            "greedy rows ignore q and commit the argmax",
            q="close",
            proposal="sampled",
            temperature=0.0,
        ),
        scenario(
            "sampled/llm",
            "LLM-shaped target, q from a draft model over the whole vocabulary",
            q="model",
            proposal="sampled",
            positions=2,
            top_k=50,
            min_p=0.01,
            quick=True,
            **llm,
        ),
        # block verification (SPEC §3.6): sampled drafts judged jointly; the first rejection follows the
        # enumerated law of audit.blocks, every committed token p~
        scenario(
            "block/model",
            "four drafts from a draft model: the block keeps 0.27 more a row than token-wise would",
            q="model",
            proposal="sampled",
            positions=4,
            verification="block",
            quick=True,
        ),
        scenario(
            "block/mix+mask+padding",
            "truncations, a grammar mask and ragged drafts, judged as blocks",
            q="model",
            proposal="sampled",
            temperature=0.9,
            top_k=7,
            min_p=0.05,
            mask=0.3,
            padding=(0.0, 0.2, 0.4),
            verification="block",
        ),
        # relaxed thinking rows (SPEC §3.4): lossy by design, the divergence is measured
        scenario(
            "relaxed/top-3",
            "accept any draft among the 3 most likely within 0.3 of the top",
            q="model",
            relaxed=(3, 0.3),
            quick=True,
        ),
        scenario(
            "relaxed/mask",
            "relaxed acceptance under a grammar mask",
            q="model",
            temperature=0.7,
            mask=0.3,
            relaxed=(2, 0.5),
        ),
        scenario(
            "relaxed/llm",
            "relaxed acceptance on an LLM-shaped target",
            q="model",
            top_p=0.92,
            relaxed=(5, 0.2),
            **dict(llm, rows=4_000),
        ),
    ]
