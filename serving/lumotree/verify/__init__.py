"""Tree verification: one folder per op family, each holding its PyTorch reference beside its Triton
kernel and CPU-fast variant; `kernel_sets.py` gathers one implementation per op family as a set."""
