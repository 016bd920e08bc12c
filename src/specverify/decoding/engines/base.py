"""The language-model protocol the decoding loops need, and the input checks every engine shares.

A `LanguageModel` opens `Session`s: one per generation, holding a batch of B token contexts (row b is
request b) and whatever cache makes extending them cheap. The loop needs only two operations:
`extend` appends tokens to every row and returns the logits at the appended positions, and `truncate`
rolls rows back to shorter contexts (dropping rejected draft tokens). A user brings another model by
implementing these two methods (`hf.HFLanguageModel` wraps any transformers causal LM with a KV cache,
`llamacpp.LlamaCppModel` runs GGUF files on llama.cpp).
Tree drafts (SPEC §8) need a `TreeSession`: `extend_tree` scores the root and every node of a draft tree
in one forward, and `keep_path` then keeps only the accepted path in the cache; `hf.HFSession` is one.
A model may also say how many positions it can attend over (`max_context`); the loops then refuse, before
any decoding, a request whose prompt plus max_tokens does not fit (`check_context`; `specverify generate`
applies the same rule before the weights load, `loading.check_prompts_fit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ...contract import PAD


class Session(Protocol):
    """B token contexts and their cache. `lengths`: int64 [B], the context length of each row."""

    lengths: torch.Tensor

    def extend(self, tokens: torch.Tensor, *, return_logits: bool = True) -> torch.Tensor | None:
        """Append the tokens of each row; -1 pads the end of a row (appends nothing).

        tokens: int64 [B, T] -> logits float [B, T, V]: position t scores the token after tokens[:, t]
        (rows of padding positions hold finite values to be ignored); None when return_logits is False.
        """
        ...

    def truncate(self, lengths: torch.Tensor) -> None:
        """Keep the first lengths[b] tokens of row b's context. lengths: int [B], each <= the current length."""
        ...


class TreeSession(Session, Protocol):
    """A session that can score a draft tree in one forward (SPEC §8's layout) and keep its accepted path."""

    def extend_tree(self, root: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Append each row's root (its last committed token) and score the tree hanging below it.

        root: int64 [B, 1] (-1: the row appends nothing and has no nodes); tokens: int64 [B, N], -1 =
        padding anywhere; parents: int64 [B, N], -1 = a child of the root, else an earlier present node.
        Returns logits float [B, N+1, V]: index 0 after the root, index i+1 after the path root -> node i
        (as `tree_acceptance_sampler` takes them). The root joins the context; the nodes wait for `keep_path`.
        The tree's values are the verifier's to check (SPEC §8, validate=True): a node the verifier's walk
        cannot reach (id out of range, parent absent or not earlier) is scored as padding, not refused.
        """
        ...

    def keep_path(self, path: torch.Tensor, path_length: torch.Tensor) -> None:
        """Append the accepted nodes path[b, :path_length[b]] of the last `extend_tree` to the context and
        drop the other nodes. path: int [B, N] (-1 padded); path_length: int [B]."""
        ...


class LanguageModel(Protocol):
    """A causal language model over `vocab_size` tokens. Optionally `max_context`: the most positions a
    context may hold (prompt plus generated tokens), or None for no limit (the same when absent)."""

    vocab_size: int

    def session(self, batch_size: int) -> Session:
        """A new, empty batch of `batch_size` contexts."""
        ...


class ContextOverflow(ValueError):
    """A request's prompt plus max_tokens exceeds the model's context."""


def check_context(model: LanguageModel, prompts, max_tokens: Sequence[int]) -> None:
    """Raise ContextOverflow when a prompt's length plus max_tokens exceeds model.max_context
    (`check_context_limit`; no limit when the model states none)."""
    check_context_limit(getattr(model, "max_context", None), prompts, max_tokens)


def check_context_limit(
    limit: int | None, prompts, max_tokens: Sequence[int], origins: Sequence[str] | None = None
) -> None:
    """Raise ContextOverflow when a prompt's length plus max_tokens exceeds limit positions (None: no limit;
    a row's last generated token is never fed to the model, but a context of prompt + max_tokens must fit,
    as in vLLM's max_model_len). Nothing is truncated: truncating a prompt silently changes the answer.

    prompts: B token-id lists; max_tokens: B ints >= 0; origins: where each row came from, to begin its
    message as every error of a request does ("line 3" of a requests file: `Request.origin`; "" for a prompt
    given alone); without them the message ends "(at row i)", as the library's errors do (SPEC §6).
    """
    if limit is None:
        return
    for row, (prompt, budget) in enumerate(zip(prompts, max_tokens)):
        if len(prompt) + budget > limit:
            where = f" (at row {row})" if origins is None else ""
            raise ContextOverflow(
                (f"{origins[row]}: " if origins and origins[row] else "")
                + f"prompt ({len(prompt)} tokens) + max_tokens ({budget}) = {len(prompt) + budget} exceeds the "
                f"model's context of {limit} tokens{where}; shorten the prompt or lower max_tokens"
            )


def real_token_rows(tokens: torch.Tensor, batch_size: int) -> list[list[int]]:
    """Validate `Session.extend` input, int [B, T] with -1 only as right padding -> each row's real tokens.

    The rules are checked on the host lists (a one-token step is a handful of Python operations, not
    several tensor ops)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dim() != 2:
        raise TypeError(f"tokens must be an integer tensor [B, T] (got {tokens!r:.80})")
    if tokens.shape[0] != batch_size:
        raise ValueError(f"tokens must have B = {batch_size} rows (got {tokens.shape[0]})")
    values = tokens.tolist()
    smallest = min((min(row) for row in values if row), default=PAD)
    if smallest < PAD:
        raise ValueError(f"tokens must be ids >= 0 or -1 padding (got {smallest})")
    rows = []
    for row in values:
        real = row.index(PAD) if PAD in row else len(row)
        if any(t != PAD for t in row[real:]):
            raise ValueError("tokens may hold -1 only as right padding (a real token follows a -1)")
        rows.append(row[:real])
    return rows


def check_extension(tokens: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Validate `Session.extend` input (`real_token_rows`). Returns the real-token mask bool [B, T]."""
    real_token_rows(tokens, batch_size)
    return tokens != PAD


def check_truncation(lengths: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Validate `Session.truncate` input against the current lengths [B]. Returns int64 [B]."""
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    if lengths.shape != current.shape:
        raise ValueError(f"lengths must have shape {list(current.shape)} (got {list(lengths.shape)})")
    bad = (lengths < 0) | (lengths > current)
    if bad.any():
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"lengths must be in [0, current length] (got {int(lengths[row])} at row {row}, "
            f"current length {int(current[row])})"
        )
    return lengths
