"""Grammar masks from a real matcher (llguidance): structured output under speculation.

`GrammarCompiler` turns a JSON schema, a regular expression or a list of choices into a `Grammar` for one
tokenizer and one model vocabulary. The decoding loops open one `GrammarMatchers` per generation (one
llguidance matcher per request, always at the committed state) and, every step, ask it for the packed
masks the verifier takes:

1. the mask of the committed state (draft position 0);
2. a copy of the matcher advanced through the draft, one mask per further position and one for the
   bonus; the draft ends at the first token the matcher refuses (the rest becomes -1 padding), which
   stays for the verifier to reject (its mask disallows it);
3. the copy dropped: the matcher is still at the committed state (a rollback that cannot fail);
4. after the verifier has decided, the matcher advanced by the tokens actually committed.

Every committed token is then allowed by the grammar, and the output is exactly the masked, truncated
target distribution (SPEC §2, §5). The stop tokens are llguidance's end-of-sequence tokens: they are
allowed exactly when the grammar is complete, and once nothing else can follow they are the only token
allowed, so a complete answer ends there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

import specverify

from ...contract import PAD


def _one_line(message: str) -> str:
    """llguidance's multi-line error (with a caret drawing) as one line: its first line and its `error:` lines."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    details = [line.removeprefix("error:").strip() for line in lines[1:] if line.startswith("error:")]
    return ": ".join([lines[0].rstrip(":")] + details) if lines else "unknown error"


@dataclass(frozen=True)
class Grammar:
    """A grammar compiled for one tokenizer and model vocabulary; `GrammarCompiler` makes them.

    kind: "json_schema", "regex" or "choice"; initial: an llguidance matcher at the start of the grammar,
    never advanced (`matcher` copies it); tokenizer_size: the tokenizer's ids; vocab_size: the model's V;
    stop_tokens: the ids that end a request (the grammar's end-of-sequence tokens); vocabulary: int32
    [ceil(V/32)], the packed mask of the ids the tokenizer has (the others are never allowed).
    """

    kind: str
    initial: object  # llguidance.LLMatcher
    tokenizer_size: int
    vocab_size: int
    stop_tokens: frozenset[int]
    vocabulary: torch.Tensor

    def matcher(self):
        """A fresh llguidance matcher at the start of the grammar (a copy: microseconds, no recompiling)."""
        return self.initial.deep_copy()


class GrammarCompiler:
    """Compiles grammars for one transformers tokenizer and one model.

    hf_tokenizer: a fast transformers tokenizer (llguidance reads its vocabulary, ~0.5 s for 50k tokens,
    once); vocab_size: the model's V, at least the tokenizer's size (ids past the tokenizer's are never
    allowed); stop_tokens: the ids that end a request, used as the grammar's end-of-sequence tokens.
    """

    def __init__(self, hf_tokenizer, vocab_size: int, stop_tokens: Iterable[int]):
        import llguidance.hf

        stops = sorted({int(t) for t in stop_tokens})
        if not stops:
            raise ValueError("a grammar needs at least one stop token (the end of a complete answer)")
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=stops)
        if self.tokenizer.vocab_size > vocab_size:
            raise ValueError(
                f"the tokenizer has more tokens ({self.tokenizer.vocab_size}) than the model's vocabulary "
                f"({vocab_size})"
            )
        self.vocab_size = vocab_size
        self.stop_tokens = frozenset(stops)
        self.vocabulary = specverify.pack_bitmask(torch.arange(vocab_size) < self.tokenizer.vocab_size)

    def json_schema(self, schema: dict | str) -> Grammar:
        """JSON text valid against schema (a dict or its JSON text)."""
        return self._compile("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    def regex(self, pattern: str) -> Grammar:
        """Text that matches pattern in full (Rust `regex` syntax)."""
        return self._compile("regex", pattern)

    def choices(self, options: Sequence[str]) -> Grammar:
        """Exactly one of the given non-empty strings."""
        options = list(options)
        if not options or not all(isinstance(o, str) and o for o in options):
            raise ValueError(f"choices must be a non-empty list of non-empty strings (got {options!r:.80})")
        return self._compile("choice", json.dumps(options))

    def _compile(self, kind: str, text: str) -> Grammar:
        import llguidance

        initial = llguidance.LLMatcher(self.tokenizer, grammar_source(kind, text), log_level=0)
        if initial.is_error():
            raise ValueError(f"invalid {kind.replace('_', ' ')}: {_one_line(initial.get_error())}")
        return Grammar(kind, initial, self.tokenizer.vocab_size, self.vocab_size, self.stop_tokens, self.vocabulary)


def grammar_source(kind: str, text: str) -> str:
    """llguidance's grammar for a JSON schema (as JSON text), a regex or a choice list (as a JSON list),
    checked without a tokenizer, so a bad grammar is refused before any model loads. Raises ValueError
    ("invalid regex: ...") for a grammar llguidance refuses."""
    import llguidance

    what = kind.replace("_", " ")
    try:
        source = llguidance.grammar_from(kind, text)
    except ValueError as err:
        raise ValueError(f"invalid {what}: {_one_line(str(err))}") from None
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source)
    if failed:
        raise ValueError(f"invalid {what}: {_one_line(messages[0] if messages else 'refused by llguidance')}")
    return source


def grammar_rows(grammar: Grammar | Sequence[Grammar | None] | None, batch: int) -> list[Grammar | None]:
    """One Grammar for every row, one (or None: unconstrained) per row, or None -> a list of batch entries."""
    rows = [grammar] * batch if grammar is None or isinstance(grammar, Grammar) else list(grammar)
    if len(rows) != batch or not all(g is None or isinstance(g, Grammar) for g in rows):
        raise ValueError(f"grammar must be a Grammar, None or a sequence of {batch} of them (got {grammar!r:.80})")
    return rows


class GrammarDeadEnd(ValueError):
    """The grammar cannot be continued: the tokenizer has no token for any text the grammar allows next.
    row: the request's row in the batch ("request {row}: " begins the message), where known; reason: the
    message without it."""

    def __init__(self, reason: str, row: int | None = None):
        super().__init__(reason if row is None else f"request {row}: {reason}")
        self.reason, self.row = reason, row


def _draft_masks(grammar: Grammar, matcher, draft: list[int]) -> tuple[int, torch.Tensor]:
    """Walk a copy of a matcher through a draft -> (n: how many draft tokens to keep, int32 [n+1,
    ceil(tokenizer size / 32)]: the mask at each kept position and at the one after).

    The kept draft is the prefix the grammar accepts, plus the first refused token if there is one: its
    mask disallows it, so the verifier rejects it for sure, and the token committed in its place is the
    verifier's recovery (in "sampled" mode, a draw from the residual max(0, p~ - q)). Dropping it and
    drawing from p~ instead would not be exact in "sampled" mode: the draft token would be rejected only
    when it is refused, not whenever it is unlikely under p~.

    The walk uses a copy (`deep_copy`, a microsecond) rather than consume-then-rollback: an allowed token
    after which nothing can follow (a dead end: the tokenizer cannot spell what the grammar requires) puts
    an llguidance matcher into an error state that rollback cannot undo. Such a token ends the kept draft
    before it; the loop stops with GrammarDeadEnd if it is ever committed.
    """
    import llguidance.numpy

    size = grammar.tokenizer_size
    walker = matcher.deep_copy()
    masks = np.zeros((len(draft) + 2, (size + 31) // 32), dtype=np.int32)
    llguidance.numpy.fill_next_token_bitmask(walker, masks, 0)
    if walker.is_error():
        error = _one_line(walker.get_error())
        raise GrammarDeadEnd(f"the grammar cannot be continued with this tokenizer (llguidance: {error})")
    # an id past the tokenizer's is refused (and llguidance must not see one)
    allowed = walker.validate_tokens(draft[: next((j for j, t in enumerate(draft) if t >= size), len(draft))])
    for j in range(allowed):
        walker.consume_token(draft[j])
        llguidance.numpy.fill_next_token_bitmask(walker, masks, j + 1)
        if walker.is_error():
            return j, torch.from_numpy(masks[: j + 1])
    if allowed == len(draft):
        return allowed, torch.from_numpy(masks[: allowed + 1])
    masks[allowed + 1] = masks[allowed]  # after the refused token: never committed
    return allowed + 1, torch.from_numpy(masks[: allowed + 2])


class GrammarMatchers:
    """The grammar state of every request of one generation: one llguidance matcher per constrained row.

    Masks are int32 [B, K+1, W] with W = ceil(V/32) for the model's V (SPEC §5). Unconstrained rows, and
    rows marked free (inside a thinking region), allow every token at every position.
    """

    def __init__(self, grammars: Sequence[Grammar | None], vocab_size: int):
        for grammar in grammars:
            if grammar is not None and grammar.vocab_size != vocab_size:
                raise ValueError(
                    f"the grammar was compiled for a vocabulary of {grammar.vocab_size} (the model has {vocab_size})"
                )
        self._grammars = list(grammars)
        self._matchers = [None if g is None else g.matcher() for g in grammars]
        self._words = (vocab_size + 31) // 32

    def masks(self, drafts: torch.Tensor, free: Sequence[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """The masks of one step, and how much of each draft to verify.

        drafts: int64 [B, K], -1 right-padded; free: B flags, True where the row is not constrained this
        step. Returns (lengths int64 [B]: each row's draft to keep, the prefix the grammar accepts plus
        its first refused token (see `_draft_masks`), bitmasks int32 [B, K+1, W]: position j masks the
        token after the committed tokens and the first j drafts; positions past a row's kept draft repeat
        its last mask, so none is empty).
        """
        batch, positions = drafts.shape
        lengths = (drafts != PAD).sum(1)
        out = torch.full((batch, positions + 1, self._words), -1, dtype=torch.int32)
        for b, (grammar, matcher) in enumerate(zip(self._grammars, self._matchers)):
            if matcher is None or free[b]:
                continue
            try:
                kept, masks = _draft_masks(grammar, matcher, drafts[b, : int(lengths[b])].tolist())
            except GrammarDeadEnd as err:
                raise GrammarDeadEnd(err.reason, row=b) from None
            out[b, : kept + 1, : masks.shape[-1]] = masks
            out[b, : kept + 1, masks.shape[-1] :] = 0
            out[b, kept + 1 :] = out[b, kept]
            out[b] &= grammar.vocabulary
            lengths[b] = kept
        return lengths, out

    def advance(self, row: int, tokens: Sequence[int]) -> None:
        """Move row's matcher past its newly committed tokens (every one was allowed by its mask)."""
        matcher = self._matchers[row]
        if matcher is None:
            return
        # one by one: llguidance's consume_tokens refuses a stop token once the grammar is complete
        for token in tokens:
            if not matcher.consume_token(token):
                raise RuntimeError(
                    f"the grammar refused committed token {token} of request {row}: {_one_line(matcher.get_error())}"
                )

    def complete(self) -> list[bool | None]:
        """Per row: whether its output so far is a complete sentence of its grammar (None: unconstrained)."""
        return [None if m is None else m.is_accepting() for m in self._matchers]
