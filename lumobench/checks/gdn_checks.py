"""GDN component checks: the float64 ground truth against transformers, the path scan against the
ground truth (float64 exact to 1e-12, fp32/bf16 under the paired rule), and recurrent publication
with its controls (zero replay, sibling substitution, off-path poisoning)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lumobench.checks import hf_reference
from lumobench.checks.paired import PairedResult, paired_check
from lumobench.checks.random_trees import SHAPES, random_tree
from lumobench.checks.result import CheckResult
from lumotree.tree import TreeDescriptor
from lumotree.verify.gdn.reference import (
    GdnInputs,
    GdnOperands,
    gdn_sequential_reference,
    gdn_verify,
    replay_accepted_,
)

FLOAT64_TOL = 1e-12


@dataclass(frozen=True)
class GdnDims:
    """Head counts and sizes: H key heads, HV value heads, K key dim, V value dim."""

    H: int = 2
    HV: int = 4
    K: int = 32
    V: int = 32


@dataclass(frozen=True, eq=False)
class GdnCase:
    """One layer's verifier inputs over a tree: float64 masters, rounded per dtype on use."""

    tree: TreeDescriptor
    raw: tuple[Tensor, Tensor, Tensor, Tensor, Tensor]  # q, k [R, H, K]; v [R, HV, V]; a, b [R, HV]
    A_log: Tensor  # [HV] float32 parameter
    dt_bias: Tensor  # [HV] float32 parameter
    state: Tensor  # [HV, V, K] float32 durable state

    def inputs(self, dtype: torch.dtype) -> tuple[GdnInputs, Tensor]:
        """(the verifier's inputs, the durable state): q, k, v, a, b in `dtype`, A_log, dt_bias and
        the state in the compute dtype. `verify(*case.inputs(dtype), case.tree)` reads as the call."""
        cd = torch.float64 if dtype == torch.float64 else torch.float32
        x = GdnInputs(*(t.to(dtype) for t in self.raw), self.A_log.to(cd), self.dt_bias.to(cd))
        return x, self.state.to(cd)

    def truth(self, dtype: torch.dtype) -> tuple[GdnInputs, Tensor]:
        """The same inputs after rounding to `dtype`, in float64: what the float64 reference sees."""
        x, state = self.inputs(dtype)
        return x.map(Tensor.double), state.double()


def make_case(tree: TreeDescriptor, dims: GdnDims, gen: torch.Generator) -> GdnCase:
    """Random operands at model-like scales (gates decaying by 0.5-1 per step)."""
    n = tree.rows

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    raw = (
        randn(n, dims.H, dims.K),
        randn(n, dims.H, dims.K),
        randn(n, dims.HV, dims.V),
        randn(n, dims.HV),
        randn(n, dims.HV),
    )
    A_log = torch.empty(dims.HV, dtype=torch.float64).uniform_(0.0, 2.5, generator=gen).float()
    dt_bias = (0.5 * randn(dims.HV)).float()
    state = (0.5 * randn(dims.HV, dims.V, dims.K)).float()
    return GdnCase(tree, raw, A_log, dt_bias, state)


def cases(n_per_shape: int, dims: GdnDims, seed: int, shapes: Sequence[str] = SHAPES) -> list[GdnCase]:
    """n_per_shape random trees of every shape, each with fresh operands."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    return [make_case(random_tree(s, rng), dims, gen) for _ in range(n_per_shape) for s in shapes]


def frontiers(tree: TreeDescriptor) -> list[Tensor]:
    """Every possible accepted path (root to each active node), as fixed-shape padded index tensors."""
    return [tree.padded_path(tree.path_to(node)) for node in range(tree.n_active)]


def _path_len(path: Tensor) -> int:
    return int((path >= 0).sum())


def _replayed(state: Tensor, ops: GdnOperands, path: Tensor, length: int | None = None) -> Tensor:
    s = state.clone()
    replay_accepted_(s, ops, path, _path_len(path) if length is None else length)
    return s


def check_against_transformers(all_cases: Sequence[GdnCase]) -> CheckResult:
    """Ground truth and path scan vs transformers' recurrence, float64, every node of every tree."""
    result = CheckResult("GDN truth vs transformers f64")
    if not hf_reference.available():
        result.skipped = "transformers not installed (test-only dependency)"
        return result
    worst = 0.0
    for case in all_cases:
        x, state = case.inputs(torch.float64)
        q, k, v, a, b = x.q, x.k, x.v, x.a, x.b
        ref_o, ref_s = gdn_sequential_reference(x, state, case.tree)
        scan_o = gdn_verify(x, state, case.tree).o
        g = -torch.exp(x.A_log) * F.softplus(a + x.dt_bias)  # the model's gate formula, spelled independently
        err = 0.0
        for node in range(case.tree.n_active):
            path = case.tree.path_to(node)
            hf_o, hf_s = hf_reference.hf_recurrent_gdn_float64(
                q[path], k[path], v[path], g[path], torch.sigmoid(b[path]), state
            )
            err = max(
                err,
                float((hf_o[-1] - ref_o[node]).abs().max()),
                float((hf_o[-1] - scan_o[node]).abs().max()),
                float((hf_s - ref_s[node]).abs().max()),
            )
        worst = max(worst, err)
        result.case(err <= FLOAT64_TOL)
    result.detail = f"max |diff| {worst:.1e} (tol {FLOAT64_TOL:g})"
    return result


def check_scan_float64(all_cases: Sequence[GdnCase]) -> CheckResult:
    """Path scan outputs, cut states and every replayed frontier equal the ground truth in float64."""
    result = CheckResult("GDN scan + replay f64")
    worst = 0.0
    for case in all_cases:
        x, state = case.inputs(torch.float64)
        before = state.clone()
        res = gdn_verify(x, state, case.tree)
        ref_o, ref_s = gdn_sequential_reference(x, state, case.tree)
        n = case.tree.n_active
        errs = [float((res.o[:n] - ref_o[:n]).abs().max())]
        if len(case.tree.paths.cut_nodes):
            errs.append(float((res.cut_states - ref_s[case.tree.paths.cut_nodes]).abs().max()))
        for node, path in enumerate(frontiers(case.tree)):
            errs.append(float((_replayed(state, res.operands, path) - ref_s[node]).abs().max()))
        err = max(errs)
        worst = max(worst, err)
        result.case(err <= FLOAT64_TOL and torch.equal(state, before) and bool((res.o[n:] == 0).all()))
    result.detail = f"max |diff| {worst:.1e} (tol {FLOAT64_TOL:g}); durable state untouched by verify"
    return result


def paired_gdn(case: GdnCase, dtype: torch.dtype) -> PairedResult:
    """Paired rule on every output cell, cut-state cell and published-state cell of one case."""
    tree, n = case.tree, case.tree.n_active
    x, state = case.inputs(dtype)
    res = gdn_verify(x, state, tree)
    nat_o, nat_s = gdn_sequential_reference(x, state, tree)
    ref_o, ref_s = gdn_sequential_reference(*case.truth(dtype), tree)
    out = paired_check(res.o[:n], nat_o[:n].to(dtype), ref_o[:n], 2, dtype)
    cuts = tree.paths.cut_nodes
    if len(cuts):
        out = out + paired_check(res.cut_states, nat_s[cuts], ref_s[cuts], 2, torch.float32)
    published = torch.stack([_replayed(state, res.operands, path) for path in frontiers(tree)])
    return out + paired_check(published, nat_s[:n], ref_s[:n], 2, torch.float32)


def check_paired(all_cases: Sequence[GdnCase], dtype: torch.dtype) -> CheckResult:
    """The paired error rule for the scan (outputs, cut states) and replay (published states)."""
    name = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    result = CheckResult(f"GDN paired rule {name}")
    total = PairedResult(0, 0, 0.0, 0.0)
    for case in all_cases:
        r = paired_gdn(case, dtype)
        total = total + r
        result.case(r.ok)
    result.detail = (
        f"{total.cells} cells, {total.violations} outside bound, worst ratio {total.worst_ratio:.2f}"
    )
    return result


def _sibling(tree: TreeDescriptor, node: int) -> int | None:
    parent = int(tree.parent[node])
    if parent < 0:
        return None
    siblings = [int(c) for c in tree.child_nodes[parent] if c >= 0 and int(c) != node]
    return siblings[0] if siblings else None


def check_publication_controls(
    all_cases: Sequence[GdnCase], dtype: torch.dtype = torch.float32
) -> CheckResult:
    """Replay controls: zero replay and sibling substitution must be rejected by the paired rule;
    poisoning every off-path node must leave the published state bit-identical."""
    result = CheckResult("GDN publication controls")
    for case in all_cases:
        tree = case.tree
        x, state = case.inputs(dtype)
        res = gdn_verify(x, state, tree)
        _, nat_s = gdn_sequential_reference(x, state, tree)
        _, ref_s = gdn_sequential_reference(*case.truth(dtype), tree)

        def rejects(published: Tensor, node: int, ref_s: Tensor = ref_s, nat_s: Tensor = nat_s) -> bool:
            return not paired_check(
                published[None], nat_s[node][None], ref_s[node][None], 2, torch.float32
            ).ok

        for node, path in enumerate(frontiers(tree)):
            result.fault(rejects(_replayed(state, res.operands, path, 0), node))
            sib = _sibling(tree, node)
            if sib is not None:
                swapped = path.clone()
                swapped[_path_len(path) - 1] = sib
                result.fault(rejects(_replayed(state, res.operands, swapped), node))
        # Off-path poisoning: every node off the deepest path gets non-finite raw operands.
        deepest = max(range(tree.n_active), key=lambda i: int(tree.depth[i]))
        on_path = torch.zeros(tree.rows, dtype=torch.bool)
        on_path[tree.path_to(deepest)] = True
        poisoned = [
            torch.where(on_path.view(-1, *([1] * (t.dim() - 1))), t, torch.nan)
            for t in (x.q, x.k, x.v, x.a, x.b)
        ]
        bad = gdn_verify(GdnInputs(*poisoned, x.A_log, x.dt_bias), state, tree)
        path = frontiers(tree)[deepest]
        same = torch.equal(_replayed(state, bad.operands, path), _replayed(state, res.operands, path))
        result.case(same and torch.equal(bad.o[on_path], res.o[on_path]))
    result.detail = "faults: zero replay, sibling substitution; cases: off-path poisoning is bit-identical"
    return result
