"""specverify: lossless, fast verification of speculative-decoding drafts (SPEC.md)."""

from .bitmask import pack_bitmask, unpack_bitmask
from .commit import acceptance_counts, committed_tokens, tree_committed_tokens
from .family import (
    AcceptanceSampler,
    compute_synthetic_acceptance_base_rate,
    greedy_acceptance_sampler,
    synthetic_acceptance_sampler,
)
from .rng import keyed_uniform, request_seed
from .sampler import stochastic_acceptance_sampler
from .tree import tree_acceptance_sampler
from .truncation import sample, truncated_probs

__all__ = [
    "AcceptanceSampler",
    "acceptance_counts",
    "committed_tokens",
    "compute_synthetic_acceptance_base_rate",
    "greedy_acceptance_sampler",
    "keyed_uniform",
    "pack_bitmask",
    "request_seed",
    "sample",
    "stochastic_acceptance_sampler",
    "synthetic_acceptance_sampler",
    "tree_acceptance_sampler",
    "tree_committed_tokens",
    "truncated_probs",
    "unpack_bitmask",
]
