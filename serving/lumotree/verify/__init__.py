"""Tree verification: one folder per op family, each holding its PyTorch reference (and later its kernel)."""
