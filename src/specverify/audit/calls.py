"""One batched call of a verifier on a scenario's rows, and what it committed: the records that chain
scenarios (scenarios.py) and tree scenarios (trees.py) share.

A scenario kind provides `draw(rows, rng)` (the drafts, int64 [N, K]), `arguments(drafts, seeds, device)`
(the call's positional and optional arguments) and `observe`, built on `batched_call` below.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from ..bitmask import pack_bitmask
from .verifier import Verifier


@dataclass(frozen=True)
class Observation:
    """What one batched call committed. first: int64 [N], the first rejection (a tree's path length);
    committed: int64 [N, K+1], the token committed at j (a tree's index j) by rows that reached it, PAD
    elsewhere; problems: contract breaks (then no committed)."""

    first: np.ndarray
    committed: np.ndarray
    seconds: float
    problems: tuple[str, ...]


def call_rng(scenario, seed: int) -> np.random.Generator:
    """The same per-scenario stream in the default and quick audits (keyed by name, not by position)."""
    return np.random.default_rng([seed, zlib.crc32(scenario.name.encode())])


def batched_call(
    verifier: Verifier, scenario, rows: int, seed: int, device: str
) -> tuple[np.ndarray, tuple[np.ndarray, ...], float]:
    """Draw the drafts (scenario.draw) and a seed per row, make the one batched call with
    scenario.arguments -> (drafts int64 [N, K], the verifier's three outputs as arrays, seconds)."""
    rng = call_rng(scenario, seed)
    drafts = scenario.draw(rows, rng)
    seeds = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=rows, dtype=np.int64, endpoint=True)
    positional, optional = scenario.arguments(drafts, seeds, device)
    start = time.perf_counter()
    outputs = tuple(out.numpy() for out in verifier(*positional, **optional))
    return drafts, outputs, time.perf_counter() - start


def shape_problems(outputs: dict[str, tuple[np.ndarray, tuple[int, ...]]]) -> list[str]:
    """One problem per output whose shape is not the expected one. outputs: name -> (array, shape)."""
    return [
        f"{name} has shape {list(out.shape)}, expected {list(shape)}"
        for name, (out, shape) in outputs.items()
        if out.shape != shape
    ]


def row_problems(bad: np.ndarray, what: str) -> list[str]:
    """[] when no row is bad, else one problem saying how many rows are and which comes first. bad: bool [N]."""
    if not bad.any():
        return []
    return [f"{what} in {int(bad.sum())} rows (first: row {int(np.flatnonzero(bad)[0])})"]


def min_p_and_mask(min_p: float, allowed: np.ndarray | None, rows: int, device: str) -> dict[str, torch.Tensor]:
    """The optional arguments every scenario kind passes the same way: min_p float32 [rows] where it is on
    (> 0), and the allowed set (bool [P, V], None for no mask) as packed token_bitmasks int32
    [rows, P, ceil(V/32)], one mask per position repeated for every row."""
    optional = {}
    if min_p > 0:
        optional["min_p"] = torch.full((rows,), min_p, dtype=torch.float32, device=device)
    if allowed is not None:
        masks = pack_bitmask(torch.from_numpy(allowed))
        optional["token_bitmasks"] = masks.to(device)[None].expand(rows, *masks.shape).contiguous()
    return optional
