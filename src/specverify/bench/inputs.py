"""The benchmark's inputs: LLM-shaped logits with the realistic row mix, and a draft tree over them."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Batch:
    """One benchmark input: B requests with K drafts over V tokens, with the realistic row mix."""

    draft_tokens: torch.Tensor  # [B, K] int64
    target_logits: torch.Tensor  # [B*(K+1), V]
    temperature: torch.Tensor  # [B]
    top_k: torch.Tensor  # [B]
    top_p: torch.Tensor  # [B]
    seed: torch.Tensor  # [B]
    draft_probs: torch.Tensor  # [B, K, V]

    def to(self, device: torch.device) -> Batch:
        """The same batch with every tensor on `device`."""
        return Batch(**{field.name: getattr(self, field.name).to(device) for field in fields(self)})


def make_batch(batch: int, positions: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> Batch:
    """LLM-shaped logits (a few heavy head tokens over a long Gaussian tail); rows cycle through
    (T=0.8, top_k=50, top_p=0.9), (T=1, top_p=0.95) and greedy."""
    g = torch.Generator().manual_seed(seed)
    rows = batch * (positions + 1)
    logits = torch.randn(rows, vocab, generator=g) * 2.0
    head = torch.randint(0, vocab, (rows, 8), generator=g)
    logits.scatter_add_(1, head, torch.rand(rows, 8, generator=g) * 8 + 4)
    kind = torch.arange(batch) % 3
    draft_probs = torch.softmax(torch.randn(batch, positions, vocab, generator=g) * 2.0, dim=-1)
    return Batch(
        draft_tokens=torch.randint(0, vocab, (batch, positions), generator=g),
        target_logits=logits.to(dtype),
        temperature=torch.tensor([0.8, 1.0, 0.0])[kind],
        top_k=torch.tensor([50, -1, -1])[kind],
        top_p=torch.tensor([0.9, 0.95, 1.0])[kind],
        seed=torch.randint(0, 2**62, (batch,), generator=g),
        draft_probs=draft_probs,
    )


#: Children per level of the benchmark's draft tree: N = TREE_WIDTH * depth nodes.
TREE_WIDTH = 4


def make_tree(batch: Batch, depth: int, width: int = TREE_WIDTH) -> tuple[torch.Tensor, torch.Tensor]:
    """A draft tree per request for a Batch made with K = depth * width positions (so N + 1 logits rows per
    request): at each of `depth` levels, the `width` most likely target tokens after the level's parent,
    the first of them (the spine) being the parent of the next level (an EAGLE-style top-`width` expansion
    along the best path). Returns (draft_tokens [B, N], parents [B, N]), int64."""
    requests = batch.temperature.shape[0]
    nodes = depth * width
    logits = batch.target_logits.view(requests, nodes + 1, -1)
    spine = torch.arange(depth) * width  # the first node of each level
    parent_of_level = torch.cat([torch.tensor([-1]), spine[:-1]])
    tokens = logits[:, parent_of_level + 1].float().topk(width, dim=-1).indices  # [B, depth, width]
    parents = parent_of_level.repeat_interleave(width).expand(requests, nodes).contiguous()
    return tokens.reshape(requests, nodes), parents
