"""Each request's seed and min-p, row by row, for one vLLM step (SPEC §4 keys, as our own loop keys them).

Row b's draw for its n-th generated token is keyed by `specverify.request_seed(base_b, n)` (n: tokens the
request has generated before this step, its `output_token_ids` in the model runner), so in argmax mode the
committed tokens equal plain sampling's whatever the draft, K or batch, and requests whose seeds are close
(vLLM's `n > 1` children get seed + i) never share a key. `base_b` is the request's own seed; a request
without one gets a seed derived once from its request id and the engine's seed (stable across the
workers of a tensor-parallel group, which must draw alike). Nothing here imports vLLM.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ... import request_seed


def as_int64(value: int) -> int:
    """An int of any size as the int64 with the same low 64 bits (uint64 semantics, SPEC §4)."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def derived_seed(request_id: str, engine_seed: int) -> int:
    """The base seed of a request that gave none: 64 bits of blake2b(engine seed, request id), as int64."""
    digest = hashlib.blake2b(f"{engine_seed}\x00{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def base_seed(request_id: str, seed: int | None, engine_seed: int) -> int:
    """The key base of a request (int64): its own seed, else one derived from its id (`derived_seed`)."""
    if seed is None:
        return derived_seed(request_id, engine_seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None (got {type(seed).__name__} {seed!r} for request {request_id!r})")
    return as_int64(seed)


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor [B] on `device`. For an accelerator it is copied from pinned memory, so the copy does not
    synchronise the host with the device (torch's caching host allocator holds the pinned block until the copy
    has run); on the CPU it is returned as it is."""
    if device.type == "cpu":
        return values
    return values.pin_memory().to(device, non_blocking=True)


class RequestRows:
    """Per-request constants (base seed, min-p) cached by request id, and per step the rows' tensors.

    engine_seed: the engine's seed (vLLM's model_config.seed; 0 when None).
    """

    def __init__(self, engine_seed: int | None) -> None:
        self.engine_seed = 0 if engine_seed is None else int(engine_seed)
        self._known: dict[str, tuple[Any, int, float]] = {}  # request id -> (its params, base seed, min_p)

    def step(
        self, request_ids: Sequence[str], requests: Mapping[str, Any], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rows of one step: (seeds int64 [B] = request_seed(base, tokens generated so far), min_p float32 [B] or
        None when no row uses it). request_ids: the batch's B ids in row order; requests: id -> the model
        runner's state, with `.sampling_params` (seed, min_p) and `.output_token_ids`."""
        batch = len(request_ids)
        bases = np.empty(batch, dtype=np.int64)
        counts = np.empty(batch, dtype=np.int64)
        min_p = np.empty(batch, dtype=np.float32)
        known = self._known
        for row, request_id in enumerate(request_ids):
            state = requests[request_id]
            params = state.sampling_params
            entry = known.get(request_id)
            if entry is None or entry[0] is not params:
                entry = (params, base_seed(request_id, params.seed, self.engine_seed), float(params.min_p))
                known[request_id] = entry
            bases[row] = entry[1]
            min_p[row] = entry[2]
            counts[row] = len(state.output_token_ids)
        if len(known) > 2 * len(requests) + 64:  # forget finished requests now and then
            for request_id in [r for r in known if r not in requests]:
                del known[request_id]
        seeds = to_device(request_seed(torch.from_numpy(bases), torch.from_numpy(counts), validate=False), device)
        if not (min_p > 0).any():
            return seeds, None
        return seeds, to_device(torch.from_numpy(min_p), device)

    @staticmethod
    def warmup(batch: int, device: torch.device) -> tuple[torch.Tensor, None]:
        """Rows for vLLM's own warm-up calls of its samplers (dummy requests, output discarded): seed 0."""
        return torch.zeros(batch, dtype=torch.int64, device=device), None
