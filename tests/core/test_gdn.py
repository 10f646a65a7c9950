"""GDN: ground truth vs transformers, path scan vs ground truth, the paired rule, publication."""

from __future__ import annotations

import pytest
import torch

from lumobench.checks import gdn_checks, hf_reference
from lumobench.checks.paired import paired_check
from lumobench.checks.random_trees import SHAPES
from lumotree.tree import build_tree, chain_tree
from lumotree.verify.gdn import GdnInputs, gdn_sequential_reference, gdn_verify, replay_accepted_

DIMS = gdn_checks.GdnDims()


@pytest.fixture(scope="module")
def cases() -> list[gdn_checks.GdnCase]:
    return gdn_checks.cases(1, DIMS, seed=11)


def test_ground_truth_and_scan_match_transformers_in_float64(cases: list[gdn_checks.GdnCase]) -> None:
    result = gdn_checks.check_against_transformers(cases)
    assert not result.skipped and result.ok and result.cases == len(SHAPES)


def test_transformers_runner_really_computes_in_float64() -> None:
    # Its stock call casts to float32; rebinding float32 must lift that, or the 1e-12 checks mean nothing.
    gen = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(6, 2, 16, generator=gen, dtype=torch.float64),
        torch.randn(6, 2, 16, generator=gen, dtype=torch.float64),
    )
    v, g, b = (
        torch.randn(6, 4, 16, generator=gen, dtype=torch.float64),
        -torch.rand(6, 4, generator=gen, dtype=torch.float64),
        torch.rand(6, 4, generator=gen, dtype=torch.float64),
    )
    state = torch.randn(4, 16, 16, generator=gen, dtype=torch.float64)
    o64, _ = hf_reference.hf_recurrent_gdn_float64(q, k, v, g, b, state)
    o32, _ = hf_reference.hf_recurrent_gdn_float64(
        *(t.float().double() for t in (q, k, v, g, b)), state.float().double()
    )
    assert o64.dtype == torch.float64
    module = __import__(hf_reference._MODULE, fromlist=["torch"])
    assert module.torch is torch  # the rebinding is undone after the call
    stock, _ = module.torch_recurrent_gated_delta_rule(
        q[None],
        k[None],
        v[None],
        g[None],
        b[None],
        initial_state=state.transpose(-1, -2)[None],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    assert stock.dtype == torch.float64 and 1e-9 < float((stock[0] - o64).abs().max()) < 1e-4
    assert float((o32 - o64).abs().max()) > 1e-9  # inputs rounded to fp32 give a visibly different answer


@pytest.mark.parametrize("shape", SHAPES)
def test_path_scan_and_replay_equal_the_sequential_reference_in_float64(shape: str) -> None:
    case = gdn_checks.cases(2, DIMS, seed=SHAPES.index(shape), shapes=[shape])
    result = gdn_checks.check_scan_float64(case)
    assert result.ok, result.detail


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paired_rule_holds_for_every_output_and_state_cell(
    cases: list[gdn_checks.GdnCase], dtype: torch.dtype
) -> None:
    total = sum(
        (gdn_checks.paired_gdn(c, dtype) for c in cases), start=gdn_checks.PairedResult(0, 0, 0.0, 0.0)
    )
    assert total.cells > 1000 and total.violations == 0, total


def test_paired_rule_rejects_a_perturbed_or_non_finite_implementation(
    cases: list[gdn_checks.GdnCase],
) -> None:
    case = cases[-1]
    n = case.tree.n_active
    x, state = case.inputs(torch.float32)
    o = gdn_verify(x, state, case.tree).o[:n]
    native, _ = gdn_sequential_reference(x, state, case.tree)
    ref, _ = gdn_sequential_reference(*case.truth(torch.float32), case.tree)
    assert paired_check(o, native[:n], ref[:n], 2, torch.float32).ok
    nudged = o.clone()
    nudged[3, 1, 0] += 1e-3
    assert paired_check(nudged, native[:n], ref[:n], 2, torch.float32).violations == 1
    nudged[3, 1, 0] = float("nan")
    assert paired_check(nudged, native[:n], ref[:n], 2, torch.float32).violations == 1


def test_verify_never_writes_the_durable_state_and_replay_publishes_in_place() -> None:
    case = gdn_checks.cases(1, DIMS, seed=5, shapes=["paper"])[0]
    x, state = case.inputs(torch.float32)
    durable = state.clone()
    res = gdn_verify(x, durable, case.tree)
    assert torch.equal(durable, state)
    node = int(case.tree.spine[4])
    path = gdn_checks.frontiers(case.tree)[node]
    pointer = durable.data_ptr()
    replay_accepted_(durable, res.operands, path, 5)
    _, states = gdn_sequential_reference(x, state, case.tree)
    assert durable.data_ptr() == pointer
    assert torch.allclose(durable, states[node], atol=1e-5)
    # padding entries past path_len are never read
    assert torch.equal(path[5:], torch.full_like(path[5:], -1))


def test_publication_controls_are_rejected_and_off_path_poisoning_is_bit_identical(
    cases: list[gdn_checks.GdnCase],
) -> None:
    result = gdn_checks.check_publication_controls(cases)
    assert result.ok and result.faults_planted > 100 and result.cases == len(cases)


def test_shape_and_dtype_mistakes_are_reported() -> None:
    tree = chain_tree([1, 2], prefix_len=0)
    q = torch.randn(2, 2, 8)
    v = torch.randn(2, 4, 8)
    gates = torch.randn(2, 4)
    with pytest.raises(ValueError, match="state must be"):
        gdn_verify(
            GdnInputs(q, q, v, gates, gates, torch.zeros(4), torch.zeros(4)),
            torch.zeros(4, 8, 8, dtype=torch.float64),
            tree,
        )
    with pytest.raises(ValueError, match="expected q, k"):
        gdn_verify(
            GdnInputs(q, q[:1], v, gates, gates, torch.zeros(4), torch.zeros(4)), torch.zeros(4, 8, 8), tree
        )


def test_scan_covers_branch_paths_that_recompute_shared_prefixes() -> None:
    # Node 3 has two non-leaf children: two branch paths start from the root's cut state and both
    # recompute node 3; only the first owns its output.
    tree = build_tree([0, 1, 5, 6, 7, 8, 9, 2], [-1, 0, 0, 2, 2, 3, 4, 1], prefix_len=4)
    plan = tree.paths
    assert plan.nodes.tolist() == [[0, 1, 7], [2, 3, -1], [2, 4, -1]]
    assert plan.owner.tolist() == [[True, True, True], [True, True, False], [False, True, False]]
    assert plan.cut_nodes.tolist() == [0] and plan.leaf_node.tolist() == [5, 6]
    assert gdn_checks.check_scan_float64(
        [gdn_checks.make_case(tree, DIMS, torch.Generator().manual_seed(1))]
    ).ok
