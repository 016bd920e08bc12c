"""Helpers for the tree tests: random trees, padding inserted anywhere, and the SPEC §8 walk in argmax
mode written from the spec with `sv.sample` one token at a time (the reference the verifier must equal)."""

from __future__ import annotations

import numpy as np
import torch

import specverify as sv
from tests.support.seeds import per_row_seeds


def random_trees(
    rng: np.random.Generator, batch: int, nodes: int, vocab: int, padding: float
) -> tuple[np.ndarray, np.ndarray]:
    """(draft [B, N], parents [B, N]) int64: node i's parent uniform over [-1, i); a share `padding` of the
    nodes are padding (-1, with a garbage parent) and so is every node below a padded one."""
    parents = np.array([[rng.integers(-1, i) if i else -1 for i in range(nodes)] for _ in range(batch)], dtype=np.int64)
    draft = rng.integers(0, vocab, size=(batch, nodes))
    padded = rng.random((batch, nodes)) < padding
    for i in range(nodes):  # parents come first, so one pass settles every descendant
        below_padding = (parents[:, i] >= 0) & padded[np.arange(batch), np.maximum(parents[:, i], 0)]
        padded[:, i] |= below_padding
    draft = np.where(padded, -1, draft)
    parents = np.where(padded, rng.integers(-5, nodes + 5, size=(batch, nodes)), parents)  # ignored
    return draft, parents


def insert_padding(
    rng: np.random.Generator, draft: np.ndarray, parents: np.ndarray, *per_node: np.ndarray, filler=np.nan
):
    """Insert one padding node per row at a random index (0..N), renumbering the nodes after it.

    per_node: arrays [B, N+1, ...] indexed like target_logits (index i+1 for node i) or [B, N, ...] like
    draft_probs; the inserted row gets `filler` (it must be ignored). Returns (draft, parents, *per_node)
    with N + 1 nodes."""
    batch, nodes = draft.shape
    where = rng.integers(0, nodes + 1, size=batch)
    old = np.arange(nodes)
    new_index = old[None, :] + (old[None, :] >= where[:, None])  # [B, N]
    rows = np.arange(batch)[:, None]
    new_draft = np.full((batch, nodes + 1), -1, dtype=np.int64)
    new_parents = np.full((batch, nodes + 1), 3 * nodes + 7, dtype=np.int64)  # garbage for the padding
    new_draft[rows, new_index] = draft
    remapped = np.where(parents >= 0, parents + (parents >= where[:, None]), parents)
    new_parents[rows, new_index] = remapped
    out = [new_draft, new_parents]
    for array in per_node:
        offset = array.shape[1] - nodes  # 1 for logits-like arrays, 0 for q-like ones
        grown = np.full((batch, nodes + 1 + offset, *array.shape[2:]), filler, dtype=array.dtype)
        grown[:, :offset] = array[:, :offset]
        grown[rows, new_index + offset] = array[:, offset:]
        out.append(grown)
    return tuple(out)


def reference_argmax_walk(args: dict) -> tuple[list[list[int]], list[int]]:
    """The SPEC §8 argmax walk of every row, one `sv.sample` call per step with seed s_b + depth:
    (the accepted nodes of each row, the token committed after them)."""
    draft = args["draft_tokens"].to(torch.int64)
    parents = args["parents"].to(torch.int64)
    batch, nodes = draft.shape
    logits = args["target_logits"].reshape(batch, nodes + 1, -1)
    masks = args.get("token_bitmasks")
    seeds = per_row_seeds(args["seed"], batch)

    def per_row(name, b):
        return args[name][b : b + 1] if isinstance(args.get(name), torch.Tensor) else args.get(name)

    paths, tokens = [], []
    for b in range(batch):
        current, path = -1, []
        while True:
            depth = len(path)
            y = int(
                sv.sample(
                    logits[b, current + 1][None],
                    per_row("temperature", b),
                    per_row("top_k", b),
                    per_row("top_p", b),
                    seeds[b] + depth,
                    min_p=per_row("min_p", b),
                    token_bitmask=None if masks is None else masks[b, current + 1][None],
                )[0]
            )
            children = [i for i in range(nodes) if draft[b, i] >= 0 and parents[b, i] == current]
            match = [i for i in children if draft[b, i] == y]
            if not match:
                paths.append(path)
                tokens.append(y)
                break
            current = match[0]
            path.append(current)
    return paths, tokens
