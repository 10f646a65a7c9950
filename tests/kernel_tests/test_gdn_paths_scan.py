"""The GDN paths scan (`verify/gdn/paths_scan.py`) and the first-child decomposition that drives it
(`plan.first_child_paths`, built on the device by `DeviceTree.derive_`): every output and record bit
for bit the row scan's on random trees of every shape (so the one-row step's bits, which the row
scan's tests pin), with one path program a tile (each program walks every path in turn) and with the
default count, against the PyTorch reference, the padding rows zeroed (interpreter, NaN-poisoned
outputs and records). On the GPU: `test_gpu_scans.py`."""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.checks import gdn_checks
from lumobench.checks.random_trees import SHAPES, random_tree
from lumotree.drafting.geometry import GeometryConfig
from lumotree.drafting.suffix import SuffixDrafter
from lumotree.engine.device_runner import gdn_paths
from lumotree.tree import TreeDescriptor
from lumotree.verify import device_ops
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.paths_scan import gdn_paths_
from lumotree.verify.gdn.plan import DEFAULT_PATHS, count_paths, empty_ancestry_tables, first_child_paths
from lumotree.verify.gdn.prepare import prepare_operands_
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands
from lumotree.verify.gdn.row_scan import gdn_rows_

from .helpers import assert_gdn_matches_reference, poisoned

DIMS = gdn_checks.GdnDims(H=1, HV=2, K=16, V=16)  # one key head, two value heads: grouped, cheap
#: the default run's trees (the paper tree, a deep wide one, one with more paths than programs);
#: the other shapes are slow-marked
QUICK = {"paper", "deep_and_wide", "random_order"}
FEW_PROGRAMS = 3  # path programs a value tile fewer than the quick trees' walks
CPU = torch.device("cpu")
RECORDS = ("q", "k", "v", "g", "beta")


def _verify(
    form: str, x: GdnInputs, state: torch.Tensor, tables: DeviceTree, contiguous: bool = True
) -> tuple[torch.Tensor, GdnOperands]:
    rows, device = tables.rows, state.device
    hv, dv = x.v.shape[1], x.v.shape[2]
    h, dk = x.q.shape[1], x.q.shape[2]
    o = poisoned((rows, hv, dv), x.v.dtype, device)
    empty = empty_operands(rows, h, hv, dk, dv, device)
    ops = GdnOperands(*(poisoned(tuple(t.shape), torch.float32, device) for t in vars(empty).values()))
    before = state.clone()
    xs = x.map(torch.Tensor.contiguous) if contiguous else x
    (gdn_rows_ if form == "rows" else gdn_paths_)(xs, state, tables.gdn, o, ops)
    assert torch.equal(state, before), "the committed state is read only"
    return o, ops


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN (unwritten poison) where the other has NaN."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def _assert_row_scan_bits(
    x: GdnInputs, state: torch.Tensor, tables: DeviceTree, tree: TreeDescriptor
) -> None:
    o_rows, ops_rows = _verify("rows", x, state, tables)
    o_paths, ops_paths = _verify("paths", x, state, tables)
    active = tree.n_active
    assert not o_paths.isnan().any(), "an output was not written"
    assert not o_paths[active:].any(), "a padding row's output is not zero"
    assert _same_bits(o_rows, o_paths)
    for field in RECORDS:
        got = getattr(ops_paths, field)[:active]
        assert not got.isnan().any(), f"an active row's {field} record was not written"
        assert _same_bits(getattr(ops_rows, field)[:active], got), field


@pytest.mark.parametrize("paths", [1, FEW_PROGRAMS, DEFAULT_PATHS])
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        pytest.param(s, torch.bfloat16, marks=() if s in QUICK else pytest.mark.slow, id=f"{s}-bf16")
        for s in SHAPES
    ]
    + [pytest.param("paper", torch.float32, id="paper-fp32")],
)
def test_the_paths_scan_gives_every_row_the_row_scans_bits(
    shape: str, dtype: torch.dtype, paths: int
) -> None:
    tree = random_tree(shape, random.Random(900 + SHAPES.index(shape)))
    case = gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(9))
    x, state = case.inputs(dtype)
    tables = DeviceTree(tree.rows, tree.max_depth, CPU, paths=paths).load_(tree)
    _assert_row_scan_bits(x, state, tables, tree)


def test_the_quick_trees_have_more_walks_than_a_few_programs() -> None:
    """The loop over walks in a program (p, p + programs, ...) is exercised by the runs above."""
    for shape in QUICK:
        tree = random_tree(shape, random.Random(900 + SHAPES.index(shape)))
        assert count_paths(tree) > FEW_PROGRAMS, shape


def _column_slices(x: GdnInputs) -> GdnInputs:
    """x's q, k, v as column slices of one [R, 2HK + HV*V + 3] tensor and a, b of one [R, 2HV + 5]
    (as the engine's conv and projection outputs hold them), NaN in the columns around them."""
    rows = x.q.shape[0]

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(rows, -1)

    def nan(n: int) -> torch.Tensor:
        return torch.full((rows, n), float("nan"), dtype=x.q.dtype)

    qkv = torch.cat([flat(x.q), flat(x.k), flat(x.v), nan(3)], dim=1)
    ba = torch.cat([nan(2), flat(x.b), flat(x.a), nan(3)], dim=1)
    hk, hvv, hv = flat(x.q).shape[1], flat(x.v).shape[1], x.a.shape[1]
    return GdnInputs(
        qkv[:, :hk].view(x.q.shape),
        qkv[:, hk : 2 * hk].view(x.k.shape),
        qkv[:, 2 * hk : 2 * hk + hvv].view(x.v.shape),
        ba[:, 2 + hv : 2 + 2 * hv],
        ba[:, 2 : 2 + hv],
        x.A_log,
        x.dt_bias,
    )


def test_column_slices_of_one_output_are_read_in_place_with_the_same_bits() -> None:
    tree = random_tree("paper", random.Random(11))
    case = gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(11))
    x, state = case.inputs(torch.bfloat16)
    tables = DeviceTree(tree.rows, tree.max_depth, CPU).load_(tree)
    sliced = _column_slices(x)
    assert not sliced.q.is_contiguous() and not sliced.a.is_contiguous()
    o, ops = _verify("paths", x, state, tables)
    o_sliced, ops_sliced = _verify("paths", sliced, state, tables, contiguous=False)
    assert not o_sliced.isnan().any(), "a read strayed into the NaN columns"
    assert _same_bits(o, o_sliced)
    for field in RECORDS:
        assert _same_bits(getattr(ops, field)[: tree.n_active], getattr(ops_sliced, field)[: tree.n_active])


def test_the_paths_scan_matches_the_reference() -> None:
    tree = random_tree("paper", random.Random(5))
    case = gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(5))
    x, state = case.inputs(torch.float32)
    o, ops = _verify("paths", x, state, DeviceTree(tree.rows, tree.max_depth, CPU).load_(tree))
    assert_gdn_matches_reference(o, ops, case)


@pytest.mark.parametrize("form", ["rows", "paths"])
def test_the_engine_scan_over_prepared_records_gives_the_raw_verifications_bits(form: str) -> None:
    # The forward's path (records prepared beforehand, here by the standalone preparation, then the
    # scan alone) against gdn_verify from raw inputs (which prepares and scans in one call); the
    # records are read, not written; a form that reads raw inputs is refused.
    tree = random_tree("paper", random.Random(6))
    case = gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(6))
    x, state = case.inputs(torch.bfloat16)
    tables = DeviceTree(tree.rows, tree.max_depth, CPU).load_(tree)
    config = device_ops.GdnConfig(form=form)
    raw = device_ops.gdn_verify(x, state, tables, config)
    ops = empty_operands(tree.rows, DIMS.H, DIMS.HV, DIMS.K, DIMS.V, CPU)
    prepare_operands_(x.map(torch.Tensor.contiguous), ops)
    before = ops.map(torch.clone)
    o = device_ops.gdn_scan(ops, state, tables, torch.bfloat16, config)
    assert o.dtype == torch.bfloat16 and torch.equal(o, raw.o)
    for field in RECORDS:
        assert torch.equal(getattr(ops, field), getattr(before, field)), field
        assert torch.equal(getattr(ops, field), getattr(raw.operands, field)), field
    with pytest.raises(ValueError, match="not form 'wy'"):
        device_ops.gdn_scan(ops, state, tables, torch.bfloat16, device_ops.GdnConfig(form="wy"))


def _owners(parents: list[int], n_active: int) -> list[int]:
    """Which walk evaluates each active node, as the kernel decides it: a walk owns the nodes of its
    end's ancestry from its start down (none for start R), and the leaf groups of the nodes it
    passes whose leaf_walk is its index."""
    tables = first_child_paths(parents, n_active)
    owner = [-1] * n_active
    for p, (end, start) in enumerate(zip(tables["path_end"], tables["path_start"], strict=True)):
        if end < 0:
            continue
        node, path = end, []
        while node >= 0:
            path.append(node)
            node = parents[node]
        evaluated = [n for n in path if n >= start]
        groups = [n for n in path if tables["leaf_walk"][n] == p]
        evaluated += [leaf for leaf, parent in enumerate(tables["leaf_parent"]) if parent in groups]
        for node in evaluated:
            assert owner[node] == -1, f"node {node} is evaluated by walks {owner[node]} and {p}"
            owner[node] = p
    return owner


def _steps(parents: list[int], tables: dict[str, list[int]]) -> list[int]:
    """Each walk's steps: its end's ancestry, then one a leaf of the groups it evaluates."""
    steps = []
    for p, end in enumerate(tables["path_end"]):
        if end < 0:
            break
        ancestry = [end]
        while ancestry[-1] != 0:
            ancestry.append(parents[ancestry[-1]])
        leaves = sum(parent >= 0 and tables["leaf_walk"][parent] == p for parent in tables["leaf_parent"])
        steps.append(len(ancestry) + leaves)
    return steps


@pytest.mark.parametrize("shape", SHAPES)
def test_the_decomposition_evaluates_every_active_node_once(shape: str) -> None:
    rng = random.Random(40 + SHAPES.index(shape))
    for _ in range(5):
        tree = random_tree(shape, rng)
        parents = tree.parent.tolist()
        owner = _owners(parents, tree.n_active)
        assert -1 not in owner, f"nodes {[n for n, p in enumerate(owner) if p < 0]} are never evaluated"
        tables = first_child_paths(parents, tree.n_active)
        walks = sum(e >= 0 for e in tables["path_end"])
        assert tables["path_end"][walks:] == [-1] * (tree.rows - walks)
        starts = tables["path_start"][:walks]
        paths = sum(start < tree.rows for start in starts)  # the paths first, then the added walks
        assert all(start < tree.rows for start in starts[:paths])
        ends = tables["path_end"][:walks]
        assert ends[:paths] == sorted(ends[:paths])
        # a path's start is the first node of its own it evaluates (not counting leaf groups)
        own = [p if tables["leaf_parent"][n] < 0 else -1 for n, p in enumerate(owner)]
        assert starts[:paths] == [min(n for n, p in enumerate(own) if p == i) for i in range(paths)]
        # a leaf group shared with a path never makes it the longest walk: the longest is a path
        # with no groups, or a walk added for groups
        steps = _steps(parents, tables)
        longest_path = max(len(tree.path_to(end)) for end in ends[:paths])
        assert max(steps[:paths]) <= max([longest_path, *steps[paths:]])
        # an added walk takes only groups no path could: each ends at its first group's parent
        assert all(tables["leaf_walk"][end] == paths + i for i, end in enumerate(ends[paths:]))


def test_the_paper_tree_shares_its_sibling_groups_among_four_walks() -> None:
    """The spine, a path per rescue branch, and the runner-up siblings of each MTP depth on those
    paths where they fit within the spine's 12 steps, the rest on one walk of their own: 37-38
    steps a value tile where a walk per group took 48-49 in 8 walks."""
    for seed in range(3, 8):
        tree = random_tree("paper", random.Random(seed))
        parents = tree.parent.tolist()
        tables = first_child_paths(parents, tree.n_active)
        assert count_paths(tree) == 4
        assert tables["path_end"][tables["path_start"].index(0)] == tree.spine.tolist()[-1]
        siblings = [n for n, p in enumerate(tables["leaf_parent"]) if p >= 0]
        assert siblings and all(tables["leaf_parent"][n] in tree.spine.tolist() for n in siblings)
        steps = _steps(parents, tables)
        assert max(steps) == 12 and sum(steps) <= 38, steps


def test_a_launch_needs_a_path_program() -> None:
    with pytest.raises(ValueError, match="at least one path program"):
        empty_ancestry_tables(4, 3, CPU, paths=0)


@pytest.mark.parametrize(
    ("device", "rows", "state_bytes", "form", "registers"),
    [
        ("cuda", 32, 48 * 128 * 128 * 4, "paths", 128),  # the paper tree at Qwen3.5-27B's states
        ("cuda", 6, 48 * 128 * 128 * 4, "paths", None),  # MTP-5's chain: uncapped
        ("cuda", 1, 48 * 128 * 128 * 4, "rows", None),  # the AR step
        ("cuda", 32, 4 * 64 * 64 * 4, "rows", None),  # the shipped model: the row scan's parallelism wins
        ("cpu", 32, 48 * 128 * 128 * 4, "rows", None),  # the interpreter
    ],
)
def test_the_engine_picks_the_paths_scan_for_chains_and_trees_over_large_states(
    device: str, rows: int, state_bytes: int, form: str, registers: int | None
) -> None:
    config = device_ops.GdnConfig.for_device(torch.device(device), rows, state_bytes)
    assert (config.form, config.max_registers) == (form, registers)


def test_the_runner_launches_a_program_per_walk_of_its_geometry() -> None:
    paper = random_tree("paper", random.Random(3))  # built with the default geometry's counts
    assert gdn_paths(False, (GeometryConfig(), SuffixDrafter())) >= count_paths(paper)
    assert gdn_paths(True, None) == 1  # a chain is one path
    assert gdn_paths(False, None) == DEFAULT_PATHS  # host-fed trees: any count, looping past it
