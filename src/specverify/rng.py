"""Keyed counter-based randomness (SPEC §4): the only place where randomness is made.

Every draw is a pure function of a 64-bit key and a stream number, so there is no generator state,
nothing shared between calls, and a row's draws never depend on its batch neighbours. Keys are held in
int64 tensors and read as their uint64 bit pattern; all arithmetic wraps modulo 2**64.
"""

from __future__ import annotations

import torch

from .contract import MASK64, ROW_STRIDE

#: Stream of the target sample y_j (SPEC §3.1) and of every bonus token.
STREAM_TARGET = 0
#: Stream of the accept coin u of the sampled-draft test (SPEC §3.2).
STREAM_ACCEPT = 1
#: Stream of the recovery draw from the residual distribution (SPEC §3.2).
STREAM_RESIDUAL = 2
#: First stream of the accept coins of later siblings in a sampled tree walk (SPEC §8): the child of
#: rank r >= 1 uses stream STREAM_SIBLING + r - 1 (rank 0 uses STREAM_ACCEPT, as a chain does).
STREAM_SIBLING = 3
#: First stream of a drafter's own draws (SPEC §4): a sampled draft for the token at key k is drawn on
#: (k, STREAM_DRAFT + d), d the draw's index among its siblings (0 for a chain), far from every stream the
#: verifier uses.
STREAM_DRAFT = 1 << 32

#: A request keys at most this many tokens apart from its base (SPEC §4): request_seed(s, n) needs n below it.
KEYED_TOKENS = 1 << 40
#: Base seeds closer than this (modulo 2**64) never share a key over KEYED_TOKENS tokens (SPEC §4): the
#: smallest d > 0 with d * ROW_STRIDE within KEYED_TOKENS of a multiple of 2**64 is F_35 = 9,227,465.
SEPARATED_SEEDS = 9_227_465

#: Up to this many keys on the CPU, keyed_uniform_read mixes them as Python ints (one read, one write):
#: the same bits as the ~20 torch ops of keyed_uniform, which cost more at such sizes.
HOST_KEYS = 64
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB
_STREAM_SALT = 0xD1B54A32D192ED03


def as_int64_bits(value: int) -> int:
    """The int64 whose bit pattern is `value` modulo 2**64 (uint64 semantics for Python ints)."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right_logical(x: torch.Tensor, bits: int) -> torch.Tensor:
    """`x >> bits` on the uint64 bit pattern of an int64 tensor (torch's `>>` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser: a bijective 64-bit mixer with full avalanche. x: int64 tensor, any shape."""
    x = (x ^ _shift_right_logical(x, 30)) * as_int64_bits(_MIX_1)
    x = (x ^ _shift_right_logical(x, 27)) * as_int64_bits(_MIX_2)
    return x ^ _shift_right_logical(x, 31)


def _mix64_int(x: int) -> int:
    """mix64 on a Python int (uint64 in, uint64 out); used for per-stream salts."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * _MIX_1) & MASK64
    x = ((x ^ (x >> 27)) * _MIX_2) & MASK64
    return x ^ (x >> 31)


def sibling_stream(rank: int) -> int:
    """The stream of the accept coin of the child of rank `rank` (0, 1, ...) in a sampled tree walk."""
    return STREAM_ACCEPT if rank == 0 else STREAM_SIBLING + rank - 1


def stream_salt(stream: int) -> int:
    """The salt of a stream, as a uint64 int: `mix64(stream + 0xD1B54A32D192ED03)`."""
    return _mix64_int(stream + _STREAM_SALT)


def keyed_bits(keys: torch.Tensor, stream: int) -> torch.Tensor:
    """64 random bits per key: `mix64(mix64(key) ^ salt(stream))`. keys: int64 [...] -> int64 [...]."""
    return mix64(mix64(keys) ^ as_int64_bits(stream_salt(stream)))


def keyed_uniform(keys: torch.Tensor, stream: int) -> torch.Tensor:
    """One uniform in [0, 1) per key and stream, with 53 random bits.

    keys: int64 (or any integer dtype) tensor [...], read as uint64 bit patterns.
    stream: int >= 0; STREAM_TARGET, STREAM_ACCEPT and STREAM_RESIDUAL are the ones the verifier uses.
    Returns float64 [...] on the device of `keys`. Pure: the same key and stream give the same value.
    """
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"keys must be an integer torch.Tensor (got {type(keys).__name__})")
    if keys.dtype.is_floating_point or keys.dtype.is_complex or keys.dtype == torch.bool:
        raise TypeError(f"keys must be an integer tensor (got dtype {keys.dtype})")
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(f"stream must be an int (got {type(stream).__name__})")
    if stream < 0:
        raise ValueError(f"stream must be an int >= 0 (got {stream})")
    bits = keyed_bits(keys.to(torch.int64), stream)
    return _shift_right_logical(bits, 11).to(torch.float64) * 2.0**-53


def _uniform_of(key: int, salt: int) -> float:
    """keyed_uniform of one key (any int, read as uint64) with a stream's salt, on Python ints."""
    return (_mix64_int(_mix64_int(key) ^ salt) >> 11) * 2.0**-53


def keyed_uniform_read(keys: torch.Tensor, stream: int) -> torch.Tensor:
    """keyed_uniform for callers that may read the keys to the host (calls that check values): a small CPU
    tensor of keys (<= HOST_KEYS) is read once and mixed as Python ints, the same values bit for bit.
    keys: int64 [...] (checked keys, a checked stream) -> float64 [...]."""
    if not keys.is_cpu or keys.numel() > HOST_KEYS:
        return keyed_uniform(keys, stream)
    salt = stream_salt(stream)
    values = [_uniform_of(key, salt) for key in keys.reshape(-1).tolist()]
    return torch.tensor(values, dtype=torch.float64).view(keys.shape)


def row_seeds_read(seed: int | torch.Tensor, shared: bool, rows: int) -> list[int]:
    """per_row_seeds read to the host: each row's seed s_b as an int (its int64 bit pattern). seed: an int or
    int64 [] or [1] (shared) or int64 [rows]."""
    if not shared:
        return seed.tolist()
    first = as_int64_bits(seed if isinstance(seed, int) else int(seed))
    return [as_int64_bits(first + row * ROW_STRIDE) for row in range(rows)]


def row_uniforms_read(seeds: list[int], num_positions: int, stream: int) -> list[float]:
    """keyed_uniform(row_keys(seeds, num_positions), stream) on the host, flattened row by row: the uniform
    of key s_b + j at index b * num_positions + j."""
    salt = stream_salt(stream)
    return [_uniform_of(seed + position, salt) for seed in seeds for position in range(num_positions)]


def request_seed(
    base_seed: int | torch.Tensor, tokens_generated: int | torch.Tensor, *, validate: bool = True
) -> int | torch.Tensor:
    """A request's key for its n-th generated token (SPEC §4): `base_seed * ROW_STRIDE + n` (mod 2**64).

    Pass it as the verifier's (or `sample`'s) per-request seed at each step: the verifier keys draft position
    j with seed + j, which is then the request's key for token n + j, so the tokens do not depend on the
    drafter, K or the batch, and plain and speculative decoding agree. Two base seeds closer than
    SEPARATED_SEEDS (consecutive seeds, vLLM's n > 1 children seed + i) never share a key over KEYED_TOKENS
    tokens, so their draws are independent.

    base_seed: an int in [-2**63, 2**64), or an integer tensor [...] (read as uint64 bit patterns).
    tokens_generated: n, an int in [0, 2**40), or an integer tensor broadcastable with base_seed (its
    values are checked only with validate=True, which reads them to the host).
    Returns the key's int64 bit pattern: an int for two ints, else an int64 tensor of the broadcast shape
    on the tensors' device.
    """
    base_is_tensor = _check_key_part("base_seed", base_seed, -(1 << 63), 1 << 64, "in [-2**63, 2**64)")
    count_is_tensor = _check_key_part("tokens_generated", tokens_generated, 0, KEYED_TOKENS, "in [0, 2**40)")
    if not (base_is_tensor or count_is_tensor):
        return as_int64_bits(base_seed * ROW_STRIDE + tokens_generated)
    if base_is_tensor and count_is_tensor and base_seed.device != tokens_generated.device:
        raise ValueError(
            f"base_seed and tokens_generated must be on one device (got {base_seed.device} and {tokens_generated.device})"
        )
    if validate and count_is_tensor and tokens_generated.numel():
        low, high = int(tokens_generated.min()), int(tokens_generated.max())
        if low < 0 or high >= KEYED_TOKENS:
            raise ValueError(f"tokens_generated must be in [0, 2**40) (got {low if low < 0 else high})")
    count = tokens_generated.to(torch.int64) if count_is_tensor else tokens_generated
    if base_is_tensor:
        return base_seed.to(torch.int64) * as_int64_bits(ROW_STRIDE) + count  # int64 arithmetic wraps mod 2**64
    return count + as_int64_bits(base_seed * ROW_STRIDE)


def _check_key_part(name: str, value: object, low: int, high: int, rule: str) -> bool:
    """request_seed's argument `name` is an int in [low, high) or an integer tensor -> whether a tensor."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{name} must be an int or an integer tensor (got dtype {value.dtype})")
        return True
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or an integer tensor (got {type(value).__name__})")
    if not low <= value < high:
        raise ValueError(f"{name} must be an int {rule} (got {value})")
    return False


def row_keys(seed: torch.Tensor, num_positions: int) -> torch.Tensor:
    """Keys of every (row, position): `s_b + j`. seed: int64 [B] per-row seeds -> int64 [B, num_positions]."""
    positions = torch.arange(num_positions, dtype=torch.int64, device=seed.device)
    return seed[:, None] + positions


def spread_shared_seed(seed: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Per-row seeds for one seed shared by the batch: `s + b * ROW_STRIDE` (mod 2**64).

    seed: int64 [] or [1] -> int64 [B] on the same device (no host read).
    """
    rows = torch.arange(batch_size, dtype=torch.int64, device=seed.device)
    return seed + rows * as_int64_bits(ROW_STRIDE)


def seed_tensor(seed: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    """An int seed as int64 [] on the device (its uint64 bit pattern), made by a fill whose value is a kernel
    argument: no host-to-device copy, so a call with an int seed can be captured in a CUDA graph (where the
    value is then part of the graph: pass a tensor seed to change it between replays). A tensor is returned
    as it is."""
    if isinstance(seed, int):
        return torch.full((), as_int64_bits(seed), dtype=torch.int64, device=device)
    return seed


def per_row_seeds(seed: int | torch.Tensor, shared: bool, rows: int, device: torch.device) -> torch.Tensor:
    """Each row's seed s_b as int64 [rows]: a shared seed (int, or int64 [] or [1]) is spread by row
    (SPEC §4)."""
    seed = seed_tensor(seed, device)
    return spread_shared_seed(seed, rows) if shared else seed
