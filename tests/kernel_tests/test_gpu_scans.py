"""The GDN paths scan on a CUDA GPU, both decompositions: every output and record of random trees of
every shape bit for bit the row scan's, at the shipped model's and Qwen3.5-27B's GDN shapes, in bf16,
with the default path programs (so trees with more walks take the loop); and the operands the conv
prepares against the standalone preparation's (compiled kernels: the interpreter's test cannot
vouch for the GPU's layouts).

Run on the device machine with: TRITON_INTERPRET=0 pytest -m gpu tests/kernel_tests/test_gpu_scans.py
"""

from __future__ import annotations

import random

import pytest
import torch

from lumobench.bench.gdn_forms import SCANS, scans_match_rows
from lumobench.checks.random_trees import paper_tree
from lumotree.drafting.geometry import GeometryConfig
from lumotree.model import default_model_path
from lumotree.model.config import HybridConfig
from lumotree.model.random_weights import preset_config
from lumotree.tree import MAX_DEPTH, chain_tree
from lumotree.verify.conv.fused_conv import conv_operands_, tree_conv_
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.plan import DEFAULT_PATHS
from lumotree.verify.gdn.prepare import prepare_operands_
from lumotree.verify.gdn.reference import GateInputs, GdnInputs, GdnOperands
from lumotree.verify.gdn.replay import replay_accepted_
from lumotree.verify.gdn.row_scan import gdn_rows_prepared_

from .helpers import GPU_ONLY

pytestmark = GPU_ONLY


def _config(shapes: str) -> HybridConfig:
    return (
        HybridConfig.from_file(default_model_path()) if shapes == "lumo-tiny-coder" else preset_config(shapes)
    )


@pytest.mark.parametrize("shapes", ["lumo-tiny-coder", "qwen3.5-27b"])
def test_the_scans_give_every_row_the_row_scans_bits(shapes: str) -> None:
    cfg = _config(shapes)
    with torch.inference_mode():
        cases = scans_match_rows(cfg, torch.bfloat16, torch.device("cuda"), seed=11)
    parted = [c for c in cases if not all(c[f"{form}_equal"] for form in SCANS)]
    # which trees parted, and whether their records (prepared by each call) parted too
    assert len(cases) >= 7 and not parted, [(c["shape"], c["paths_records_equal"]) for c in parted]
    assert any(c["paths"] > DEFAULT_PATHS for c in cases), "no tree took the loop over paths"


@pytest.mark.parametrize("shapes", ["lumo-tiny-coder", "qwen3.5-27b"])
def test_the_conv_prepares_what_the_standalone_preparation_does(shapes: str) -> None:
    # The engine's forward prepares in the conv, the reference-signature forms in their own launch:
    # on the GPU's layouts every record written and equal to the standalone one's within a few ulps
    # (NaN-poisoned buffers, the paper tree's rows). Not bitwise: each kernel's layout orders its
    # sums (on 2 warps a program the two parted in q's last bits, session 18; the engine's arms all
    # take the conv's, so AR = MTP-5 = tree holds either way: test_device_path_gpu.py).
    cfg = (
        HybridConfig.from_file(default_model_path()) if shapes == "lumo-tiny-coder" else preset_config(shapes)
    )
    h, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    dev, channels = torch.device("cuda"), 2 * h * dk + hv * dv
    tree = paper_tree(random.Random(0), 1000, 4096, GeometryConfig(rows=32))
    gather = tree.conv_gather.to(dev)
    gen = torch.Generator(device=dev).manual_seed(5)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=dev)

    x = randn(tree.rows, channels + 8).bfloat16()[:, 8:]  # a column slice, as the projection's
    state, weight = randn(channels, 3).bfloat16(), randn(channels, 4).bfloat16()
    ab = randn(tree.rows, 2 * hv).bfloat16()
    gates = GateInputs(ab[:, :hv], ab[:, hv:], randn(hv), randn(hv))

    def records() -> GdnOperands:
        shapes_ = vars(empty_operands(tree.rows, h, hv, dk, dv, dev))
        return GdnOperands(*(torch.full(t.shape, float("nan"), device=dev) for t in shapes_.values()))

    fused, alone, record = (
        records(),
        records(),
        torch.empty(tree.rows, channels, dtype=torch.bfloat16, device=dev),
    )
    y = torch.empty_like(record)
    with torch.inference_mode():
        conv_operands_(x, state, weight, gather, gates, record, fused)
        tree_conv_(x, state, weight, None, gather, y)
        q, k, v = y[:, : h * dk], y[:, h * dk : 2 * h * dk], y[:, 2 * h * dk :]
        raw = GdnInputs(q.unflatten(1, (h, dk)), k.unflatten(1, (h, dk)), v.unflatten(1, (hv, dv)),
                        gates.a, gates.b, gates.A_log, gates.dt_bias)  # fmt: skip
        prepare_operands_(raw, alone)
    assert torch.equal(record, x)
    for field in ("q", "k", "v", "g", "beta"):
        got, want = getattr(fused, field), getattr(alone, field)
        assert not got.isnan().any(), field
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6, msg=field)


@pytest.mark.parametrize("shapes", ["lumo-tiny-coder", "qwen3.5-27b"])
def test_both_preparations_give_the_same_bits_every_time(shapes: str) -> None:
    # Run twice on the same inputs, each kernel writes the same records (the scans' bit equality
    # across calls of the raw forms rests on it: session 18, call 7).
    cfg = _config(shapes)
    h, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    dev, channels, rows = torch.device("cuda"), 2 * h * dk + hv * dv, 32
    gen = torch.Generator(device=dev).manual_seed(9)
    y = torch.randn(rows, channels, generator=gen, device=dev).bfloat16()
    ab = torch.randn(rows, 2 * hv, generator=gen, device=dev).bfloat16()
    gates = GateInputs(
        ab[:, :hv],
        ab[:, hv:],
        torch.randn(hv, generator=gen, device=dev),
        torch.randn(hv, generator=gen, device=dev),
    )
    raw = GdnInputs(
        y[:, : h * dk].unflatten(1, (h, dk)), y[:, h * dk : 2 * h * dk].unflatten(1, (h, dk)),
        y[:, 2 * h * dk :].unflatten(1, (hv, dv)), gates.a, gates.b, gates.A_log, gates.dt_bias,
    )  # fmt: skip
    tree = paper_tree(random.Random(1), 1000, 4096, GeometryConfig(rows=rows))
    state, weight = (
        torch.randn(channels, 3, device=dev).bfloat16(),
        torch.randn(channels, 4, device=dev).bfloat16(),
    )
    runs: dict[str, list[GdnOperands]] = {"standalone": [], "conv": []}
    with torch.inference_mode():
        for _ in range(3):
            for name in runs:
                ops = empty_operands(rows, h, hv, dk, dv, dev)
                if name == "standalone":
                    prepare_operands_(raw, ops)
                else:
                    conv_operands_(
                        y, state, weight, tree.conv_gather.to(dev), gates, torch.empty_like(y), ops
                    )
                runs[name].append(ops)
    for name, done in runs.items():
        for later in done[1:]:
            for field in ("q", "k", "v", "g", "beta"):
                assert torch.equal(getattr(done[0], field), getattr(later, field)), (name, field)


@pytest.mark.parametrize("shapes", ["lumo-tiny-coder", "qwen3.5-27b"])
def test_an_ar_step_advancing_in_place_writes_the_replays_state_bits(shapes: str) -> None:
    # The device engine's AR step advances its GDN states in the row scan (its root is always
    # accepted) instead of replaying the root in publication: the same state bits, and the same
    # output as the read-only scan, for 5 steps in a row.
    cfg = _config(shapes)
    h, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(5)

    def randn(*s: int) -> torch.Tensor:
        return torch.randn(s, generator=gen, device=dev)

    root = DeviceTree(1, MAX_DEPTH, dev).load_(chain_tree([1], prefix_len=4096))
    state = randn(hv, dv, dk) * 0.1
    replayed = state.clone()
    with torch.inference_mode():
        for step in range(5):
            shapes_ = ((1, h, dk), (1, h, dk), (1, hv, dv), (1, hv), (1, hv))
            x = GdnInputs(*(randn(*s).bfloat16() for s in shapes_), randn(hv).abs().log(), randn(hv))
            ops = empty_operands(1, h, hv, dk, dv, dev)
            prepare_operands_(x, ops)
            read, advanced = torch.empty_like(x.v), torch.empty_like(x.v)
            gdn_rows_prepared_(ops, replayed, root.gdn, read)
            replay_accepted_(replayed, ops, torch.zeros(1, dtype=torch.int64, device=dev), 1)
            gdn_rows_prepared_(ops, state, root.gdn, advanced, advance=True)
            assert torch.equal(advanced, read), step
            assert torch.equal(state, replayed), step
