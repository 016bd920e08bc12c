"""Tree drafters: what proposes the draft tree of N nodes a tree step verifies (SPEC §8's layout).

A tree drafter sees each row's whole committed context and proposes, per row, up to `nodes` nodes whose
paths from the root are at most `depths[b]` tokens long: tokens [B, N] and parents [B, N] (-1 = a child
of the root, else an earlier node), -1 padded (ragged rows). Like a chain drafter it may keep state (a
draft model's KV cache) but is handed the committed contexts every time.

- `NgramTrieDrafter`: the continuations of every earlier occurrence of the context's longest recurring
  suffix, merged into a trie, the most frequent branches first. Deterministic.
- `ModelTreeDrafter`: a draft model grows the tree level by level (one tree forward per level): in argmax
  mode its top-b tokens under each expanded node; in sampled mode b children drawn from its distribution
  (with or without replacement), returned as `probs` for the verifier.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

import specverify

from ...contract import PAD, SIBLING_DRAWS
from ..engines.base import LanguageModel
from ..params import RowParams
from .base import common_prefix, draw_draft, pad_rows
from .ngram import SuffixIndex, check_ngram_range


@dataclass
class TreeDraft:
    """tokens, parents: int64 [B, N], -1 padded; probs: float32 [B, N, V], node i's q (the distribution it
    was drawn from; siblings share it), or None for a deterministic proposal; sibling_draws: how siblings
    were drawn from their q (`tree_acceptance_sampler`'s argument; used in sampled mode only)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    probs: torch.Tensor | None = None
    sibling_draws: str = "with_replacement"


class TreeDrafter(Protocol):
    def propose_tree(
        self,
        contexts: Sequence[Sequence[int]],
        nodes: int,
        depths: Sequence[int],
        *,
        params: RowParams,
        seeds: torch.Tensor,
        sampled: bool,
    ) -> TreeDraft:
        """Up to `nodes` nodes per context, no path longer than depths[b] (0: no nodes). params: the
        target's sampling parameters [B]; seeds: int64 [B], the verifier's seeds for this step; sampled:
        draw the children from a distribution and return it (else propose deterministically)."""
        ...


def empty_tree(batch: int, vocab_size: int | None = None, sibling_draws: str = "with_replacement") -> TreeDraft:
    """A draft without nodes (probs [B, 0, V] when vocab_size is given)."""
    none = torch.empty(batch, 0, dtype=torch.int64)
    probs = None if vocab_size is None else torch.empty(batch, 0, vocab_size)
    return TreeDraft(none, none.clone(), probs, sibling_draws)


def continuation_trie(
    context: Sequence[int], nodes: int, depth: int, max_ngram: int, min_ngram: int
) -> tuple[list[int], list[int]]:
    """The n-gram trie of one context -> (tokens, parents), at most `nodes` nodes, paths of at most `depth`.

    Every earlier occurrence of the longest suffix of context (max_ngram down to min_ngram tokens) that
    recurs is followed by up to `depth` tokens; those continuations are merged into a trie whose nodes count
    the continuations through them. Nodes are taken best first: the most continuations, ties to the one
    seen most recently (a node's count never exceeds its parent's, so every parent comes before its
    children). Empty when no suffix recurs.
    """
    if nodes <= 0 or depth <= 0:
        return [], []
    values = list(context)
    starts = SuffixIndex(values).longest_suffix(max_ngram, min_ngram)[1]
    index: dict[tuple[int, int], int] = {}
    token, parent, count, latest, children = [], [], [], [], []
    for start in reversed(starts):  # the most recent first
        above = PAD
        for value in values[start : start + depth]:
            node = index.get((above, value))
            if node is None:
                node = index[(above, value)] = len(token)
                token.append(value), parent.append(above), count.append(0), latest.append(start), children.append([])
                if above != PAD:
                    children[above].append(node)
            count[node] += 1
            above = node
    frontier = [(-count[n], -latest[n], n) for n, p in enumerate(parent) if p == PAD]
    heapq.heapify(frontier)
    placed: dict[int, int] = {}
    tokens, parents = [], []
    while frontier and len(tokens) < nodes:
        node = heapq.heappop(frontier)[2]
        placed[node] = len(tokens)
        tokens.append(token[node])
        parents.append(PAD if parent[node] == PAD else placed[parent[node]])
        for child in children[node]:
            heapq.heappush(frontier, (-count[child], -latest[child], child))
    return tokens, parents


class NgramTrieDrafter:
    """Prompt lookup as a tree: every earlier continuation of the context's suffix, merged (`continuation_trie`).

    Deterministic: in "sampled" mode the loop judges its nodes without a distribution (SPEC §3.2, q = 0),
    which is lossless for any deterministic draft.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = check_ngram_range(max_ngram, min_ngram)

    def propose_tree(
        self,
        contexts: Sequence[Sequence[int]],
        nodes: int,
        depths: Sequence[int],
        *,
        params: RowParams,
        seeds: torch.Tensor,
        sampled: bool,
    ) -> TreeDraft:
        tries = [
            continuation_trie(c, nodes, min(d, nodes), self.max_ngram, self.min_ngram) for c, d in zip(contexts, depths)
        ]
        return TreeDraft(pad_rows([t for t, _ in tries]), pad_rows([p for _, p in tries]))


class ModelTreeDrafter:
    """A cheaper model with the target's tokenizer grows the tree level by level, one tree forward each
    (its session must be a `TreeSession`, as `HFLanguageModel`'s is).

    Level 0 hangs `branching` children under the root; each later level expands the `branching` nodes of the
    level above with the highest path score (the product of the draft's probabilities along the path) into
    `branching` children each, until `nodes` nodes or the row's depth. Which nodes expand, and how many
    children each gets, is fixed before the children are drawn, so sampled siblings are the declared draws.
    - argmax mode (sampled=False): the children are the draft's `branching` most likely tokens.
    - sampled mode: the children are drawn from q = the draft's distribution truncated like the target's
      (`specverify.truncated_probs` with the target's params), i.i.d. ("with_replacement", SpecInfer) or each
      from q without the earlier siblings' tokens, renormalised ("without_replacement"); fewer when q has no
      tokens left. q is returned for every child. Greedy rows get one child, the argmax (the verifier's walk
      follows the argmax there). Draws (`draw_draft`): the verifier's key of the node's position (seed + depth)
      on the drafters' stream STREAM_DRAFT + the draw's index at that depth, a stream the verifier never uses.
    """

    def __init__(self, model: LanguageModel, branching: int = 2, sibling_draws: str = "with_replacement"):
        if isinstance(branching, bool) or not isinstance(branching, int) or branching < 1:
            raise ValueError(f"branching must be an int >= 1 (got {branching!r})")
        if sibling_draws not in SIBLING_DRAWS:
            raise ValueError(
                f'sibling_draws must be "with_replacement" or "without_replacement" (got {sibling_draws!r})'
            )
        self.model, self.branching, self.sibling_draws = model, branching, sibling_draws
        self._session = None
        self._cached: list[list[int]] = []  # what the session holds per row: the context but its last token

    def propose_tree(
        self,
        contexts: Sequence[Sequence[int]],
        nodes: int,
        depths: Sequence[int],
        *,
        params: RowParams,
        seeds: torch.Tensor,
        sampled: bool,
    ) -> TreeDraft:
        batch, vocab = len(contexts), self.model.vocab_size
        depths = [min(d, nodes) for d in depths]
        if max(depths, default=0) <= 0:
            return empty_tree(batch, vocab if sampled else None, self.sibling_draws)
        base = self._catch_up(contexts)
        roots = torch.tensor([[c[-1]] for c in contexts], dtype=torch.int64)
        tokens: list[list[int]] = [[] for _ in contexts]
        parents: list[list[int]] = [[] for _ in contexts]
        scores: list[list[float]] = [[] for _ in contexts]
        qs: list[list[torch.Tensor]] = [[] for _ in contexts]
        frontier: list[list[int]] = [[PAD] for _ in contexts]  # the nodes to expand next (PAD: the root)
        for depth in range(max(depths)):
            logits = self._session.extend_tree(roots, pad_rows(tokens), pad_rows(parents))
            self._session.truncate(base)  # the root and the tree go again
            grown = [[] for _ in contexts]
            for b in range(batch):
                if depth >= depths[b]:
                    continue
                chosen = sorted(frontier[b], key=lambda n: -scores[b][n] if n != PAD else 0.0)[: self.branching]
                for node in chosen:
                    room = nodes - len(tokens[b])
                    if room <= 0:
                        break
                    row = logits[b, node + 1].float()
                    score = 1.0 if node == PAD else scores[b][node]
                    if sampled:
                        drawn, q = self._draw(row, params, b, seeds[b], depth, len(grown[b]), min(room, self.branching))
                        probs = q
                    else:
                        probs = torch.softmax(row, -1)
                        drawn = probs.topk(min(room, self.branching)).indices.tolist()
                    for token in drawn:
                        grown[b].append(len(tokens[b]))
                        tokens[b].append(token)
                        parents[b].append(node)
                        scores[b].append(score * float(probs[token]))
                        if sampled:
                            qs[b].append(q)
            frontier = grown
            if not any(grown):
                break
        probs = None
        if sampled:
            width = max(len(t) for t in tokens)
            probs = torch.zeros(batch, width, vocab)
            for b, rows in enumerate(qs):
                if rows:
                    probs[b, : len(rows)] = torch.stack(rows).cpu()
        return TreeDraft(pad_rows(tokens), pad_rows(parents), probs, self.sibling_draws)

    def _draw(
        self,
        logits: torch.Tensor,
        params: RowParams,
        row: int,
        seed: torch.Tensor,
        depth: int,
        drawn_before: int,
        count: int,
    ) -> tuple[list[int], torch.Tensor]:
        """Draw up to `count` siblings from one node's q -> (tokens, q float32 [V]). logits: float32 [V], the
        draft's scores after the node; drawn_before: this row's draws at this depth so far (for the keys)."""

        def one(t):
            return None if t is None else t[row : row + 1].to(logits.device)

        q = specverify.truncated_probs(logits[None], *(one(t) for t in params))[0]
        if float(params.temperature[row]) < 1e-5:
            count = 1  # greedy: the verifier follows the argmax whatever the siblings
        left = q.clone()
        tokens = []
        for k in range(count):
            if self.sibling_draws == "without_replacement" and float(left.sum()) <= 0:
                break
            token = int(draw_draft(left[None], seed.reshape(1) + depth, drawn_before + k)[0])
            tokens.append(token)
            if self.sibling_draws == "without_replacement":
                left[token] = 0
        return tokens, q

    def _catch_up(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Bring the session to every context but its last token (keeping what it shares) -> its lengths int64 [B]."""
        heads = [list(c[:-1]) for c in contexts]
        if self._session is None or len(self._cached) != len(contexts):
            self._session = self.model.session(len(contexts))
            if not callable(getattr(self._session, "extend_tree", None)):
                raise TypeError(
                    "ModelTreeDrafter needs a model whose sessions score trees (a TreeSession, e.g. HFLanguageModel)"
                )
            self._cached = [[] for _ in contexts]
        keep = [common_prefix(c, h) for c, h in zip(self._cached, heads)]
        self._session.truncate(torch.tensor(keep, dtype=torch.int64))
        self._session.extend(pad_rows([h[n:] for h, n in zip(heads, keep)]), return_logits=False)
        self._cached = heads
        return self._session.lengths.clone()
