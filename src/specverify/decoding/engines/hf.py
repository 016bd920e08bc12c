"""Any transformers causal LM as a `LanguageModel` (`base`): a KV cache shared by the batch, rolled back
exactly, that also scores draft trees in one forward (`TreeSession`, with `tree_attention`)."""

from __future__ import annotations

from pathlib import Path

import torch

from .base import check_extension, check_truncation
from .tree_attention import path_slots, tree_ancestry, tree_attention_mask, tree_nodes, tree_positions


class HFLanguageModel:
    """Any transformers causal LM (`model(input_ids, attention_mask, position_ids, cache=...)`), in eval mode."""

    def __init__(self, model: torch.nn.Module, cache_folder: Path | None = None):
        self.model = model.eval()
        #: A folder where measurements of this model may be kept across processes (its entry in the model
        #: cache, see `cost_cache`), or None.
        self.cache_folder = cache_folder
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        #: The positions the model was trained on (config.max_position_embeddings; None if it has none).
        self.max_context = getattr(model.config, "max_position_embeddings", None)

    def session(self, batch_size: int) -> HFSession:
        return HFSession(self.model, self.vocab_size, batch_size)


class HFSession:
    """A transformers `DynamicCache` shared by B rows, rolled back exactly.

    The cache has one slot column per appended position for all rows; `_valid`: bool [B, L] says which
    slots belong to each row's context. Rows roll back by different amounts, so a row's dropped slots
    may sit below another row's kept ones: they stay as masked holes (attention never reads them) until
    every row has dropped them, when `DynamicCache.crop` frees the trailing columns. With B = 1 there are
    never holes and the cache is cropped exactly. Each row's tokens carry their own position ids (their
    index in that row's context), so holes do not shift positions. Full-attention caches only (Llama,
    SmolLM2, Qwen, ...): transformers cannot roll back sliding-window layers once their window is full.

    A tree step (`extend_tree`) appends a block [root, N nodes] with a custom 4D attention mask; the nodes'
    slots stay outside every row's context until `keep_path` moves each row's accepted nodes to the front of
    the block (in depth order) and frees the rest: the cache then holds what a plain forward of the committed
    context would. An `extend` or `truncate` before `keep_path` drops the whole tree (as an empty path).
    Needs an attention that takes 4D masks (eager, SDPA; not flash-attention).
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, batch_size: int):
        from transformers import DynamicCache

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
        self._model = model
        self._vocab_size = vocab_size
        self._device = next(model.parameters()).device
        self._cache = DynamicCache(config=model.config)
        self._valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=self._device)
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=self._device)
        #: The last extend_tree's nodes until keep_path: (first node slot, parents int64 [B, N], present [B, N]).
        self._tree: tuple[int, torch.Tensor, torch.Tensor] | None = None

    @torch.inference_mode()
    def extend(self, tokens: torch.Tensor, *, return_logits: bool = True) -> torch.Tensor | None:
        self._drop_tree()
        tokens = tokens.to(self._device)
        real = check_extension(tokens, self._valid.shape[0])
        width = tokens.shape[1]
        if width == 0:
            return (
                tokens.new_zeros(tokens.shape[0], 0, self._vocab_size, dtype=torch.float32) if return_logits else None
            )
        positions = self.lengths[:, None] + torch.arange(width, device=self._device)
        # The new block is all visible while it is computed: a row's real tokens precede its padding, so
        # causality already hides the padding from them, and padding never sees an empty row (no NaN).
        mask = None
        if not bool(self._valid.all()):
            mask = torch.cat([self._valid, torch.ones_like(real)], dim=1).long()
        out = self._model(
            input_ids=tokens.clamp_min(0),
            attention_mask=mask,
            position_ids=positions,
            cache=self._cache,
            use_cache=True,
            logits_to_keep=0 if return_logits else 1,
        )
        self._valid = torch.cat([self._valid, real], dim=1)
        self.lengths = self.lengths + real.sum(1)
        self._crop_trailing()
        return out.logits if return_logits else None

    @torch.inference_mode()
    def extend_tree(self, root: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        self._drop_tree()
        root, tokens, parents = (t.to(self._device) for t in (root, tokens, parents))
        has_root = check_extension(root, self._valid.shape[0])
        if root.shape[1] != 1:
            raise ValueError(f"root must be [B, 1], one last committed token per row (got {list(root.shape)})")
        present = tree_nodes(tokens, parents, has_root, self._vocab_size)
        parents = parents.to(torch.int64)
        ancestry = tree_ancestry(parents, present)
        out = self._model(
            input_ids=torch.cat([root.clamp_min(0), torch.where(present, tokens, 0)], dim=1),
            attention_mask=tree_attention_mask(self._valid, ancestry, self._cache_dtype()),
            position_ids=tree_positions(self.lengths, ancestry),
            cache=self._cache,
            use_cache=True,
            logits_to_keep=0,
        )
        self._tree = (self._valid.shape[1] + 1, parents, present)
        self._valid = torch.cat([self._valid, has_root, torch.zeros_like(present)], dim=1)
        self.lengths = self.lengths + has_root[:, 0]
        return out.logits

    @torch.inference_mode()
    def keep_path(self, path: torch.Tensor, path_length: torch.Tensor) -> None:
        if self._tree is None:
            raise ValueError("keep_path needs a tree: call extend_tree first (once per tree)")
        start, parents, present = self._tree
        order = path_slots(path, path_length, parents, present)
        index = order[:, None, :, None]
        for layer in self._cache.layers:
            for name in ("keys", "values"):
                block = getattr(layer, name)[:, :, start:]
                block.copy_(block.gather(2, index.expand_as(block)))
        path_length = torch.as_tensor(path_length, device=self._device)
        self._valid[:, start:] = torch.arange(order.shape[1], device=self._device) < path_length[:, None]
        self.lengths = self.lengths + path_length
        self._tree = None
        self._crop_trailing()

    def truncate(self, lengths: torch.Tensor) -> None:
        self._drop_tree()
        lengths = check_truncation(lengths.to(self._device), self.lengths)
        rank = self._valid.long().cumsum(1)
        self._valid = self._valid & (rank <= lengths[:, None])
        self.lengths = lengths
        self._crop_trailing()

    def _drop_tree(self) -> None:
        """Forget the nodes of an extend_tree not followed by keep_path (their slots are outside every context)."""
        if self._tree is not None:
            self._tree = None
            self._crop_trailing()

    def _cache_dtype(self) -> torch.dtype:
        """The dtype attention runs in (the model's floating-point parameters)."""
        return next(p.dtype for p in self._model.parameters() if p.dtype.is_floating_point)

    def _crop_trailing(self) -> None:
        """Free the trailing slot columns that no row uses."""
        used = self._valid.any(0).nonzero()
        keep = int(used[-1, 0]) + 1 if used.numel() else 0
        drop = self._valid.shape[1] - keep
        if drop:
            self._cache.crop(-drop)
            self._valid = self._valid[:, :keep]
