"""Speculative decoding with draft trees: per step one target forward over every node of a tree, verified
by `specverify.tree_acceptance_sampler` (SPEC §8).

The loop keeps the chain loop's state and bookkeeping (`loop`): the session holds each row's context but
its last token; row b's n-th token is keyed by request_seed(base_seed[b], n), so in "argmax" mode the committed tokens
are exactly plain decoding's, whatever the trees; in "sampled" mode they have the same distribution.
Per step:
1. the drafter proposes a tree per row (ragged, -1 padded), no path longer than the row's remaining budget;
2. `extend_tree` scores the root (the last committed token) and every node in one forward;
3. the verifier walks the tree (argmax mode without q; sampled mode with the drafter's q and its sibling
   scheme) and `tree_committed_tokens` gives each row's path tokens then the next token;
4. the tokens are committed (cut at the budget, a stop token, a thinking boundary) and `keep_path` keeps
   exactly the committed ones but the last in the cache.

Grammar masks are refused (a ValueError naming the rule): tree steps are verified without masks. Thinking
regions are accepted (a commit ends at a boundary as in the chain loop); the relaxed rule is a chain rule.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch

import specverify

from ...contract import PAD
from ..constraints.grammar import grammar_rows
from ..constraints.thinking import ThinkingRegions
from ..drafting.tree import TreeDraft, TreeDrafter
from ..engines.base import LanguageModel
from ..engines.tree_attention import tree_ancestry
from ..params import SamplingParams, row_params
from .result import GenerationResult
from .state import BatchState, GrammarArg, OnStep, check_draft_proposal, commit_step, finish, prefill


@torch.inference_mode()
def tree_generate(
    target: LanguageModel,
    drafter: TreeDrafter,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
    *,
    nodes: int = 16,
    seed: int | Sequence[int] = 0,
    max_tokens: int | Sequence[int] = 128,
    draft_proposal: str = "argmax",
    stop_tokens: Iterable[int] = (),
    on_step: OnStep | None = None,
    grammar: GrammarArg = None,
    thinking: ThinkingRegions | None = None,
) -> GenerationResult:
    """Speculative decoding with a draft tree of up to `nodes` nodes per row and step.

    Arguments as in `speculative_generate`, with nodes (an int >= 0; 0 makes every step a plain one) in
    place of k, and a `TreeDrafter`; the target's sessions must be `TreeSession`s (`HFLanguageModel`'s are).
    draft_proposal: "argmax" (any tree; output token-identical to `plain_generate` with the same seed) or
    "sampled" (the drafter's children were drawn from the q it returns, by its `sibling_draws` scheme; a
    deterministic drafter's nodes are judged without a distribution, q = 0; same output distribution).
    grammar must be None: tree steps are verified without grammar masks.

    The statistics read a tree step as a chain: `drafted` counts the depths the walk was offered a node at
    (the accepted path, plus the depth where it stopped if the node there had children), `accepted` the
    accepted path, so `acceptance[j]` is the chance the walk descends at depth j when it can.
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
        raise ValueError(f"nodes must be an int >= 0 (got {nodes!r})")
    sampled = check_draft_proposal(draft_proposal)
    requests = BatchState(prompts, max_tokens, stop_tokens, seed, thinking)
    constrained = [b for b, g in enumerate(grammar_rows(grammar, len(requests.contexts))) if g is not None]
    if constrained:
        raise ValueError(
            f"grammar must be None with tree drafts: tree steps are verified without grammar masks "
            f"(got a grammar at row {constrained[0]}); use speculative_generate for structured output"
        )
    rows = row_params(params, len(requests.contexts))
    result = GenerationResult(requests.generated)
    session = prefill(target, requests, result)
    if not (callable(getattr(session, "extend_tree", None)) and callable(getattr(session, "keep_path", None))):
        raise TypeError(
            f"tree_generate needs a target whose sessions score trees (a TreeSession; got {type(session).__name__})"
        )
    start = time.perf_counter()
    while any(requests.active):
        seeds = requests.seeds()
        budgets = requests.draft_budgets()
        draft = drafter.propose_tree(requests.contexts, nodes, budgets, params=rows, seeds=seeds, sampled=sampled)
        tokens, parents, probs = fit_tree(draft, nodes, budgets, sampled, target.vocab_size)
        logits = session.extend_tree(requests.last_tokens(), tokens, parents).float()
        device = logits.device
        on = rows.to(device)
        path, path_length, next_token = specverify.tree_acceptance_sampler(
            tokens.to(device),
            parents.to(device),
            logits,
            on.temperature,
            on.top_k,
            on.top_p,
            seeds.to(device),
            min_p=on.min_p,
            draft_proposal=draft_proposal,
            draft_probs=None if probs is None else probs.to(device),
            sibling_draws=draft.sibling_draws,
        )
        committed, count = specverify.tree_committed_tokens(tokens.to(device), path, path_length, next_token)
        path, path_length = path.cpu(), path_length.cpu()
        offered = offered_depths(tokens, parents, path, path_length)
        tokens_per_row = [row[:n] for row, n in zip(committed.tolist(), count.tolist())]
        kept = commit_step(requests, result, tokens_per_row, offered, path_length.tolist(), on_step, None)
        # the cache keeps the committed tokens but the last: the root (already in) and len(kept) - 1 path nodes
        session.keep_path(path, torch.tensor([max(len(k) - 1, 0) for k in kept], dtype=torch.int64))
    return finish(result, None, start)


def fit_tree(
    draft: TreeDraft, nodes: int, budgets: list[int], sampled: bool, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Check a drafter's tree and cut it to what each row can use.

    draft: as `TreeDraft`; budgets: per row, the most draft tokens a path may commit (0: no nodes).
    Returns (tokens int64 [B, N'] with every node deeper than its row's budget made padding, parents int64
    [B, N'], probs float32 [B, N', V] in sampled mode (zero rows, judged without a distribution, for a
    deterministic drafter) else None). The tree's values are the verifier's to check (SPEC §8).
    """
    tokens, parents = draft.tokens, draft.parents
    for name, value in (("tokens", tokens), ("parents", parents)):
        if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dim() != 2:
            raise ValueError(f"the tree drafter's {name} must be an integer tensor [B, N] (got {value!r:.80})")
    if tokens.shape != parents.shape or tokens.shape[0] != len(budgets) or tokens.shape[1] > nodes:
        raise ValueError(
            f"the tree drafter must return tokens and parents of one shape [B={len(budgets)}, N <= {nodes}] "
            f"(got {list(tokens.shape)} and {list(parents.shape)})"
        )
    tokens, parents = tokens.to("cpu", torch.int64), parents.to("cpu", torch.int64)
    depth = node_depths(parents)
    tokens = torch.where(depth < torch.tensor(budgets)[:, None], tokens, PAD)
    if not sampled:
        return tokens, parents, None
    if draft.probs is None:
        return tokens, parents, torch.zeros(*tokens.shape, vocab_size)
    if not isinstance(draft.probs, torch.Tensor) or draft.probs.shape != (*tokens.shape, vocab_size):
        shape = getattr(draft.probs, "shape", draft.probs)
        raise ValueError(
            f"the tree drafter's probs must be [B, N, V] = {[*tokens.shape, vocab_size]} (V the target's) (got {shape!r:.80})"
        )
    return tokens, parents, draft.probs.to("cpu", torch.float32)


def node_depths(parents: torch.Tensor) -> torch.Tensor:
    """Each node's depth (the root's children: 0) -> int64 [B, N]. parents: int64 [B, N]; a parent that is
    not an earlier node counts as the root (the verifier refuses such a tree or never walks there)."""
    earlier = torch.arange(parents.shape[1])
    linked = (parents == PAD) | ((parents >= 0) & (parents < earlier))
    return tree_ancestry(parents, linked).sum(-1) - 1


def offered_depths(
    tokens: torch.Tensor, parents: torch.Tensor, path: torch.Tensor, path_length: torch.Tensor
) -> list[int]:
    """Per row, the depths at which the walk was offered a node: the path's length, plus one when the node
    it stopped at (the root for an empty path) had children. tokens, parents, path: int64 [B, N]; path_length [B]."""
    if tokens.shape[1] == 0:
        return path_length.tolist()
    last = torch.where(path_length > 0, path.gather(1, (path_length - 1).clamp_min(0)[:, None])[:, 0], PAD)
    has_children = ((tokens != PAD) & (parents == last[:, None])).any(1)
    return (path_length + has_children.long()).tolist()
