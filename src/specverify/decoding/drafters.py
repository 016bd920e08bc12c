"""Drafters: what proposes the K tokens the target then verifies.

A drafter sees each row's whole context (prompt and generated tokens) and proposes up to k next tokens
per row, padded with -1 (ragged). It may be stateful (a draft model keeps a KV cache), but it must not
assume that its previous proposal was accepted: it is handed the committed context every time.

A drafter may also say, before it drafts, how much support each row's next draft has (`evidence`, in
its own units, 0 when it has nothing to propose); the adaptive draft length then keeps an acceptance
rate per evidence class (see `draft_length`). The n-gram drafter's evidence is its match length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

import specverify

from ..contract import PAD
from .model import LanguageModel, Session
from .params import RowParams

#: Added to the verifier's per-row seed for the draft model's own draws: a key region far from the
#: verifier's (s + position), so a draft is never drawn with a uniform the verifier also uses.
DRAFT_SEED_OFFSET = 0x2545F4914F6CDD1D


@dataclass
class Draft:
    """tokens: int64 [B, K], -1 padded; probs: float32 [B, K, V], the distribution each token was drawn
    from (zero rows at padding), or None for a deterministic proposal."""

    tokens: torch.Tensor
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        k: int,
        *,
        params: RowParams,
        seeds: torch.Tensor,
        sampled: bool,
    ) -> Draft:
        """Up to k tokens for each context. params: the target's sampling parameters [B]; seeds: int64
        [B], the verifier's seeds for this step; sampled: draw from a distribution and return it (else
        propose deterministically)."""
        ...


def drafter_evidence(drafter: Drafter, contexts: Sequence[Sequence[int]]) -> list[int] | None:
    """The drafter's `evidence(contexts)` for each row's next draft (an int >= 0; 0: it will propose
    nothing), or None for a drafter that gives none."""
    evidence = getattr(drafter, "evidence", None)
    if evidence is None:
        return None
    values = list(evidence(contexts))
    if len(values) != len(contexts) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"the drafter's evidence must be one int >= 0 per row (got {values!r:.80})")
    return values


def pad_rows(rows: Sequence[Sequence[int]], width: int | None = None) -> torch.Tensor:
    """Right-pad token lists with -1 -> int64 [len(rows), width (default: the longest)]."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    padded = [[int(t) for t in r[:width]] + [PAD] * (width - len(r[:width])) for r in rows]
    return torch.tensor(padded, dtype=torch.int64).reshape(len(rows), width)  # one torch op: a row each cost more


class SuffixIndex:
    """A token sequence that grows, and where each of its token pairs occurs: the index prompt lookup
    searches (`longest_suffix`). `sync` brings it to a context by appending the new tokens when the
    context extends what it holds (a decoding row, step after step), else by indexing the context anew.

    In pure Python: a step appends one or a few tokens and checks a handful of earlier occurrences, a few
    µs, where a whole-context numpy search cost ~0.15 ms a step on the caches a llama.cpp forward had
    just evicted.
    """

    def __init__(self, context: Sequence[int] = ()):
        self.tokens: list[int] = []
        #: (a, b) -> ascending i with tokens[i-1] = a, tokens[i] = b and i < len - 1 (followed by a token)
        self._pairs: dict[tuple[int, int], list[int]] = {}
        #: b -> ascending i with tokens[i] = b and i < len - 1
        self._singles: dict[int, list[int]] = {}
        #: The last search of these tokens: ((max_ngram, min_ngram), its result), or None.
        self._found: tuple[tuple[int, int], tuple[int, list[int]]] | None = None
        self.sync(context)

    def sync(self, context: Sequence[int]) -> None:
        """Hold exactly context (L token ids)."""
        context = context if isinstance(context, list) else [int(t) for t in context]
        held = len(self.tokens)
        if len(context) == held and context == self.tokens:
            return  # unchanged: the last search still holds
        if len(context) < held or context[:held] != self.tokens:
            self.tokens, self._pairs, self._singles, held = [], {}, {}, 0
        self._found = None
        tokens = self.tokens
        tokens += context[held:]
        for i in range(max(held - 1, 0), len(tokens) - 1):  # positions newly followed by a token
            self._singles.setdefault(tokens[i], []).append(i)
            if i:
                self._pairs.setdefault((tokens[i - 1], tokens[i]), []).append(i)

    def continuation(self, k: int, max_ngram: int, min_ngram: int) -> list[int]:
        """Prompt lookup: the k tokens (at most) that followed the most recent earlier occurrence of the
        longest suffix (`longest_suffix`); none when no suffix recurs."""
        starts = self.longest_suffix(max_ngram, min_ngram)[1]
        return self.tokens[starts[-1] : starts[-1] + k] if starts else []

    def longest_suffix(self, max_ngram: int, min_ngram: int) -> tuple[int, list[int]]:
        """The longest suffix (max_ngram down to min_ngram tokens) that occurred before, and where its
        continuations start (the index after each earlier occurrence) -> (its length, 0 when no suffix
        recurs; the starts ascending, the most recent last, empty when none recurs)."""
        if self._found is None or self._found[0] != (max_ngram, min_ngram):
            self._found = (max_ngram, min_ngram), self._search(max_ngram, min_ngram)
        return self._found[1]

    def _search(self, max_ngram: int, min_ngram: int) -> tuple[int, list[int]]:
        tokens = self.tokens
        n = min(max_ngram, len(tokens) - 1)
        if n < min_ngram:
            return 0, []
        last = len(tokens) - 1
        ends = self._pairs.get((tokens[last - 1], tokens[last]), []) if n >= 2 else []
        if not ends:  # no earlier pair: the longest match has one token, where the last token occurred
            starts = [i + 1 for i in self._singles.get(tokens[last], [])] if min_ngram <= 1 else []
            return (1, starts) if starts else (0, [])
        best, starts = 0, []
        for i in ends:  # tokens[i-1:i+1] matches the last two: count on to the left, up to n
            m = 2
            while m < n and m <= i and tokens[i - m] == tokens[last - m]:
                m += 1
            if m > best:
                best, starts = m, [i + 1]
            elif m == best:
                starts.append(i + 1)
        return (best, starts) if best >= min_ngram else (0, [])


def check_ngram_range(max_ngram: int, min_ngram: int) -> tuple[int, int]:
    """The suffix lengths an n-gram drafter tries -> (max_ngram, min_ngram); ValueError unless 1 <= min <= max."""
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram (got min_ngram={min_ngram}, max_ngram={max_ngram})")
    return max_ngram, min_ngram


def lookup_continuation(context: Sequence[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Prompt lookup: the k tokens that followed the most recent earlier occurrence of the longest
    suffix of context (max_ngram down to min_ngram tokens) that occurred before. context: L token ids ->
    at most k ids (none when no suffix recurs)."""
    return SuffixIndex(context).continuation(k, max_ngram, min_ngram)


class NgramDrafter:
    """Prompt-lookup drafting: copy what followed the last earlier occurrence of the context's suffix.

    max_ngram: the longest suffix tried (8 by default, as a longer match picks the right one of several
    occurrences of a short phrase: on the built-in copy example, greedy, K = 10, 3 gave 7 target steps
    and 5 to 16 gave 6; elsewhere the same); min_ngram: the shortest.

    Deterministic, so in "sampled" mode its draft is the one-hot distribution on each proposed token.
    Its evidence for a row is the length of that suffix (0: none recurs, no draft).
    """

    def __init__(self, max_ngram: int = 8, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = check_ngram_range(max_ngram, min_ngram)
        #: One index per row, synced to the row's context by `evidence` and `propose` (a search of an
        #: unchanged context is not repeated, so `propose` after `evidence` reuses it).
        self._indexes: list[SuffixIndex] = []

    def _synced(self, contexts: Sequence[Sequence[int]]) -> list[SuffixIndex]:
        """The rows' indexes, each holding its context."""
        if len(self._indexes) != len(contexts):
            self._indexes = [SuffixIndex() for _ in contexts]
        for index, context in zip(self._indexes, contexts):
            index.sync(context)
        return self._indexes

    def evidence(self, contexts: Sequence[Sequence[int]]) -> list[int]:
        """Per context, the length of its longest suffix that recurred (0 when none: no draft)."""
        return [index.longest_suffix(self.max_ngram, self.min_ngram)[0] for index in self._synced(contexts)]

    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        k: int,
        *,
        params: RowParams,
        seeds: torch.Tensor,
        sampled: bool,
    ) -> Draft:
        indexes = self._synced(contexts)
        return Draft(pad_rows([index.continuation(k, self.max_ngram, self.min_ngram) for index in indexes], k))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class ModelDrafter:
    """A second, cheaper language model with the target's tokenizer drafts k tokens autoregressively.

    With sampled=False it proposes its argmax; with sampled=True it samples each token from its own
    distribution truncated like the target's (`specverify.truncated_probs` with the target's params) on
    keys offset from the verifier's, and returns those distributions as `draft_probs_full`. Its KV cache
    follows the committed contexts: each call keeps the longest prefix it still shares with them.
    """

    def __init__(self, model: LanguageModel):
        self.model = model
        self._session: Session | None = None
        self._cached: list[list[int]] = []

    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        k: int,
        *,
        params: RowParams,
        seeds: torch.Tensor,
        sampled: bool,
    ) -> Draft:
        batch = len(contexts)
        if k == 0:
            empty = torch.empty(batch, 0, dtype=torch.int64)
            return Draft(empty, torch.empty(batch, 0, self.model.vocab_size) if sampled else None)
        logits = self._catch_up(contexts)
        params, seeds = params.to(logits.device), seeds.to(logits.device)
        tokens, probs = [], []
        for j in range(k):
            if sampled:
                probs.append(
                    specverify.truncated_probs(logits, params.temperature, params.top_k, params.top_p, params.min_p)
                )
                seed = seeds + DRAFT_SEED_OFFSET + j
                tokens.append(
                    specverify.sample(logits, params.temperature, params.top_k, params.top_p, seed, params.min_p)
                )
            else:
                tokens.append(logits.argmax(-1))
            if j < k - 1:
                logits = self._session.extend(tokens[-1][:, None])[:, 0].float()
        drafts = torch.stack(tokens, 1)
        self._cached = [list(c) + drafts[b, : k - 1].tolist() for b, c in enumerate(contexts)]
        return Draft(drafts, torch.stack(probs, 1) if sampled else None)

    def _catch_up(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Roll the cache back to what it shares with contexts, feed the rest -> float32 [B, V]: the
        draft model's logits for each context's next token."""
        if self._session is None or len(self._cached) != len(contexts):
            self._session = self.model.session(len(contexts))
            self._cached = [[] for _ in contexts]
        keep = [min(common_prefix(c, s), len(s) - 1) for c, s in zip(self._cached, contexts)]
        self._session.truncate(torch.tensor(keep, dtype=torch.int64))
        feed = [list(s[n:]) for s, n in zip(contexts, keep)]
        logits = self._session.extend(pad_rows(feed))
        last = torch.tensor([len(f) - 1 for f in feed])
        return logits[torch.arange(len(feed)), last].float()
