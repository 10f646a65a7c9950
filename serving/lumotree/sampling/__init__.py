"""Sampling: per-row logits processing with per-path histories, counter-based coins, acceptance walks."""

from lumotree.sampling.logits import (
    SamplingParams,
    probabilities,
    row_penalized_logits,
    tree_penalized_logits,
    tree_probabilities,
)
from lumotree.sampling.rng import exponential_race, philox4x32, uniform_coins
from lumotree.sampling.walk import WalkResult, greedy_walk, sample_walk

__all__ = [
    "SamplingParams",
    "WalkResult",
    "exponential_race",
    "greedy_walk",
    "philox4x32",
    "probabilities",
    "row_penalized_logits",
    "sample_walk",
    "tree_penalized_logits",
    "tree_probabilities",
    "uniform_coins",
]
