"""Counter-based coins a GPU kernel reproduces bit for bit, and the exponential race.

Philox4x32-10 exactly as Triton's `tl.philox`: key = the 64-bit request seed split into (lo, hi)
32-bit words, 10 rounds, first output word converted to a float32 in [0, 1) as Triton's
`uint_to_uniform_float` does. Counter words (c0, c1, c2, c3) = (token, position lo, position hi, 0),
where position is the index in the request's output of the token being sampled. A walk samples one
token per output position (it visits one node per depth, node u at position root + depth(u)), so no
coin is reused within a request, and the coins do not depend on which tree the drafter proposed:
a seeded request samples the same tokens under AR, chain and tree drafting wherever the target
rows agree, and repeats exactly whatever the drafter's caches hold.

Sampling x ~ p is the exponential race x = argmax_i p_i / E_i with E_i = -log(coin_i) (lowest index
on ties; tokens with p_i = 0 score -1 and never win), elementwise with no cumulative sum.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

_MASK32 = np.uint64(0xFFFFFFFF)
_ROUND_A = np.uint64(0xD2511F53)
_ROUND_B = np.uint64(0xCD9E8D57)
_KEY_A = np.uint64(0x9E3779B9)
_KEY_B = np.uint64(0xBB67AE85)
_UNIFORM_SCALE = np.float32(4.6566127342e-10)  # Triton's: the largest x with (2**31 - 1) * x < 1
ROUNDS = 10


def seed_key(seed: int) -> int:
    """Any Python int -> the int64 bit pattern of seed mod 2^64 (the Philox key of a request seed)."""
    key = seed & ((1 << 64) - 1)
    return key - (1 << 64) if key >= 1 << 63 else key


def _u64(x: object) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind == "i":
        return arr.astype(np.int64).view(np.uint64) if arr.dtype == np.int64 else arr.astype(np.uint64)
    return arr.astype(np.uint64)


def philox4x32(
    seed: object, c0: object, c1: object, c2: object, c3: object, rounds: int = ROUNDS
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Philox4x32 over broadcastable counters; seed is a 64-bit key (array-like). Returns 4 uint32 arrays."""
    seed = _u64(seed)
    k0, k1 = seed & _MASK32, seed >> np.uint64(32)
    x0, x1, x2, x3 = np.broadcast_arrays(*(_u64(c) & _MASK32 for c in (c0, c1, c2, c3)), k0)[:4]
    k0, k1 = np.broadcast_to(k0, x0.shape), np.broadcast_to(k1, x0.shape)
    for _ in range(rounds):
        # A 32x32-bit product fits in uint64: its high word is umulhi, its low word the wrapped mul.
        prod_b = _ROUND_B * x2
        prod_a = _ROUND_A * x0
        x0, x1, x2, x3 = (
            (prod_b >> np.uint64(32)) ^ x1 ^ k0,
            prod_b & _MASK32,
            (prod_a >> np.uint64(32)) ^ x3 ^ k1,
            prod_a & _MASK32,
        )
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return tuple(x.astype(np.uint32) for x in (x0, x1, x2, x3))  # type: ignore[return-value]


def uint_to_uniform_float(x: np.ndarray) -> np.ndarray:
    """uint32 -> float32 in [0, 1): bitcast to int32, fold negatives with ~x, scale (Triton's rule)."""
    signed = x.astype(np.uint32).view(np.int32)
    signed = np.where(signed < 0, ~signed, signed)
    return signed.astype(np.float32) * _UNIFORM_SCALE


def position_words(positions: object) -> tuple[np.ndarray, np.ndarray]:
    """Output positions (int64, >= 0) -> the (lo, hi) 32-bit counter words."""
    pos = _u64(positions)
    return pos & _MASK32, pos >> np.uint64(32)


def uniform_coins(seeds: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """Coins [W, V] float32 for rows with seeds [W] (int64 bit patterns of uint64) sampling the
    tokens at output positions [W]."""
    key = seeds.cpu().numpy().astype(np.int64)[:, None]
    lo, hi = position_words(positions.cpu().numpy().astype(np.int64)[:, None])
    word, _, _, _ = philox4x32(key, np.arange(vocab, dtype=np.int64)[None, :], lo, hi, 0)
    return torch.from_numpy(uint_to_uniform_float(word))


def exponential_race(probs: Tensor, coins: Tensor) -> Tensor:
    """x = argmax_i p_i / (-log coin_i) per row, lowest index on ties. probs, coins [W, V] -> int64 [W]."""
    score = torch.where(probs > 0, probs / -torch.log(coins), torch.tensor(-1.0, dtype=probs.dtype))
    return score.argmax(dim=-1)
