"""Fused Triton kernels of the model's dense path, each beside its PyTorch reference."""
