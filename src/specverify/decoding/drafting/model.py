"""A draft model: a second, cheaper language model with the target's tokenizer drafts k tokens
autoregressively (argmax, or sampled with its distributions), its KV cache following the committed contexts."""

from __future__ import annotations

from collections.abc import Sequence

import torch

import specverify

from ..engines.base import LanguageModel, Session
from ..params import RowParams
from .base import Draft, common_prefix, draw_draft, pad_rows


class ModelDrafter:
    """A second, cheaper language model with the target's tokenizer drafts k tokens autoregressively.

    With sampled=False it proposes its argmax; with sampled=True it samples each token from its own
    distribution truncated like the target's (`specverify.truncated_probs` with the target's params) on
    the drafters' own stream (`draw_draft`), and returns those distributions as `draft_probs_full`. Its KV cache
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
                tokens.append(draw_draft(probs[-1], seeds + j))
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
