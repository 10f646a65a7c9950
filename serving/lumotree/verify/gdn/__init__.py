"""Gated DeltaNet tree verification and accepted-path publication: one op family, one folder.

Which form is used for what:
- `reference.py`: the PyTorch reference (the path scan of DESIGN §3.3 in plain torch, float64 when
  given float64; `gdn_sequential_reference` is the ground truth), exported here.
- `scan.py` (Triton): the path scan of DESIGN §3.3 (spine launch exporting cut states, then branch
  paths) and, with the "store_all" schedule, the native-paths baseline that stores every node's
  state. Tables: `plan.ScanTables`.
- `row_scan.py` (Triton): the engine's form for one row: every row carried down its ancestry with
  the replay's arithmetic, so a row has the one-row (AR) step's bits; `paths_scan.py` (Triton): the
  engine's form for chains and trees over large states, the same bits with one program per path of
  the tree's first-child decomposition (shared ancestors recomputed once per path, not per row).
- `tree_scan.py` (Triton): the tree WY form, every row solved at once through the ancestry-masked
  triangular system; the fastest form per layer, but with its own rounding (not row-invariant).
- `tree_value_major.py` (Triton): the same algebra split into a prepare and a value-major apply
  launch; the fastest over many instances (e.g. all 48 layers of a model) in one launch.
- `replay.py` (Triton): publication of the accepted path from the recorded operands, per layer or
  all layers in one launch.
- `tree_wy.py` (PyTorch): the tree WY form for CPUs, and `stacked_replay.py` (PyTorch) the
  all-layer replay for CPUs: the GDN forms of the CPU-fast kernel set (`verify/kernel_sets.py`).
- `common.py`: what the Triton forms share (helpers, checks, buffers); `plan.py`: their device tables.
"""

from lumotree.verify.gdn.reference import (
    GdnInputs,
    GdnOperands,
    GdnVerifyResult,
    gdn_sequential_reference,
    gdn_verify,
    prepare_operands,
    replay_accepted_,
)

__all__ = [
    "GdnInputs",
    "GdnOperands",
    "GdnVerifyResult",
    "gdn_sequential_reference",
    "gdn_verify",
    "prepare_operands",
    "replay_accepted_",
]
