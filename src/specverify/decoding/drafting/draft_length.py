"""How many tokens each row drafts per step: a fixed K, or K chosen every step (`AdaptiveDraftLength`).

The loop asks a policy for each row's draft length before drafting, and tells it afterwards what
happened. The output never depends on the policy in "argmax" mode (row b's n-th token is keyed by
request_seed(base_b, n) whatever was drafted, SPEC §4); only the speed does.

Adaptive choice. A step with T tokens per row costs the target one forward pass over B*T tokens, and on
a CPU that cost is far from linear in T (SmolLM2-135M, 1 thread: 52 ms at T = 1, 59 at 3, 84 at 4,
151 at 13, 116 at 17: matmul blocking). So before the first timed step the policy times the target's
forward pass on the real session at every width T = 1..max_k+1 (once per model and batch size and
process, and across processes in the model's cache folder: `cost_cache`; `calibrate`), and afterwards
scales that curve by a running load factor (measured step time / calibrated time of its width): the
machine's load slows every width alike, while a single noisy step time must not reshape the curve (a
width-2 step measured below width 1's made the policy draft failing tokens on a loaded machine).
Each row keeps its running acceptance alpha_b: discounted counts of accepted and rejected draft
positions (a draft of k tokens with f accepted counts f successes and, when f < k, one failure), starting
from a prior (alpha = FIRST_PRIOR) that fades as observations come in. With acceptance alpha, a draft of k tokens commits
E(k) = 1 + alpha + ... + alpha**k tokens on average. The rows of a batch share the step's width (the
target computes every row at the longest draft), so the policy picks the k in 0..max_k that maximises
sum_b E_b(min(k, budget_b)) / (cost(k + 1) + overhead), the batch's expected tokens per second, and every
row drafts up to that k. k = 0 is a plain decoding step: where drafts are rarely accepted, or the next
width costs more than it brings, speculation falls back to plain decoding instead of losing to it.
Evidence. A drafter may say, before it drafts, how much support each row's next draft has
(`Drafter.evidence`; the n-gram drafter: the length of the context's longest recurring suffix, 0 when
none recurs and it has nothing to propose). Its drafts are then far from alike: over the built-in
examples' plain outputs (greedy and T = 0.7, 128 tokens each) a draft's first token matched the
target's 16% of the time after a 1-token match, 39% after 2, 34% after 3 and 75-100% after 4 or more,
while a 2-wide step costs 1.38x a 1-wide one on llama.cpp (Q4_1, one thread): a 1-token match costs
more than it brings there, a long one brings far more. So the counts are kept per row and evidence
class (`EVIDENCE_CLASSES`), each class with its own prior; a row with evidence 0 drafts nothing.
A row at k = 0 still gets a one-token probe draft that is not verified but compared with the token
the step commits (equal: a success, else a failure), so its acceptance keeps being measured and
speculation resumes when the text turns repetitive.

The policy's arithmetic is numpy on the host: a few arrays of B x (max_k + 1) numbers per step, where
each torch op costs several times a numpy one (after a target step has evicted the caches, its ~70 torch
ops took ~0.55 ms of a 21 ms llama.cpp step).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from ..engines.base import LanguageModel, Session
from .cost_cache import cost_file, read_costs, torch_engine_key, write_costs

#: Default largest draft length of the adaptive policy. On a CPU a wide pass costs far less per token
#: than a narrow one (SmolLM2-135M, 1 thread: 53 ms at width 1, 117 at 17, 140 at 33), so where drafts
#: keep passing a long one pays: the built-in copy example, greedy, took 6 target steps with 16 and 5
#: with 32 (5.3x and 6.6x plain decoding, decode time).
MAX_K = 32
#: Per observation of its row and evidence class, how much of its weight an acceptance count keeps
#: (older observations count less).
DECAY = 0.8
#: Draft positions with acceptance rates of their own; later positions share the last one's.
POSITIONS = 4
#: Weight (in observations) of a position's prior: FIRST_PRIOR for the first, the previous one's rate after.
#: Position 0's prior fades like an observation (x decay per step the row is observed), so a row whose
#: drafts always fail reaches rate 0 and plain steps: a prior that kept its weight left a floor of
#: 0.5 / (1 + 1 / (1 - decay)) = 0.083 with a prior of 0.5, and a 2-wide pass costs only ~3% more than a
#: 1-wide one on transformers, so the policy kept drafting one failing token a step (chat at T = 0.7:
#: 0.94-0.95x plain).
PRIOR = 1.0
#: The prior acceptance rate of draft position 0, before a row (in an evidence class) has been observed:
#: below the 38% a drafted token must reach on llama.cpp (Q4_1, where width 2 costs 1.38x width 1), so
#: there a class's first chance is a free probe, not a paid draft; above the 3-18% of transformers on a
#: CPU, where it drafts at once. (0.5 made each class pay one or two failing drafts on llama.cpp: json,
#: 50 tokens, 0.92-0.95x plain; with 0.3, 0.94-0.95x, and copy went from 1.19-1.25x to 1.49-1.54x.)
FIRST_PRIOR = 0.3
#: How much faster than a plain step (expected tokens per second) a draft must promise before a step
#: drafts at all. The acceptance a choice rests on is estimated from a handful of recent drafts, and the
#: policy drafts exactly when that estimate is high, so near the break-even it drafts on estimates that
#: were lucky: on llama.cpp (a drafted token must pass 38% of the time) auto ran 3-8% below its own K = 0
#: on chat, code and json without a margin.
MARGIN = 0.1
#: Evidence classes: class 0 for a drafter that gives no evidence, class min(e, EVIDENCE_CLASSES - 1)
#: for evidence e >= 1 (n-gram: matches of 1, 2, 3 and 4 or more tokens).
EVIDENCE_CLASSES = 5
#: Sweeps over the widths when calibrating. Noise only ever slows a pass, so a width's cost is its fastest
#: time, trusted once another time agrees with it: one sweep on a busy machine read widths at up to 2.5x
#: their cost (llama.cpp, Q4_1, width 7: 205 ms against 81; F16, width 12: 209 against 108), which steered
#: the choice (virtual-time replay of the built-in copy example on Q4_1: 1.26x plain decoding with one
#: noisy sweep's costs, 1.51x with the fastest of four).
CALIBRATION_ROUNDS = 2
#: The most times one width is timed, and how close (ratio) its two fastest times must be to stop sooner.
CALIBRATION_SAMPLES = 5
CALIBRATION_AGREEMENT = 1.1
#: Weight of a new step's load (its time over its width's calibrated time) in the running load factor.
COST_RATE = 0.3

_costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class DraftLength(Protocol):
    """Chooses each row's draft length every step.

    probes: whether rows given 0 still want a one-token draft to be compared (not verified), see `observe`.
    """

    probes: bool

    def begin(self, target: LanguageModel, session: Session, last_tokens: torch.Tensor) -> float:
        """Called once after the prefill, before decoding is timed; returns the seconds spent.
        last_tokens: int64 [B, 1], each row's next input token."""
        ...

    def choose(self, budgets: Sequence[int], evidence: Sequence[int] | None) -> list[int]:
        """budgets[b]: the most draft tokens row b may use (0 for a finished row); evidence: the drafter's
        `evidence` for each row's next draft, or None when it gives none -> each row's k <= budget."""
        ...

    def observe(
        self,
        drafted: Sequence[int],
        accepted: Sequence[int],
        probe_hits: Sequence[bool | None],
        width: int,
        forward_seconds: float,
        step_seconds: float,
        evidence: Sequence[int] | None,
    ) -> None:
        """What the step did: per row the draft tokens verified and how many were accepted, and for a row
        that was given 0, whether its probe token equals the token committed (None: no probe, or the
        row did not run); the step's width (tokens per row in the target's pass), the seconds of the
        target's pass plus the verifier, and of the whole step; the evidence `choose` was given."""
        ...


class FixedDraftLength:
    """k draft tokens per row every step (fewer where a row's budget ends)."""

    probes = False

    def __init__(self, k: int):
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an int >= 0 or 'auto' (got {k!r})")
        self.k = k

    def begin(self, target: LanguageModel, session: Session, last_tokens: torch.Tensor) -> float:
        return 0.0

    def choose(self, budgets: Sequence[int], evidence: Sequence[int] | None) -> list[int]:
        return [min(self.k, b) for b in budgets]

    def observe(self, drafted, accepted, probe_hits, width, forward_seconds, step_seconds, evidence) -> None:
        pass


def expected_tokens(acceptance: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Mean tokens a step commits with a draft of k tokens, position j accepted with probability
    acceptance[..., j] given that the ones before were: 1 + a0 + a0*a1 + ... + a0*...*a(k-1).
    acceptance: float64 [B, J] (positions >= J use acceptance[..., J-1]); k: int [B, C] -> float64 [B, C]."""
    positions = int(k.max()) if k.size else 0
    index = np.minimum(np.arange(positions), acceptance.shape[-1] - 1)
    reach = np.cumprod(acceptance[..., index], -1)  # [B, positions]: P(positions 0..j all accepted)
    sums = np.concatenate([np.zeros_like(reach[..., :1]), reach.cumsum(-1)], -1)  # [B, positions + 1]
    return 1 + np.take_along_axis(sums, k, -1)


@torch.inference_mode()
def calibrate(session: Session, last_tokens: torch.Tensor, max_width: int) -> list[float]:
    """Seconds of the target's forward pass at each width 1..max_width on this session, which is left as
    it was. Each width is timed in CALIBRATION_ROUNDS sweeps, then again (up to CALIBRATION_SAMPLES times)
    until its two fastest times agree within CALIBRATION_AGREEMENT; its cost is the fastest. last_tokens:
    int64 [B, 1]; returns costs[w - 1] for width w."""
    before = session.lengths.to("cpu", copy=True)

    def timed(width: int) -> float:
        start = time.perf_counter()
        float(session.extend(last_tokens.expand(-1, width))[0, -1, 0])  # reading a value waits for the device
        seconds = time.perf_counter() - start
        session.truncate(before)
        return seconds

    timed(max_width)  # the first pass at a new shape allocates; not a measurement
    sweeps = [[timed(w) for w in range(1, max_width + 1)] for _ in range(CALIBRATION_ROUNDS)]
    costs = []
    for width, times in enumerate(map(sorted, zip(*sweeps)), 1):
        while len(times) < CALIBRATION_SAMPLES and times[1] > CALIBRATION_AGREEMENT * times[0]:
            times = sorted([*times, timed(width)])
        costs.append(times[0])
    return costs


def stored_calibration(
    target: LanguageModel, session: Session, last_tokens: torch.Tensor, max_width: int
) -> list[float]:
    """`calibrate`'s costs, read from the target's cache folder when an earlier process measured them
    (`cost_cache`), else measured and stored there. A target without a `cache_folder` is measured. The
    file is keyed by the target's `engine_key` (a torch model's when it has none: `torch_engine_key`)."""
    folder = getattr(target, "cache_folder", None)
    if folder is None:
        return calibrate(session, last_tokens, max_width)
    device = session.lengths.device
    engine = getattr(target, "engine_key", None) or torch_engine_key(device)
    path = cost_file(Path(folder), device, last_tokens.shape[0], max_width, engine)
    costs = read_costs(path, max_width)
    if costs is None:
        costs = calibrate(session, last_tokens, max_width)
        write_costs(path, costs)
    return costs


class AdaptiveDraftLength:
    """K chosen every step from each row's running acceptance and the measured cost of each width (see
    the module docstring). max_k: the longest draft; decay: weight an acceptance count keeps per step."""

    probes = True

    def __init__(self, max_k: int = MAX_K, decay: float = DECAY, margin: float = MARGIN):
        if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 1:
            raise ValueError(f"max_k must be an int >= 1 (got {max_k!r})")
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1] (got {decay})")
        if not 0 <= margin:
            raise ValueError(f"margin must be >= 0 (got {margin})")
        self.max_k, self.decay, self.margin = max_k, decay, margin
        self.costs: list[float] = []
        self.overhead = 0.0
        self.load = 1.0  # the running ratio of measured to calibrated forward time
        self.reset(0)

    def begin(self, target: LanguageModel, session: Session, last_tokens: torch.Tensor) -> float:
        """Calibrate the widths' costs (once per target, batch size and max_k in this process)."""
        start = time.perf_counter()
        batch = last_tokens.shape[0]
        per_model = _costs.setdefault(target, {})
        key = (batch, self.max_k)
        if key not in per_model:
            per_model[key] = stored_calibration(target, session, last_tokens, self.max_k + 1)
        self.costs = per_model[key]  # the calibrated curve, read only
        self.reset(batch)
        return time.perf_counter() - start

    def reset(self, batch: int) -> None:
        """Forget every acceptance count: B rows, each class at its prior."""
        self.successes = np.zeros((batch, EVIDENCE_CLASSES, POSITIONS))  # float64 [B, classes, POSITIONS]
        self.failures = np.zeros((batch, EVIDENCE_CLASSES, POSITIONS))
        self.first_weight = np.full((batch, EVIDENCE_CLASSES), PRIOR)  # position 0's prior weight

    def acceptance(self, classes: np.ndarray) -> np.ndarray:
        """float64 [B, POSITIONS]: each row's running acceptance rate in its evidence class (classes:
        int [B]) at each draft position, given that the positions before it were accepted (the last one
        stands for every later position)."""
        rows = np.arange(len(classes))
        successes, failures = self.successes[rows, classes], self.failures[rows, classes]
        rates = np.empty(successes.shape)
        prior, weight = FIRST_PRIOR, self.first_weight[rows, classes]
        for j in range(POSITIONS):  # a position seen rarely leans on the one before it
            s, f = successes[:, j], failures[:, j]
            prior = rates[:, j] = (s + weight * prior) / (s + f + weight)
            weight = PRIOR
        return rates

    def choose(self, budgets: Sequence[int], evidence: Sequence[int] | None) -> list[int]:
        limits = [min(b, self.max_k) for b in budgets]
        if evidence is not None:
            limits = [n if e > 0 else 0 for n, e in zip(limits, evidence)]  # evidence 0: nothing to draft
        if max(limits, default=0) == 0:
            return limits
        budget = np.array(limits, dtype=np.int64)
        k = np.minimum(np.arange(self.max_k + 1), budget[:, None])  # [B, max_k + 1]
        tokens = expected_tokens(self.acceptance(evidence_classes(evidence, len(budget))), k)[budget > 0].sum(0)
        seconds = np.asarray(self.costs) * self.load + self.overhead
        rates = tokens / seconds
        best = int(rates.argmax())
        if rates[best] < (1 + self.margin) * rates[0]:
            best = 0  # not enough above a plain step to pay for being wrong about the acceptance
        return np.minimum(budget, best).tolist()

    def observe(self, drafted, accepted, probe_hits, width, forward_seconds, step_seconds, evidence) -> None:
        # a probe is a one-token draft, accepted or not; only the rows that drafted (or probed) learn, in
        # the class of their evidence (the per-row bookkeeping in Python: a few rows cost less than the
        # numpy calls it would take)
        learned = [
            (b, 1, int(hit)) if hit is not None else (b, n, min(a, n))
            for b, (n, a, hit) in enumerate(zip(drafted, accepted, probe_hits))
            if hit is not None or n > 0
        ]
        if learned:
            rows, drafted_, accepted_ = (np.array(column, dtype=np.int64) for column in zip(*learned))
            self._count(rows, evidence_classes(evidence, len(drafted))[rows], drafted_, accepted_)
        if 1 <= width <= len(self.costs):
            self.load += COST_RATE * (forward_seconds / self.costs[width - 1] - self.load)
        self.overhead += COST_RATE * (max(step_seconds - forward_seconds, 0.0) - self.overhead)

    def _count(self, rows: np.ndarray, classes: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """Decay and add one draft's outcome per (row, class): position j passed when j < accepted, failed
        when j == accepted < drafted; from POSITIONS - 1 on positions share the last bucket. All int64 [R]."""
        at = (rows, classes)
        passed = np.minimum(accepted, POSITIONS - 1)
        successes = self.decay * self.successes[at]
        successes[:, : POSITIONS - 1] += np.arange(POSITIONS - 1) < passed[:, None]
        successes[:, POSITIONS - 1] += np.maximum(accepted - (POSITIONS - 1), 0)
        failures = self.decay * self.failures[at]
        failed = accepted < drafted
        failures[failed, passed[failed]] += 1
        self.successes[at], self.failures[at] = successes, failures
        self.first_weight[at] *= self.decay


def evidence_classes(evidence: Sequence[int] | None, batch: int) -> np.ndarray:
    """int64 [B]: each row's evidence class (0 for all rows without evidence; see EVIDENCE_CLASSES)."""
    if evidence is None:
        return np.zeros(batch, dtype=np.int64)
    return np.clip(np.asarray(evidence, dtype=np.int64), 1, EVIDENCE_CLASSES - 1)


def draft_length_policy(k: int | str | DraftLength) -> DraftLength:
    """k: an int >= 0 (fixed), 'auto' (`AdaptiveDraftLength()`), or a DraftLength -> the policy."""
    if isinstance(k, str):
        if k != "auto":
            raise ValueError(f"k must be an int >= 0 or 'auto' (got {k!r})")
        return AdaptiveDraftLength()
    if isinstance(k, int):
        return FixedDraftLength(k)
    if all(hasattr(k, name) for name in ("begin", "choose", "observe", "probes")):
        return k
    raise ValueError(f"k must be an int >= 0, 'auto' or a DraftLength policy (got {k!r:.80})")
