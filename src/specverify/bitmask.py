"""Packed int32 grammar masks (SPEC §5), in the layout xgrammar and llguidance fill.

Token v is allowed iff bit `v % 32` of word `v // 32` is set; bits past V are ignored.
"""

from __future__ import annotations

import torch

BITS_PER_WORD = 32


def num_words(vocab_size: int) -> int:
    """Words per packed mask: ceil(V / 32)."""
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def _bit_positions(device: torch.device) -> torch.Tensor:
    return torch.arange(BITS_PER_WORD, dtype=torch.int32, device=device)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed words to booleans. bitmask: int32 [..., ceil(V/32)] -> bool [..., V] (True = allowed)."""
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
        got = bitmask.dtype if isinstance(bitmask, torch.Tensor) else type(bitmask).__name__
        raise TypeError(f"bitmask must be an int32 tensor (got {got})")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int (got {type(vocab_size).__name__})")
    if vocab_size < 0:
        raise ValueError(f"vocab_size must be an int >= 0 (got {vocab_size})")
    words = bitmask.shape[-1] if bitmask.dim() else 0
    if bitmask.dim() == 0 or words != num_words(vocab_size):
        raise ValueError(
            f"bitmask must have ceil(vocab_size/32) = {num_words(vocab_size)} words in its last dim "
            f"(got shape {tuple(bitmask.shape)})"
        )
    bits = (bitmask.unsqueeze(-1) >> _bit_positions(bitmask.device)) & 1
    return bits.reshape(*bitmask.shape[:-1], words * BITS_PER_WORD)[..., :vocab_size].bool()


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """Booleans to packed words. allowed: bool [..., V] -> int32 [..., ceil(V/32)]; bits past V are 0."""
    if not isinstance(allowed, torch.Tensor) or allowed.dtype != torch.bool:
        got = allowed.dtype if isinstance(allowed, torch.Tensor) else type(allowed).__name__
        raise TypeError(f"allowed must be a bool tensor (got {got})")
    if allowed.dim() == 0:
        raise ValueError("allowed must have a vocabulary dimension (got a 0-d tensor)")
    vocab_size = allowed.shape[-1]
    padded = torch.zeros(
        *allowed.shape[:-1], num_words(vocab_size) * BITS_PER_WORD, dtype=torch.int64, device=allowed.device
    )
    padded[..., :vocab_size] = allowed
    words = (
        padded.reshape(*allowed.shape[:-1], num_words(vocab_size), BITS_PER_WORD)
        << _bit_positions(allowed.device).long()
    )
    packed = words.sum(-1)  # bits are disjoint, so the sum is the bitwise or; fits in 32 bits
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Disallowed tokens get -inf. logits: float [..., V]; bitmask: int32 [..., ceil(V/32)] -> new tensor."""
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    return logits.masked_fill(~allowed, float("-inf"))
