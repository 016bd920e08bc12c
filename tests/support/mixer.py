"""The keyed uniforms of SPEC §4 re-implemented with Python ints (no torch), and their inverse.

Written from the documentation of src/specverify/rng.py, not from its tensors:
- `mix64` is SplitMix64's finaliser on uint64:  x ^= x >> 30; x *= 0xBF58476D1CE4E5B9;
  x ^= x >> 27; x *= 0x94D049BB133111EB; x ^= x >> 31  (all mod 2**64, logical shifts);
- a stream's salt is `mix64(stream + 0xD1B54A32D192ED03)`;
- the 64 bits of (key, stream) are `mix64(mix64(key) ^ salt(stream))`;
- the uniform is the top 53 of those bits times 2**-53, so it lies in [0, 1) on a grid of 2**-53.

Every step is a bijection on 64-bit ints (an xor with a right shift of itself, a multiplication by an odd
constant, an xor with a constant), so the whole map key -> bits can be run backwards: `key_for_bits`
gives the one key whose bits are a chosen value, which is how the tests build a key whose uniform is
exactly 0 (bits below 2**11) or exactly 1 - 2**-53 (bits at 2**64 - 2**11 and above).
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB
STREAM_SALT = 0xD1B54A32D192ED03
#: The streams of the verifier (SPEC §4): target sample and bonus, accept coin, residual draw.
STREAM_TARGET, STREAM_ACCEPT, STREAM_RESIDUAL = 0, 1, 2
#: The uniforms are multiples of this.
ULP = 2.0**-53


def mix64(x: int) -> int:
    """SplitMix64's finaliser on a uint64."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * MIX_1) & MASK64
    x = ((x ^ (x >> 27)) * MIX_2) & MASK64
    return x ^ (x >> 31)


def _undo_xorshift(y: int, shift: int) -> int:
    """The x with x ^ (x >> shift) == y: each pass fixes `shift` more of the top bits."""
    x = y
    for _ in range(64 // shift + 1):
        x = y ^ (x >> shift)
    return x


def unmix64(y: int) -> int:
    """The inverse of mix64: unmix64(mix64(x)) == x for every uint64 x."""
    x = _undo_xorshift(y & MASK64, 31)
    x = (x * pow(MIX_2, -1, 1 << 64)) & MASK64
    x = _undo_xorshift(x, 27)
    x = (x * pow(MIX_1, -1, 1 << 64)) & MASK64
    return _undo_xorshift(x, 30)


def salt(stream: int) -> int:
    return mix64(stream + STREAM_SALT)


def keyed_bits(key: int, stream: int) -> int:
    """The 64 bits of (key, stream); key is read as a uint64 (negative ints as their two's complement)."""
    return mix64(mix64(key) ^ salt(stream))


def keyed_uniform(key: int, stream: int) -> float:
    """The uniform of (key, stream) in [0, 1): the top 53 bits times 2**-53 (exact in float64)."""
    return (keyed_bits(key, stream) >> 11) * ULP


def key_for_bits(bits: int, stream: int) -> int:
    """The uint64 key whose bits on `stream` are `bits` (the mixer run backwards)."""
    return unmix64(unmix64(bits) ^ salt(stream))


def key_for_uniform(numerator: int, stream: int) -> int:
    """A uint64 key whose uniform on `stream` is exactly numerator * 2**-53 (0 <= numerator < 2**53)."""
    return key_for_bits(numerator << 11, stream)
