"""Drafter invariance (SPEC §4): a toy model decoded speculatively commits exactly the tokens that plain
sampling gives, whatever the drafter and K.

The toy: a bigram model over V = 16 tokens (the next token's scores depend on the last token only), a
grammar (after token t, a token u with (t + u) % 4 == 0 is disallowed) and three requests, each with its
own sampling parameters (top-p, greedy, top-k with top-p) and base seed. Plain decoding draws request b's n-th token
with `specverify.sample(..., seed=specverify.request_seed(base_b, n))`; speculative decoding gives the verifier
K drafts per step ("argmax" mode; request 1 gets K - 1: ragged drafts) and the per-request seed
`request_seed(base_b, tokens generated)`.
A verifier keyed as SPEC §4 says gives identical sequences; this is stronger than losslessness, which
only asks for identical distributions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import specverify as sv

from .verifier import Verifier, as_verifier

VOCAB = 16
PROMPT = (1, 2, 3)
TABLE = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(9)) * 2  # scores after each token
TEMPERATURE = torch.tensor([0.9, 0.0, 1.2])
TOP_K = torch.tensor([-1, -1, 5])
TOP_P = torch.tensor([0.9, 1.0, 0.7])
REQUESTS = len(TEMPERATURE)

#: drafter(request, tokens generated so far, k, plain continuation) -> at most k draft tokens
Drafter = Callable[[int, list[int], int, list[int]], list[int]]


def allowed_after(tokens: torch.Tensor) -> torch.Tensor:
    """The toy grammar. tokens: int64 [...] -> bool [..., V]: u may follow t unless (t + u) % 4 == 0."""
    return (tokens[..., None] + torch.arange(VOCAB)) % 4 != 0


def base_seeds(base_seed: int) -> torch.Tensor:
    """int64 [R]: each request's base seed (consecutive, as a user's best-of-n seeds are)."""
    return base_seed + torch.arange(REQUESTS, dtype=torch.int64)


def decode_plainly(length: int, base_seed: int) -> list[list[int]]:
    """Each request's first `length` tokens by plain sampling: token n drawn with seed request_seed(base_b, n)."""
    last = torch.tensor([PROMPT[-1]] * REQUESTS)
    generated = []
    for n in range(length):
        last = sv.sample(
            TABLE[last],
            TEMPERATURE,
            TOP_K,
            TOP_P,
            sv.request_seed(base_seeds(base_seed), n),
            token_bitmask=sv.pack_bitmask(allowed_after(last)),
        )
        generated.append(last.tolist())
    return [list(tokens) for tokens in zip(*generated)] if generated else [[] for _ in range(REQUESTS)]


def _random_drafter(request: int, generated: list[int], k: int, plain: list[int]) -> list[int]:
    g = torch.Generator().manual_seed(len(generated) * 31 + request)
    return torch.randint(0, VOCAB, (k,), generator=g).tolist()


def _perfect_drafter(request: int, generated: list[int], k: int, plain: list[int]) -> list[int]:
    """The plain continuation itself: every draft is accepted."""
    return plain[len(generated) : len(generated) + k]


def _repeat_drafter(request: int, generated: list[int], k: int, plain: list[int]) -> list[int]:
    return [([*PROMPT, *generated])[-1]] * k


DRAFTERS: dict[str, Drafter] = {"random": _random_drafter, "perfect": _perfect_drafter, "repeat": _repeat_drafter}


@dataclass(frozen=True)
class Decoding:
    """A speculative run: each request's first `length` tokens; drafts proposed and accepted."""

    tokens: list[list[int]]
    proposed: int
    accepted: int


def _step_inputs(generated: list[list[int]], drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's scores and grammar masks after the context and after each draft.
    drafts: int64 [R, K] (-1 = padding) -> (logits float32 [R, K+1, V], bitmasks int32 [R, K+1, ceil(V/32)])."""
    last = torch.tensor([([*PROMPT, *g])[-1] for g in generated])
    previous = torch.cat([last[:, None], drafts.clamp(min=0)], dim=1)  # the token before each position
    return TABLE[previous], sv.pack_bitmask(allowed_after(previous))


def decode_speculatively(
    verifier: Verifier | Callable,
    drafter: str,
    k: int,
    length: int,
    base_seed: int,
    plain: list[list[int]] | None = None,
) -> Decoding:
    """Each request's first `length` tokens by speculative decoding with one of DRAFTERS and K = k.
    plain: decode_plainly(n >= length + k, base_seed), which the perfect drafter proposes (made if None)."""
    verify = verifier if isinstance(verifier, Verifier) else as_verifier(verifier)
    plain = plain if plain is not None else decode_plainly(length + k, base_seed)
    generated: list[list[int]] = [[] for _ in range(REQUESTS)]
    proposed = accepted = 0
    while min(len(g) for g in generated) < length:
        drafts = torch.full((REQUESTS, k), -1, dtype=torch.int64)
        for b in range(REQUESTS):
            proposal = DRAFTERS[drafter](b, generated[b], max(0, k - b % 2), plain[b])
            drafts[b, : len(proposal)] = torch.tensor(proposal, dtype=torch.int64)
        logits, masks = _step_inputs(generated, drafts)
        seeds = sv.request_seed(base_seeds(base_seed), torch.tensor([len(g) for g in generated]))
        first, recovered, bonus = verify(
            drafts, logits, TEMPERATURE, TOP_K, -1, TOP_P, float(TOP_P.min()), seeds, token_bitmasks=masks
        )
        for b in range(REQUESTS):
            f = int(first[b])
            generated[b] += recovered[b, : f + 1].tolist() if f < k else [*recovered[b].tolist(), int(bonus[b, 0])]
        proposed += int((drafts >= 0).sum())
        accepted += int(first.sum())
    return Decoding([g[:length] for g in generated], proposed, accepted)


@dataclass(frozen=True)
class DecodeRun:
    """One (drafter, K): identical to plain sampling or not; difference says where; raised, what the
    verifier raised (then identical is False)."""

    drafter: str
    k: int
    identical: bool
    proposed: int = 0
    accepted: int = 0
    difference: str = ""
    raised: str = ""


@dataclass(frozen=True)
class InvarianceResult:
    length: int
    runs: tuple[DecodeRun, ...] = ()
    skipped: str = ""

    @property
    def identical(self) -> bool:
        return all(run.identical for run in self.runs)

    @property
    def requests(self) -> int:
        return REQUESTS


def _first_difference(got: list[list[int]], plain: list[list[int]]) -> str:
    for b, (ours, theirs) in enumerate(zip(got, plain)):
        for n, (a, c) in enumerate(zip(ours, theirs)):
            if a != c:
                return f"request {b}, token {n}: {a} where plain sampling gave {c}"
    return ""


def check_drafter_invariance(
    verifier: Verifier | Callable, ks: tuple[int, ...] = (1, 3, 5), length: int = 24, base_seed: int = 2024
) -> InvarianceResult:
    """Decode plainly once, then speculatively with every drafter and every K in ks; compare."""
    verify = verifier if isinstance(verifier, Verifier) else as_verifier(verifier)
    if "token_bitmasks" not in verify.accepts:
        return InvarianceResult(length, skipped="the verifier takes no token_bitmasks")
    plain = decode_plainly(length + max(ks), base_seed)
    runs = []
    for name in DRAFTERS:
        for k in ks:
            try:
                run = decode_speculatively(verify, name, k, length, base_seed, plain)
            except Exception as err:  # a verifier under audit may raise anything; the report says what
                runs.append(DecodeRun(name, k, False, raised=f"{type(err).__name__}: {err}"))
                continue
            difference = _first_difference(run.tokens, [p[:length] for p in plain])
            runs.append(DecodeRun(name, k, not difference, run.proposed, run.accepted, difference))
    return InvarianceResult(length, tuple(runs))
