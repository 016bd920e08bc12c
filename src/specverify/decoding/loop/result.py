"""What a generation produced and what it measured."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import specverify


@dataclass
class StepEvent:
    """The tokens row `row` committed in one target step: the first `accepted` are accepted draft tokens;
    a last one that is not is `recovered` (it replaced a rejected draft) or else a bonus / plain sample."""

    row: int
    tokens: list[int]
    accepted: int
    recovered: bool


@dataclass
class GenerationResult:
    """tokens[b]: the tokens generated for request b (stop token included); times in seconds.

    drafted[j] / accepted[j]: over all rows and steps, how many draft tokens were proposed at draft
    position j, and how many of those were accepted (an accepted j implies all before it were).
    row_steps: target steps summed over the rows still generating at each.
    warmup_seconds: the process's one-time warm-up (`warmup.warm_up`) done by this call before decoding
    was timed (0 when an earlier call did it).
    grammar_complete[b]: whether request b's output is a complete sentence of its grammar (None for a
    row without one); None when no row had a grammar.
    """

    tokens: list[list[int]]
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    warmup_seconds: float = 0.0
    steps: int = 0
    row_steps: int = 0
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    grammar_complete: list[bool | None] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of decoding (prefill excluded)."""
        return self.num_tokens / self.decode_seconds if self.decode_seconds > 0 else float("nan")

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a row committed per target step (1 for plain decoding)."""
        return self.num_tokens / self.row_steps if self.row_steps else float("nan")

    @property
    def acceptance(self) -> list[float]:
        """Per draft position j: accepted[j] / drafted[j]."""
        return [a / d if d else float("nan") for a, d in zip(self.accepted, self.drafted)]

    def record(self, drafted_lengths: list[int], first_rejected: list[int]) -> None:
        """Count one step of the rows still generating: each drafted drafted_lengths[i] tokens and had
        the first first_rejected[i] accepted."""
        if any(drafted_lengths):  # (a plain step has no draft position to count)
            drafted, accepted = specverify.acceptance_counts(
                torch.tensor(first_rejected), torch.tensor(drafted_lengths)
            )
            grow = len(drafted) - len(self.drafted)
            if grow > 0:
                self.drafted += [0] * grow
                self.accepted += [0] * grow
            for j, (d, a) in enumerate(zip(drafted.tolist(), accepted.tolist())):
                self.drafted[j] += d
                self.accepted[j] += a
        self.steps += 1
        self.row_steps += len(drafted_lengths)

    def summary(self) -> dict:
        """The measured numbers as plain JSON-ready values."""
        return {
            "tokens": self.num_tokens,
            "prefill_seconds": round(self.prefill_seconds, 4),
            "decode_seconds": round(self.decode_seconds, 4),
            "warmup_seconds": round(self.warmup_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "steps": self.steps,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": [round(a, 4) for a in self.acceptance],
            "grammar_complete": self.grammar_complete,
        }


def speedup(speculative: GenerationResult, plain: GenerationResult) -> float:
    """Decoding tokens/s with speculation over tokens/s without."""
    return speculative.tokens_per_second / plain.tokens_per_second
