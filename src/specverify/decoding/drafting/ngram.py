"""Prompt lookup: the n-gram drafter proposes what followed the latest earlier occurrence of the context's
suffix, found through a per-row suffix index kept in step with the committed tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..params import RowParams
from .base import Draft, pad_rows


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
