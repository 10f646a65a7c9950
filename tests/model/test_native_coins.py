"""The native sampling coins equal the acceptance walk's NumPy Philox coins bit for bit."""

from __future__ import annotations

import random

import pytest
import torch

from lumotree.engine.acceptance import support_coins
from lumotree.model.native.coins import philox_coins


@pytest.mark.parametrize("seed", [0, 1, 2**63 - 1, -1, -(2**63), 2**64 + 5, 123456789012345])
def test_native_coins_are_bitwise_the_numpy_coins(seed: int) -> None:
    rng = random.Random(seed % 1000)
    tokens = torch.tensor([[rng.randrange(1 << 31) for _ in range(9)] for _ in range(5)])
    positions = [rng.randrange(1 << 40) for _ in range(5)]
    got, want = philox_coins(seed, positions, tokens), support_coins(seed, positions, tokens)
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    one = tokens[0]
    assert torch.equal(philox_coins(seed, positions[0], one), support_coins(seed, positions[0], one))
    assert ((got >= 0) & (got < 1)).all()


def test_native_coins_refuse_a_position_count_that_does_not_match() -> None:
    with pytest.raises(ValueError, match="2 positions for 3 rows"):
        philox_coins(0, [1, 2], torch.zeros(3, 4, dtype=torch.long))
