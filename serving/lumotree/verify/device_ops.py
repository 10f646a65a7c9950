"""The `triton` kernel set's entry points: the reference signatures, with the tree given as a
`DeviceTree` (static device tables) and the accepted path as device tensors (the walk's outputs).

Row invariance: a verified row gets the bits the one-row (AR) step gets for the same token at the
same position, whatever the other rows of its tree, in every op family here and in the fused
projections (`lumobench.bench.row_invariance` checks each on the GPU). So the speculative arms emit
the AR arm's tokens in bfloat16 too, where a last-bit difference tips a near-tied sample now and then.

Each function calls the caller-owned form of its op family's Triton kernel and reads every
per-cycle value from device memory, so a forward or a publication built from them can be captured
once in a CUDA graph and replayed for later trees: no host value of the tree enters a launch.
Outputs are allocated per call (inside a captured graph they come from the graph's pool).

- GDN verification in model order, per layer: `row_scan.gdn_rows_` (every row carried down its
  ancestry with the replay's arithmetic, the AR step's bits, one launch: the engine's choice for
  one row), `paths_scan.gdn_paths_` (the same bits, one launch, one program per path of the
  tree's first-child decomposition: the engine's choice for chains and trees over large states,
  `GdnConfig.for_device`), or
  `tree_scan.gdn_tree_` (the tree WY form: all rows solved at once, other rounding);
- the forward's GDN layers: `conv_operands` (the tree conv with the scans' operands prepared in
  its epilogue, `fused_conv.conv_operands_`) then `gdn_scan` (the row or paths scan over them);
- tree conv `fused_conv.tree_conv_`; KV writes at prefix_len + slot_map (`decode.write_kv_`, K
  and V in one launch);
- tree attention `decode.tree_attention_` (split-K over the committed keys, grouped heads, each
  row's last keys and tree slots walked in logical order), with a query tile and partitions fixed
  per model and cache, whatever the rows verified (`partitions=N` spreads the prefix instead, for
  the MTP drafter, whose drafts need no AR bits);
- publication: all GDN layers' replay in one launch (`replay.replay_layers_` on the stacked
  state bank), all their conv states in one launch (`fused_conv.publish_conv_layers_` on the conv
  bank), `decode.publish_kv_device_` per attention layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.verify.attention.decode import (
    AttentionConfig,
    cache_partitions,
    fitted_query_tile,
    partial_buffers,
    partial_dtype,
    publish_kv_device_,
    short_partitions,
    tree_attention_,
    write_kv_,
)
from lumotree.verify.conv.fused_conv import (
    conv_operands_,
    publish_conv_layers_,
    publish_conv_state_,
    tree_conv_,
)
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.paths_scan import gdn_paths_, gdn_paths_prepared_
from lumotree.verify.gdn.reference import GateInputs, GdnInputs, GdnOperands, GdnVerifyResult
from lumotree.verify.gdn.replay import replay_accepted_, replay_layers_
from lumotree.verify.gdn.row_scan import gdn_rows_, gdn_rows_prepared_
from lumotree.verify.gdn.tree_scan import gdn_tree_

GDN_FORMS = ("rows", "paths", "wy")
# The paths scan beats the row scan where the state work outweighs the row scan's parallelism:
# measured on the H200 (results/h200/gdn-forms*.md, every GDN layer in model order in one graph) for
# the paper tree, 48 layers of Qwen3.5-27B (3 MiB states) 1.465 ms against 3.385, and MTP-5's chain
# 0.490 against 0.797 (the spine scan it replaced: 1.988 and 0.651); 6 layers of the shipped model
# (64 KiB states) 0.092 against 0.061 and 0.051 against 0.044 (e24c5fa, siblings in the spine's
# program). One-row steps keep the row scan.
PATHS_MIN_STATE_BYTES = 2**20
PATHS_MIN_ROWS = 2
# Trees of this many rows or more cap the paths scan at PATHS_TREE_REGISTERS a thread (more walks
# resident an SM, the same arithmetic): the paper tree at 27B 1.406 ms against 1.462 uncapped, MTP-5's
# chain 0.496 against 0.488 (results/h200/gdn-forms.md, session 14), so chains stay uncapped.
PATHS_TREE_ROWS = 16
PATHS_TREE_REGISTERS = 128


@dataclass(frozen=True)
class GdnConfig:
    """The per-layer GDN verification: form "rows" (the row scan, AR's bits), "paths" (the paths
    scan: the row scan's bits, one launch, one program per path of the tree's first-child
    decomposition, no state saved) or "wy" (the tree WY kernel, whose launch settings
    follow: see tree_scan.py and NOTES, on the H200 the fastest per-layer form measured was tf32x3,
    64-wide value tiles, 8 warps)."""

    form: str = "rows"
    block_v: int = 64
    num_warps: int = 8
    precision: str = "tf32x3"
    solve: str = "substitution"
    max_registers: int | None = None  # the paths scan's register cap (None: the compiler's choice)

    @classmethod
    def for_device(cls, device: torch.device, rows: int = 1, state_bytes: int = 0) -> GdnConfig:
        """The engine's choice for `rows` verified rows over a layer state of `state_bytes`: on CUDA
        the paths scan for PATHS_MIN_ROWS rows or more (MTP-5's chain and the trees) over large
        states, its registers capped for trees of PATHS_TREE_ROWS rows or more, else the row scan
        (the same bits either way), the WY settings tf32x3; on a CPU (the interpreter) the row scan
        and exact fp32."""
        if device.type == "cuda":
            if rows < PATHS_MIN_ROWS or state_bytes < PATHS_MIN_STATE_BYTES:
                return cls(form="rows")
            return cls(form="paths", max_registers=PATHS_TREE_REGISTERS if rows >= PATHS_TREE_ROWS else None)
        return cls(block_v=32, num_warps=4, precision="ieee")

    def __post_init__(self) -> None:
        if self.form not in GDN_FORMS:
            raise ValueError(f"the GDN form must be one of {', '.join(GDN_FORMS)}, got {self.form!r}")


def tree_conv(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, tree: DeviceTree) -> Tensor:
    """x [R, C] pre-conv inputs (rows may be strided), conv_state [C, W-1], weight [C, W] -> y [R, C]
    (x's dtype, contiguous)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    tree_conv_(
        x,
        conv_state.to(x.dtype).contiguous(),
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        tree.conv_gather,
        y,
    )
    return y


def conv_operands(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    tree: DeviceTree,
    gates: GateInputs,
    record: Tensor,
    ops: GdnOperands,
) -> None:
    """A GDN layer's tree conv with the scans' operands prepared in the same launch: x [R, C]
    pre-conv [q | k | v] inputs (rows may be strided), conv_state [C, W-1], weight [C, W] -> the
    records `ops` (contiguous fp32 of one layer: `check_records`; e.g. a layer's slices of stacked
    banks that `replay` then reads in place) and x's rows in `record` (contiguous [R, C], for the
    conv publication, which reads a bank of them in place too)."""
    state = conv_state.to(x.dtype).contiguous()
    conv_operands_(x, state, weight.contiguous(), tree.conv_gather, gates, record, ops)


def gdn_scan(
    ops: GdnOperands,
    state: Tensor,
    tree: DeviceTree,
    dtype: torch.dtype,
    config: GdnConfig | None = None,
    advance: bool = False,
) -> Tensor:
    """One layer's verification from prepared records (`conv_operands`'s): the row scan or the paths
    scan (`config.form`, default `GdnConfig.for_device`; the same bits either way) -> o [R, HV, V]
    in `dtype` (the layer's). advance: the one-row tree of an AR step, whose state the row scan
    advances in place (`gdn_rows_prepared_`)."""
    rows = ops.q.shape[0]
    cfg = config or GdnConfig.for_device(ops.q.device, rows, state.numel() * state.element_size())
    o = torch.empty(ops.v.shape, dtype=dtype, device=ops.v.device)
    if advance:
        if cfg.form != "rows":
            raise ValueError(f"the state advances in place in the row scan, not form {cfg.form!r}")
        gdn_rows_prepared_(ops, state, tree.gdn, o, advance=True)
    elif cfg.form == "paths":
        gdn_paths_prepared_(ops, state.contiguous(), tree.gdn, o, cfg.max_registers)
    elif cfg.form == "rows":
        gdn_rows_prepared_(ops, state.contiguous(), tree.gdn, o)
    else:
        raise ValueError(f"prepared records are read by the row and paths scans, not form {cfg.form!r}")
    return o


def gdn_verify(
    x: GdnInputs, state: Tensor, tree: DeviceTree, config: GdnConfig | None = None
) -> GdnVerifyResult:
    """One layer's verification from raw inputs (the row scan, the paths scan or the tree WY kernel:
    `config.form`): records every row's operands (fp32), no cut states (publication replays from
    the records)."""
    rows, heads, dk = x.q.shape
    hv, dv = x.v.shape[1], x.v.shape[2]
    cfg = config or GdnConfig.for_device(x.q.device, rows, state.numel() * state.element_size())
    ops = empty_operands(rows, heads, hv, dk, dv, x.q.device)
    o = torch.empty_like(x.v)
    if cfg.form == "rows":  # the scans read column slices of the conv and projection outputs in place
        gdn_rows_(x, state.contiguous(), tree.gdn, o, ops)
        return GdnVerifyResult(o=o, operands=ops, cut_states=state.new_empty((0, hv, dv, dk)))
    if cfg.form == "paths":
        gdn_paths_(x, state.contiguous(), tree.gdn, o, ops, cfg.max_registers)
        return GdnVerifyResult(o=o, operands=ops, cut_states=state.new_empty((0, hv, dv, dk)))
    gdn_tree_(
        x.map(Tensor.contiguous),
        state.contiguous(),
        tree.gdn,
        o,
        ops,
        block_v=min(cfg.block_v, dv),
        num_warps=cfg.num_warps,
        precision=cfg.precision,
        solve=cfg.solve,
    )
    return GdnVerifyResult(o=o, operands=ops, cut_states=state.new_empty((0, hv, dv, dk)))


def write_tree_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, tree: DeviceTree) -> None:
    """Write the tree's k, v [R, Hkv, D] at cache rows prefix_len + slot_map (device index): one launch."""
    write_kv_(k_cache, v_cache, k, v, tree.slot_map, tree.prefix_len)


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    tree: DeviceTree,
    partitions: int | None = None,
    gate: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """q [R, Hq, D] against the committed prefix and the tree rows it may see -> (o, lse); with the
    output gate [R, Hq, D] (pre-sigmoid), o is already gated (`decode.tree_attention_`).

    partitions: None for the cache's fixed partitions (a row's bits equal the AR step's at its
    position); a count to spread whatever prefix there is over that many (a short context keeps
    every multiprocessor busy; for callers without the row-invariance contract), with a query tile
    of the grouped rows' height (16 to the config's)."""
    rows, hq, dim = q.shape
    hkv = k_cache.shape[1]
    config = AttentionConfig.for_dtype(q.dtype)  # one query tile for every row count (the MMA's shape)
    if partitions is not None:  # no bits to keep: one MTP row's 6 grouped rows take a 16-row tile
        # (~1.7 us a layer shorter at 4K than 64 rows: results/h200/attention.md, session 16)
        config = fitted_query_tile(config, rows * (hq // hkv))
    # fixed by the cache: a row's bits follow them
    splits = cache_partitions(k_cache.shape[0]) if partitions is None else partitions
    short = short_partitions(k_cache.shape[0]) if partitions is None else 0
    o = torch.empty_like(q)
    lse = torch.empty((rows, hq), dtype=torch.float32, device=q.device)
    o_part, lse_part = partial_buffers(
        rows, hq, hkv, dim, splits, config.block_m, q.device, partial_dtype(q.dtype)
    )
    tree_attention_(
        q.contiguous(),
        k_cache,
        v_cache,
        tree.bits,
        tree.prefix_len,
        o,
        lse,
        o_part,
        lse_part,
        splits,
        1.0 / math.sqrt(dim),
        config,
        by_prefix=partitions is not None,
        short=short,
        gate=gate,
    )
    return o, lse


def gated_tree_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, tree: DeviceTree, gate: Tensor
) -> Tensor:
    """`tree_attention` with the output gate applied by its merge: o * sigmoid(gate) [R, Hq, D]."""
    return tree_attention(q, k_cache, v_cache, tree, gate=gate)[0]


def replay(
    states: Sequence[Tensor], operands: Sequence[GdnOperands], accepted: Tensor, path_len: Tensor | int
) -> None:
    """Publish every GDN layer: one launch over the stacked bank when the states are its views
    (`HybridLM.new_state` makes them so), the records read in place when they are one bank's slices
    (the device forward's `RecordBanks`), else stacked; else one launch per layer."""
    bank = stacked_view(states)
    length = torch.as_tensor(path_len, dtype=torch.int64, device=accepted.device).reshape(1)
    if bank is None:
        for state, ops in zip(states, operands, strict=True):
            replay_accepted_(state, ops, accepted, length)
        return
    k, v, g, beta = (stacked([getattr(ops, f) for ops in operands]) for f in ("k", "v", "g", "beta"))
    replay_layers_(bank, GdnOperands(k, k, v, g, beta), accepted, length)  # replay never reads q


def stacked(tensors: Sequence[Tensor]) -> Tensor:
    """The tensors as one [N, ...] tensor: the bank they are consecutive slices of (no copy), else
    their torch.stack."""
    bank = stacked_view(tensors)
    return torch.stack(list(tensors)) if bank is None else bank


def stacked_view(tensors: Sequence[Tensor]) -> Tensor | None:
    """A [N, ...] view of the memory that `tensors` tile as consecutive equal contiguous slices (a
    bank's leading-dim slices, in order), if they do: writes through it reach the tensors. Found
    from their storage, not from autograd's view tracking, which inference mode switches off."""
    if not tensors or not tensors[0].is_contiguous():
        return None
    first = tensors[0]
    storage, step = first.untyped_storage().data_ptr(), first.numel() * first.element_size()
    for i, t in enumerate(tensors):
        if (
            t.shape != first.shape
            or t.dtype != first.dtype
            or t.device != first.device
            or not t.is_contiguous()
            or t.untyped_storage().data_ptr() != storage
            or t.data_ptr() != first.data_ptr() + i * step
        ):
            return None
    return first.as_strided((len(tensors), *first.shape), (first.numel(), *first.stride()))


def publish_conv(conv_state: Tensor, x: Tensor, accepted: Tensor, path_len: Tensor | int) -> None:
    """conv_state [C, W-1] <- the last W-1 inputs along the accepted path (fused kernel)."""
    publish_conv_state_(conv_state, x, accepted, path_len)


def publish_conv_layers(
    states: Sequence[Tensor], xs: Sequence[Tensor], accepted: Tensor, path_len: Tensor | int
) -> None:
    """Every GDN layer's conv publication: one launch over the conv bank when the states are its
    views (`HybridLM.new_state` makes them so), reading the inputs in place when they are one bank's
    slices (the device forward's `RecordBanks`), else stacked; else one launch per layer."""
    bank = stacked_view(states)
    if bank is None:
        for state, x in zip(states, xs, strict=True):
            publish_conv_state_(state, x, accepted, path_len)
        return
    length = torch.as_tensor(path_len, dtype=torch.int64, device=accepted.device).reshape(1)
    publish_conv_layers_(bank, stacked(xs), accepted, length)


def publish_kv_layers(
    k_caches: Sequence[Tensor],
    v_caches: Sequence[Tensor],
    tree: DeviceTree,
    accepted: Tensor,
    path_len: Tensor | int,
) -> None:
    """Every attention layer's KV publication: one launch over the K and V banks when the caches are
    their views (`HybridLM.new_state` makes them so), else one launch per layer."""
    k_bank, v_bank = stacked_view(k_caches), stacked_view(v_caches)
    if k_bank is None or v_bank is None:
        for k_cache, v_cache in zip(k_caches, v_caches, strict=True):
            publish_kv(k_cache, v_cache, tree, accepted, path_len)
        return
    publish_kv(k_bank, v_bank, tree, accepted, path_len)


def publish_kv(
    k_cache: Tensor, v_cache: Tensor, tree: DeviceTree, accepted: Tensor, path_len: Tensor | int
) -> bool:
    """Move the accepted path's KV rows to contiguous positions (device remap; always launched, so
    the result says nothing about whether rows moved: True)."""
    length = torch.as_tensor(path_len, dtype=torch.int64, device=accepted.device).reshape(1)
    publish_kv_device_(k_cache, v_cache, tree.slot_map, tree.prefix_len, accepted, length)
    return True
