"""LumoTree: tree speculative decoding for hybrid Gated-DeltaNet + attention language models."""

__version__ = "0.1.0"
