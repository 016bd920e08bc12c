"""A batch of `Request`s on a loaded model: every request a row of one speculative loop, then, when asked,
the same batch with plain decoding for comparison.

Each row has its own sampling parameters, seed, budget and grammar (ragged drafts).

Row b is keyed by its request's own seed (SPEC §4: the verifier's per-request seed is
`specverify.request_seed(seed, n)` for its n-th token), so a request's
output is the one it gets alone with the same seed, whatever else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from .constraints.grammar import Grammar, GrammarCompiler
from .constraints.schema import schema_violation
from .constraints.thinking import ThinkingRegions
from .drafting.base import Drafter
from .drafting.tree import TreeDrafter
from .engines.loading import LoadedModel
from .loop.chain import plain_generate, speculative_generate
from .loop.result import GenerationResult
from .loop.tree import tree_generate
from .requests import GRAMMAR_FIELDS, Request

#: How each grammar kind is named in errors about a request given by the command's flags.
GRAMMAR_FLAGS = {"json_schema": "--json-schema", "regex": "--regex", "choice": "--choices"}
#: ... and by a JSONL line (the inverse of requests.GRAMMAR_FIELDS).
FIELD_OF_KIND = {kind: field for field, kind in GRAMMAR_FIELDS.items()}


class GrammarError(ValueError):
    """A request's grammar does not compile; the message names the request and its field."""


@dataclass
class BatchRun:
    """What a batch produced: per request its prompt's token ids, its text and its grammar check (None
    without a grammar; else {"kind", "complete", and for a JSON schema "schema_error": None when valid});
    the speculative result over the batch, and the plain one (None unless compared)."""

    requests: list[Request]
    prompt_ids: list[list[int]]
    texts: list[str]
    checks: list[dict | None]
    speculative: GenerationResult
    plain: GenerationResult | None

    @property
    def identical(self) -> list[bool] | None:
        """Per request: speculative and plain decoding gave the same tokens (None unless compared)."""
        if self.plain is None:
            return None
        return [s == p for s, p in zip(self.speculative.tokens, self.plain.tokens)]


def compile_grammars(loaded: LoadedModel, requests: list[Request]) -> list[Grammar | None]:
    """Each request's Grammar (None without one). Raises GrammarError naming the request and its field."""
    if all(r.grammar is None for r in requests):
        return [None] * len(requests)
    tokenizer = loaded.tokenizer
    compiler = GrammarCompiler(tokenizer.tokenizer, loaded.model.vocab_size, tokenizer.stop_tokens)
    compile_ = {"json_schema": compiler.json_schema, "regex": compiler.regex, "choice": compiler.choices}
    grammars = []
    for request in requests:
        if request.grammar is None:
            grammars.append(None)
            continue
        kind, value = request.grammar
        try:
            grammars.append(compile_[kind](value))
        except ValueError as err:
            where = f"{request.origin}: {FIELD_OF_KIND[kind]}" if request.origin else GRAMMAR_FLAGS[kind]
            raise GrammarError(f"{where}: {err}") from None
    return grammars


def grammar_check(request: Request, complete: bool | None, text: str) -> dict | None:
    """Whether an answer satisfies its request's grammar: the matcher's verdict (`complete`), and for a JSON
    schema an independent check with `jsonschema` (`schema_error`: None when valid)."""
    if request.grammar is None:
        return None
    check = {"kind": request.grammar[0], "complete": complete}
    if request.grammar[0] == "json_schema":
        check["schema_error"] = schema_violation(request.grammar[1], text)
    return check


def run_requests(
    loaded: LoadedModel,
    drafter: Drafter | TreeDrafter,
    requests: list[Request],
    *,
    k: int | str = "auto",
    tree: int | None = None,
    draft_proposal: str = "argmax",
    thinking: ThinkingRegions | None = None,
    relaxed: tuple[int, float] | None = None,
    verification: str = "token",
    on_step=None,
    compare: bool = False,
    around_plain: Callable[[], AbstractContextManager] = nullcontext,
) -> BatchRun:
    """Decode the requests together (chat template applied to each prompt). k, draft_proposal, thinking,
    relaxed, verification, on_step: as `speculative_generate`; tree: a number of nodes to decode with `tree_generate`
    instead (drafter: a TreeDrafter; no grammar, no relaxed); compare: then decode the same batch with plain decoding
    (inside the context around_plain() gives, e.g. a progress display). A grammar that does not compile raises
    GrammarError naming the request; `grammar.GrammarDeadEnd` propagates."""
    grammars = compile_grammars(loaded, requests)
    prompt_ids = [loaded.tokenizer.encode_chat(r.prompt) for r in requests]
    common = {
        "seed": [r.seed for r in requests],
        "max_tokens": [r.max_tokens for r in requests],
        "stop_tokens": loaded.tokenizer.stop_tokens,
        "grammar": grammars,
        "thinking": thinking,
    }
    params = [r.params for r in requests]
    if tree is not None and relaxed is not None:
        raise ValueError("relaxed acceptance is a chain rule (SPEC §3.4): tree drafts are verified losslessly only")
    if tree is not None and verification != "token":
        raise ValueError("block verification is a chain rule (SPEC §3.6): a tree is verified by its walk (§8)")
    if tree is not None:
        spec = tree_generate(
            loaded.model,
            drafter,
            prompt_ids,
            params,
            nodes=tree,
            draft_proposal=draft_proposal,
            on_step=on_step,
            **common,
        )
    else:
        spec = speculative_generate(
            loaded.model,
            drafter,
            prompt_ids,
            params,
            k=k,
            draft_proposal=draft_proposal,
            on_step=on_step,
            relaxed=relaxed,
            verification=verification,
            **common,
        )
    plain = None
    if compare:
        with around_plain():
            plain = plain_generate(loaded.model, prompt_ids, params, **common)
    texts = [loaded.tokenizer.decode(t) for t in spec.tokens]
    complete = spec.grammar_complete or [None] * len(requests)
    checks = [grammar_check(r, c, t) for r, c, t in zip(requests, complete, texts)]
    return BatchRun(requests, prompt_ids, texts, checks, spec, plain)
