"""Gated DeltaNet tree verification (path scan with cut states) and accepted-path replay."""

from lumotree.verify.gdn.reference import (
    GdnOperands,
    GdnVerifyResult,
    gdn_sequential_reference,
    gdn_verify,
    prepare_operands,
    replay_accepted_,
)

__all__ = [
    "GdnOperands",
    "GdnVerifyResult",
    "gdn_sequential_reference",
    "gdn_verify",
    "prepare_operands",
    "replay_accepted_",
]
