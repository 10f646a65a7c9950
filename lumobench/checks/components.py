"""The component-check suite behind `lumobench verify components`, at default or full sizes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lumobench.checks import audit, continuation, gdn_checks, op_checks, structure_checks
from lumobench.checks.result import CheckResult


@dataclass(frozen=True)
class SuiteSize:
    """How many cases each check runs."""

    trees_per_shape: int
    selection_rows: int
    gdn_per_shape: int
    paper_dims_per_shape: int  # extra GDN cases at Qwen3.5-27B head shapes (16 QK / 48 V heads of 128)
    op_trees: int
    continuation_runs: int
    continuation_cycles: int
    audit_steps: int
    audit_walks: int
    audit_min_visits: int
    greedy_cases: int


DEFAULT = SuiteSize(3, 30, 2, 0, 14, 1, 4, 3, 20_000, 500, 20)
FULL = SuiteSize(20, 200, 10, 1, 70, 4, 8, 6, 200_000, 2_000, 200)
PAPER_GDN = gdn_checks.GdnDims(H=16, HV=48, K=128, V=128)


def suite(size: SuiteSize, seed: int = 0) -> list[tuple[str, Callable[[], CheckResult]]]:
    """The checks in table order, as (name, thunk) so a caller can show progress."""
    gdn = gdn_checks.cases(size.gdn_per_shape, gdn_checks.GdnDims(), seed)
    if size.paper_dims_per_shape:
        gdn += gdn_checks.cases(size.paper_dims_per_shape, PAPER_GDN, seed + 1)
    trees = op_checks.attention_trees(size.op_trees, seed)
    return [
        ("descriptor", lambda: structure_checks.check_descriptor(size.trees_per_shape, seed)),
        ("selection", lambda: structure_checks.check_selection(size.selection_rows, seed)),
        ("gdn vs transformers", lambda: gdn_checks.check_against_transformers(gdn)),
        ("gdn scan f64", lambda: gdn_checks.check_scan_float64(gdn)),
        ("gdn paired fp32", lambda: gdn_checks.check_paired(gdn, torch.float32)),
        ("gdn paired bf16", lambda: gdn_checks.check_paired(gdn, torch.bfloat16)),
        ("gdn publication", lambda: gdn_checks.check_publication_controls(gdn)),
        ("tree conv", lambda: op_checks.check_tree_conv(trees, seed=seed)),
        ("tree attention", lambda: op_checks.check_tree_attention(trees, seed=seed)),
        (
            "continuation",
            lambda: continuation.check_continuation(size.continuation_runs, size.continuation_cycles, seed),
        ),
        (
            "sampler audit",
            lambda: audit.check_sampler_audit(
                size.audit_steps, size.audit_walks, size.audit_min_visits, seed
            ),
        ),
        ("greedy walk", lambda: audit.check_greedy_walk(size.greedy_cases, seed)),
    ]
