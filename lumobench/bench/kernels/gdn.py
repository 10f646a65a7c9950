"""GDN verify + publish benchmark (paper §VII-H, Tables XIV-XV) at Qwen3.5-27B shapes.

All methods share one set of synthetic operands for `layers` GDN layers over the paper tree (28
active of 32 rows, depth <= 11). Each timed iteration advances the accepted frontier through every
active node; durable states evolve across iterations, as in the paper. Methods:

- lumotree v2: Triton path scan ("cut": spine launch + branch launch per layer; or "recompute": one
  launch per layer) + replay publication (all layers in one launch, or one launch per layer);
- lumotree tree-parallel (tree WY form, no step loop; and its value-major split): per-layer
  launches (as a model runs its layers), or all layers as independent instances in one launch (the
  paper's "48 GDN instances" measurement); replay publication in one launch;
- native paths: the same path cover storing every node's full state (children reload their
  parent's), publish = copy the selected node's state;
- torch sequential: PyTorch updates node by node in topological order, publish = copy;
- fla fused_recurrent / chunk: flash-linear-attention's chain kernels over a 32-token chain,
  publish = copy the final state (verify work of a chain, not of the tree).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from lumobench.bench.timing import Timer
from lumobench.checks.random_trees import paper_tree
from lumotree.verify.gdn.plan import ScanTables, ancestry_tables, scan_tables
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands, gdn_sequential_reference, prepare_operands
from lumotree.verify.gdn.replay import replay_layers_
from lumotree.verify.gdn.scan import gdn_scan_
from lumotree.verify.gdn.tree_scan import gdn_tree_, gdn_tree_layers_
from lumotree.verify.gdn.tree_value_major import gdn_value_major_, gdn_value_major_layers_
from lumotree.verify.graphs import CapturedStage

MIB = 2**20


@dataclass(frozen=True)
class GdnShape:
    """Qwen3.5-27B GDN geometry by default."""

    layers: int = 48
    heads: int = 16
    v_heads: int = 48
    dk: int = 128
    dv: int = 128


@dataclass
class Method:
    """One benchmarked method: verify and publish closures over the shared buffers."""

    name: str
    verify: Callable[[], object]
    publish: Callable[[], object]
    buffers: dict[str, int] = field(default_factory=dict)  # named persistent allocations, bytes
    note: str = ""


def _nbytes(*tensors: Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class GdnWorkload:
    """Shared operands, durable states and accepted-path schedule for every method."""

    def __init__(self, shape: GdnShape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> None:
        self.shape, self.dtype, self.device = shape, dtype, device
        self.tree = paper_tree(random.Random(seed), vocab=1000, prefix_len=4096)
        L, H, HV, K, V, R = shape.layers, shape.heads, shape.v_heads, shape.dk, shape.dv, self.tree.rows
        gen = torch.Generator(device=device).manual_seed(seed)

        def randn(*dims: int) -> Tensor:
            return torch.randn(*dims, generator=gen, device=device)

        q, k = randn(L, R, H, K).to(dtype), randn(L, R, H, K).to(dtype)
        v = randn(L, R, HV, V).to(dtype)
        a, b = randn(L, R, HV).to(dtype), randn(L, R, HV).to(dtype)
        A_log = torch.rand(L, HV, generator=gen, device=device) * 2.5
        self.inputs = GdnInputs(q, k, v, a, b, A_log, 0.5 * randn(L, HV))  # every layer, stacked
        self.state0 = 0.5 * randn(L, HV, V, K)
        self.states = self.state0.clone()
        self.o = torch.empty(L, R, HV, V, dtype=dtype, device=device)
        f32 = dict(dtype=torch.float32, device=device)
        self.records = GdnOperands(
            q=torch.empty(L, R, H, K, **f32),
            k=torch.empty(L, R, H, K, **f32),
            v=torch.empty(L, R, HV, V, **f32),
            g=torch.empty(L, R, HV, **f32),
            beta=torch.empty(L, R, HV, **f32),
        )
        width = self.tree.max_depth + 1
        frontiers = list(range(self.tree.n_active))
        self.accepted_table = torch.stack(
            [self.tree.padded_path(self.tree.path_to(n)) for n in frontiers]
        ).to(device)
        self.len_table = torch.tensor([len(self.tree.path_to(n)) for n in frontiers], device=device)
        self.accepted = torch.full((width,), -1, dtype=torch.int64, device=device)
        self.path_len = torch.ones(1, dtype=torch.int64, device=device)
        self.deepest = max(frontiers, key=lambda n: int(self.tree.depth[n]))

    def layer_records(self, layer: int) -> GdnOperands:
        r = self.records
        return GdnOperands(r.q[layer], r.k[layer], r.v[layer], r.g[layer], r.beta[layer])

    def layer_inputs(self, layer: int) -> GdnInputs:
        return self.inputs.map(lambda t: t[layer])

    def set_frontier(self, i: int) -> None:
        """Accept the path to active node i mod n_active (device copies, no sync)."""
        i %= self.tree.n_active
        self.accepted.copy_(self.accepted_table[i])
        self.path_len.copy_(self.len_table[i : i + 1])

    @functools.cache  # noqa: B019 (one workload per run; the float64 recurrence takes seconds)
    def float64_layer0(self) -> tuple[Tensor, Tensor]:
        """Layer 0's outputs [R, HV, V] and the state after the deepest path, float64 on the CPU."""
        inputs = self.layer_inputs(0).map(lambda t: t.detach().cpu().double())
        o64, states64 = gdn_sequential_reference(inputs, self.state0[0].cpu().double(), self.tree)
        return o64, states64[self.deepest]

    def floor_bytes(self) -> dict[str, int]:
        """Fewest bytes: verify reads the durable states and operands and writes outputs and records;
        publish reads and writes the durable states (recorded operands of a path are negligible)."""
        states = _nbytes(self.states)
        inputs = _nbytes(*self.inputs.tensors()[:5])
        records = _nbytes(*(getattr(self.records, f) for f in ("q", "k", "v", "g", "beta")))
        return {"verify": states + inputs + _nbytes(self.o) + records, "publish": 2 * states}


def lumotree_method(
    w: GdnWorkload,
    schedule: str,
    one_launch: bool,
    block_v: int,
    num_warps: int,
    cut_bank: Tensor,
    warm: bool = False,
) -> Method:
    tables = scan_tables(w.tree, w.device, schedule, paths=8, steps=w.tree.max_depth + 1)
    layers = range(w.shape.layers)
    views = [(w.layer_inputs(layer), w.states[layer], w.o[layer], w.layer_records(layer)) for layer in layers]

    def verify() -> None:
        for inputs, state, o, rec in views:
            gdn_scan_(
                inputs, state, tables, o, rec, cut_bank, block_v=block_v, num_warps=num_warps, warm=warm
            )

    def publish() -> None:
        replay_layers_(
            w.states,
            w.records,
            w.accepted,
            w.path_len,
            one_launch=one_launch,
            block_v=block_v,
            num_warps=num_warps,
        )

    launches = "1 launch" if one_launch else f"{w.shape.layers} launches"
    variant = f"{schedule} bv{block_v} w{num_warps}{' warm-up' if warm else ''}"
    return Method(
        name=f"lumotree v2 {variant}, publish {launches}",
        verify=verify,
        publish=publish,
        buffers={
            "cut-state bank (shared by layers)": _nbytes(cut_bank) if schedule == "cut" else 0,
            "operand records (all layers)": _nbytes(*vars(w.records).values()),
            "scan tables": _table_bytes(tables),
        },
    )


def _layout_label(one_launch: bool, layers: int) -> str:
    return f"{layers} instances, one launch" if one_launch else f"{layers} per-layer launches"


def _publish_all(w: GdnWorkload) -> Callable[[], None]:
    """Replay publication of every layer in one launch (the scan's default tiles)."""
    return lambda: replay_layers_(w.states, w.records, w.accepted, w.path_len, one_launch=True)


Scan = Callable[[GdnInputs, Tensor, Tensor, GdnOperands], object]  # inputs, states, o, records


def _verify_layers(w: GdnWorkload, one_launch: bool, stacked: Scan, per_layer: Scan) -> Callable[[], None]:
    """Verify every layer: one call over the stacked layers, or one call per layer."""
    if one_launch:
        return lambda: stacked(w.inputs, w.states, w.o, w.records)
    views = [
        (w.layer_inputs(layer), w.states[layer], w.o[layer], w.layer_records(layer))
        for layer in range(w.shape.layers)
    ]

    def verify() -> None:
        for inputs, state, o, rec in views:
            per_layer(inputs, state, o, rec)

    return verify


def _ancestry_method(
    w: GdnWorkload, one_launch: bool, stacked: Callable, per_layer: Callable, name: str, **buffers: int
) -> Method:
    """A tree-parallel method: its kernels take ancestry tables; replay publication in one launch."""
    tables = ancestry_tables(w.tree, w.device)
    verify = _verify_layers(
        w,
        one_launch,
        lambda x, state, o, rec: stacked(x, state, tables, o, rec),
        lambda x, state, o, rec: per_layer(x, state, tables, o, rec),
    )
    return Method(
        name=f"{name}, {_layout_label(one_launch, w.shape.layers)}",
        verify=verify,
        publish=_publish_all(w),
        buffers={
            "operand records (all layers)": _nbytes(*vars(w.records).values()),
            "ancestry tables": _nbytes(tables.ancestry, tables.n_active),
            **buffers,
        },
    )


def tree_method(
    w: GdnWorkload, one_launch: bool, block_v: int, num_warps: int, precision: str, solve: str
) -> Method:
    """Tree-parallel chunk form (no step loop), fp32 matmuls in `precision`, triangular `solve`."""
    cfg = dict(block_v=block_v, num_warps=num_warps, precision=precision, solve=solve)
    return _ancestry_method(
        w,
        one_launch,
        functools.partial(gdn_tree_layers_, **cfg),
        functools.partial(gdn_tree_, **cfg),
        f"lumotree tree-parallel {precision} {solve} bv{block_v} w{num_warps}",
    )


def value_major_method(w: GdnWorkload, one_launch: bool, **config: object) -> Method:
    """Tree-parallel value-major (`tree_value_major`); config: its keyword arguments."""
    return _ancestry_method(
        w,
        one_launch,
        functools.partial(gdn_value_major_layers_, **config),
        functools.partial(gdn_value_major_, **config),
        f"lumotree tree-parallel value-major {value_major_label(**config)}",
        **{"split-solve scratch P, gamma (all layers)": _split_scratch_bytes(w)},
    )


def _split_scratch_bytes(w: GdnWorkload) -> int:
    """P [R, R] and gamma [R] per value head and layer, fp32, allocated in the graph's pool."""
    rows = max(16, 1 << (w.tree.rows - 1).bit_length())
    return 4 * w.shape.layers * w.shape.v_heads * rows * (rows + 1)


def value_major_label(**config: object) -> str:
    """e.g. "bv128 w4 p2" (+ " r128" with a register cap, " s4" with a 4-stage state loop)."""
    c = config
    label = f"bv{c['block_v']} w{c['num_warps']} p{c['prepare_warps']}"
    label += f" r{c['max_registers']}" if c.get("max_registers") else ""
    return label + (f" s{c['num_stages']}" if c.get("num_stages") else "")


def _table_bytes(tables: ScanTables) -> int:
    return _nbytes(
        *(
            getattr(tables, n)
            for n in (
                "nodes",
                "steps",
                "start",
                "owner",
                "cut_slot",
                "leaf_lo",
                "leaf_hi",
                "leaves",
                "n_active",
            )
        )
    )


def _publish_by_copy(w: GdnWorkload, bank: Tensor, staging: Tensor) -> Callable[[], None]:
    """durable[layer] <- bank[layer, final node] for every layer, through a staging copy (no host sync)."""

    def publish() -> None:
        final = w.accepted.gather(0, w.path_len - 1)
        torch.index_select(bank, 1, final, out=staging)
        w.states.copy_(staging[:, 0])

    return publish


def native_paths_method(
    w: GdnWorkload, bank: Tensor, staging: Tensor, block_v: int | None = None, num_warps: int = 4
) -> Method:
    tables = scan_tables(w.tree, w.device, "store_all", paths=8, steps=w.tree.max_depth + 1)
    views = [
        (w.layer_inputs(layer), w.states[layer], w.o[layer], w.layer_records(layer), bank[layer])
        for layer in range(w.shape.layers)
    ]

    def verify() -> None:
        for inputs, state, o, rec, layer_bank in views:
            gdn_scan_(inputs, state, tables, o, rec, layer_bank, block_v=block_v, num_warps=num_warps)

    return Method(
        "native paths (store every node's state)",
        verify,
        _publish_by_copy(w, bank, staging),
        buffers={"state bank (all layers)": _nbytes(bank), "publication staging": _nbytes(staging)},
    )


def torch_sequential_method(w: GdnWorkload, bank: Tensor, staging: Tensor) -> Method:
    group = w.shape.v_heads // w.shape.heads
    parents = w.tree.parent.tolist()

    def verify() -> None:
        for layer in range(w.shape.layers):
            ops = prepare_operands(w.layer_inputs(layer))
            k, q = ops.k.repeat_interleave(group, dim=1), ops.q.repeat_interleave(group, dim=1)
            decay = torch.exp(ops.g)
            for node in range(w.tree.n_active):
                s = w.states[layer] if parents[node] < 0 else bank[layer, parents[node]]
                s = s * decay[node][:, None, None]
                u = (ops.v[node] - (s * k[node][:, None, :]).sum(-1)) * ops.beta[node][:, None]
                s = s + u[:, :, None] * k[node][:, None, :]
                w.o[layer, node] = (s * q[node][:, None, :]).sum(-1).to(w.dtype)
                bank[layer, node] = s

    return Method(
        "torch sequential (topological order)",
        verify,
        _publish_by_copy(w, bank, staging),
        buffers={"state bank (all layers)": _nbytes(bank), "publication staging": _nbytes(staging)},
    )


def fla_methods(w: GdnWorkload) -> list[Method]:
    """flash-linear-attention's chain kernels over a 32-token chain (rows as chain tokens)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    layers = range(w.shape.layers)
    x = w.inputs
    finals: list[Tensor | None] = [None] * w.shape.layers
    g_log = [
        (-torch.exp(x.A_log[layer]) * F.softplus(x.a[layer].float() + x.dt_bias[layer]))[None]
        for layer in layers
    ]

    def recurrent() -> None:
        for layer in layers:
            _, finals[layer] = fused_recurrent_gated_delta_rule(
                x.q[layer][None],
                x.k[layer][None],
                x.v[layer][None],
                g=x.a[layer][None].float(),
                beta=x.b[layer][None],
                initial_state=w.states[layer][None],
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True,
                A_log=x.A_log[layer],
                dt_bias=x.dt_bias[layer],
                use_beta_sigmoid_in_kernel=True,
                state_v_first=True,
            )

    def chunk() -> None:
        for layer in layers:
            _, finals[layer] = chunk_gated_delta_rule(
                x.q[layer][None],
                x.k[layer][None],
                x.v[layer][None],
                g=g_log[layer],
                beta=x.b[layer][None],
                initial_state=w.states[layer][None],
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
                use_beta_sigmoid_in_kernel=True,
                state_v_first=True,
            )

    def publish() -> None:
        for layer in layers:
            w.states[layer].copy_(finals[layer][0])

    return [
        Method(
            "fla fused_recurrent (32-token chain)",
            recurrent,
            publish,
            note="gates and beta in-kernel; chain of 32, not the tree",
        ),
        Method(
            "fla chunk (32-token chain)",
            chunk,
            publish,
            note="log-decay precomputed outside the timed region; chain of 32, not the tree",
        ),
    ]


def measure_method(w: GdnWorkload, method: Method, timer: Timer, graphs: bool, eager_iters: int) -> dict:
    """verify / publish / total in graph mode (if available) and total eager, all medians in ms."""
    row: dict = {"method": method.name, "note": method.note, "buffers": method.buffers}
    w.states.copy_(w.state0)
    w.set_frontier(0)

    def total() -> None:
        method.verify()
        method.publish()

    row["eager_total"] = timer(total, w.set_frontier, iters=eager_iters).as_dict()
    if graphs:
        for name, fn in (("verify", method.verify), ("publish", method.publish), ("total", total)):
            stage = CapturedStage(fn)
            row[name] = timer(stage.replay, w.set_frontier).as_dict()
    return row


def method_errors(w: GdnWorkload, method: Method) -> dict[str, float]:
    """Layer 0 vs the float64 recurrence: max |output error| over active rows, and max |state error|
    after publishing the deepest accepted path (Table XV's two columns)."""
    w.states.copy_(w.state0)
    w.set_frontier(w.deepest)
    method.verify()
    method.publish()
    o64, state64 = w.float64_layer0()
    n = w.tree.n_active
    out_err = float((w.o[0, :n].double().cpu() - o64[:n]).abs().max())
    state_err = float((w.states[0].double().cpu() - state64).abs().max())
    return {"output_max_abs": out_err, "state_max_abs": state_err}
