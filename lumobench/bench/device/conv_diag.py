"""Where the conv that prepares the GDN operands spent its extra ~1.3 us a launch over the plain conv
(session 19, results/h200/conv-diag.md). Variants of `conv_operands_kernel`, one feature at a time,
over every GDN layer of the 27B in model order in one CUDA graph (as `lumobench bench gdn-forms
--conv-warps`), for the paper tree and one row: the plain `tree_conv_kernel` (bf16 or fp32 output,
one program more a row), the channel block held as [heads, K] as session 18's kernel held it (here
`_head_channels`), and the block kept flat as the engine's kernel keeps it since 9ca593c.

On the device, from the repository root (`carried_wheels.sh` sourced):
    python3 lumobench/bench/device/conv_diag.py              graph timings, a line per variant
    DIAG_NCU=1 ... (bash lumobench/bench/device/ncu_conv.sh)  eager launches, 4 layers a variant
    DIAG_SASS=1 python3 lumobench/bench/device/conv_diag.py  the device compile's layouts and loads
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lumobench.bench.timing import Timer
from lumobench.checks.random_trees import paper_tree
from lumotree.drafting.geometry import GeometryConfig
from lumotree.model.random_weights import preset_config
from lumotree.tree import MAX_DEPTH, TreeDescriptor, chain_tree
from lumotree.verify.conv.fused_conv import tree_conv_, tree_conv_kernel, tree_conv_row
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.prepare import BLOCK_C, prepared_channels, store_gates, store_operands
from lumotree.verify.graphs import CapturedStage

sys.path.insert(0, "tests/kernel_tests")
from hopper_aot import sass_of  # the sm_90 compile helpers live beside their test

NCU = os.environ.get("DIAG_NCU") == "1"
SASS = os.environ.get("DIAG_SASS") == "1"
FEATURES = ("RECORD", "NORM", "GATES", "SPLIT_STORE")
SASS_VARIANTS = (
    "plain conv (tree_conv_)",
    "[heads, K]: nothing (fp32 store)",
    "flat: all (the engine's kernel since 9ca593c)",
)


@triton.jit
def _head_channels(block, K: tl.constexpr, BC: tl.constexpr):
    """Session 18's channel offsets [BC // K, K] of block `block`: one key head a row."""
    return block * BC + tl.arange(0, BC // K)[:, None] * K + tl.arange(0, K)[None, :]


@triton.jit
def _prepared_heads(y, offs_c, HK: tl.constexpr):
    """Session 18's `prepared_channels` on a [heads, K] block: the same arithmetic, no reshape."""
    K: tl.constexpr = y.shape[1]
    normed = y * tl.rsqrt(tl.sum(y * y, axis=1) + 1e-6)[:, None]
    normed = tl.where(offs_c < HK, normed * (K**-0.5), normed)
    return tl.where(offs_c < 2 * HK, normed, y)


@triton.jit
def diag_kernel(
    x_ptr, state_ptr, w_ptr, gather_ptr, record_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, rq_ptr, rk_ptr,
    rv_ptr, rg_ptr, rb_ptr, y_ptr, C, stride_x, stride_ab, W: tl.constexpr, HK: tl.constexpr,
    K: tl.constexpr, HVV: tl.constexpr, HV: tl.constexpr, HVP: tl.constexpr, BC: tl.constexpr,
    RECORD: tl.constexpr, NORM: tl.constexpr, GATES: tl.constexpr, SPLIT_STORE: tl.constexpr,
    FLAT: tl.constexpr,
):  # fmt: skip
    """`conv_operands_kernel` with each feature switchable, its block flat or [heads, K]."""
    r = tl.program_id(0)
    block = tl.program_id(1)
    if block * BC < C:
        offs_c = block * BC + tl.arange(0, BC) if FLAT else _head_channels(block, K, BC)
        y = tree_conv_row(
            x_ptr, state_ptr, w_ptr, w_ptr, gather_ptr, record_ptr, r, offs_c, C, stride_x, W, False, RECORD
        )
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
        if NORM:
            y = prepared_channels(y, offs_c, HK, K) if FLAT else _prepared_heads(y, offs_c, HK)
        if SPLIT_STORE:
            store_operands(y, offs_c, offs_c < C, r, rq_ptr, rk_ptr, rv_ptr, HK, HVV)
        else:
            tl.store(y_ptr + r * C + offs_c, y, mask=offs_c < C)
    elif GATES:
        store_gates(a_ptr, b_ptr, stride_ab, alog_ptr, dtb_ptr, rg_ptr, rb_ptr, r, HV, HVP)


def variants() -> dict[str, dict | None]:
    """Launch flags by name (None: `tree_conv_` itself)."""
    off = dict.fromkeys(FEATURES, False)
    on = dict.fromkeys(FEATURES, True)
    table: dict[str, dict | None] = {
        "plain conv (tree_conv_)": None,
        "plain kernel, bf16 store, direct launch": dict(PLAIN="bf16", EXTRA=0),
        "plain kernel, fp32 store": dict(PLAIN="fp32", EXTRA=0),
        "plain kernel, bf16 store, one program more a row": dict(PLAIN="bf16", EXTRA=1),
        "[heads, K]: nothing, no gates program": dict(off, EXTRA=0, FLAT=False),
        "[heads, K]: nothing (fp32 store)": dict(off, FLAT=False),
    }
    for feature in FEATURES:
        table[f"[heads, K]: + {feature.lower()}"] = dict(off, **{feature: True}, FLAT=False)
    table["[heads, K]: all (session 18's kernel)"] = dict(on, FLAT=False)
    table["flat: nothing"] = dict(off, FLAT=True)
    table["flat: + norm"] = dict(off, NORM=True, FLAT=True)
    table["flat: all (the engine's kernel since 9ca593c)"] = dict(on, FLAT=True)
    return table


def print_compiles() -> None:
    """Each compiled variant's layouts and its global loads, stores, barriers and shuffles."""
    for kernel in (tree_conv_kernel, diag_kernel):
        for key, compiled in kernel.device_caches[0][0].items():
            print("=== SASS", kernel.fn.__name__, str(key)[-300:])
            print("\n".join(line for line in compiled.asm["ttgir"].splitlines() if line.startswith("#")))
            body = [line.strip() for line in sass_of(compiled.asm["cubin"]).splitlines() if "/*0" in line]
            print(len(body), "instructions")
            print("\n".join(line for line in body if any(op in line for op in ("LDG", "STG", "BAR", "SHFL"))))


@dataclass
class Layers:
    """Every GDN layer's conv inputs and outputs for one row set, at the 27B's shapes."""

    rows: int
    gather: torch.Tensor
    tensors: list[tuple]
    alog: torch.Tensor
    dt_bias: torch.Tensor
    heads: int
    v_heads: int
    dk: int
    dv: int

    @property
    def channels(self) -> int:
        return 2 * self.heads * self.dk + self.v_heads * self.dv


def build_layers(tree: TreeDescriptor, count: int, dev: torch.device, gen: torch.Generator) -> Layers:
    """`count` layers of random conv inputs (bf16) and uninitialised outputs over `tree`'s rows."""
    cfg = preset_config("qwen3.5-27b")
    h, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    rows, channels = tree.rows, 2 * h * dk + hv * dv

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=dev).bfloat16()

    tensors = []
    for _ in range(count):
        outs = [torch.empty(rows, n, device=dev) for n in (h * dk, h * dk, hv * dv, hv, hv, channels)]
        x = randn(rows, channels)
        tensors.append(
            (x, randn(channels, 3), randn(channels, 4), randn(rows, 2 * hv), outs, torch.empty_like(x))
        )
    gather = DeviceTree(rows, MAX_DEPTH, dev).load_(tree).conv_gather
    alog, dt_bias = torch.randn(hv, device=dev), torch.randn(hv, device=dev)
    return Layers(rows, gather, tensors, alog, dt_bias, h, hv, dk, dv)


def run(layers: Layers, flags: dict | None) -> None:
    """Every layer's conv, the variant `flags` names (`variants`)."""
    n, hv = layers.channels, layers.v_heads
    for x, state, w, ab, (q, k, v, g, beta, y), record in layers.tensors:
        if flags is None:
            tree_conv_(x, state, w, None, layers.gather, record)
        elif "PLAIN" in flags:  # tree_conv_kernel launched directly: output dtype, extra programs
            tree_conv_kernel[(layers.rows, triton.cdiv(n, BLOCK_C) + flags["EXTRA"])](
                x, state, w, w, layers.gather, y if flags["PLAIN"] == "fp32" else record, n, x.stride(0),
                W=4, HAS_BIAS=False, BC=BLOCK_C, enable_fp_fusion=False,
            )  # fmt: skip
        else:
            launch = {f: on for f, on in flags.items() if f != "EXTRA"}
            diag_kernel[(layers.rows, triton.cdiv(n, BLOCK_C) + flags.get("EXTRA", 1))](
                x, state, w, layers.gather, record, ab[:, :hv], ab[:, hv:], layers.alog, layers.dt_bias, q, k,
                v, g, beta, y, n, x.stride(0), ab.stride(0), W=4, HK=layers.heads * layers.dk, K=layers.dk,
                HVV=hv * layers.dv, HV=hv, HVP=triton.next_power_of_2(hv), BC=BLOCK_C,
                enable_fp_fusion=False, num_warps=4, **launch,
            )  # fmt: skip


def main() -> None:
    dev = torch.device("cuda")
    timer = Timer(dev, 50, 10)
    gen = torch.Generator(device=dev).manual_seed(2)
    table = variants()
    paper = paper_tree(
        random.Random(0), preset_config("qwen3.5-27b").vocab_size, 4096, GeometryConfig(rows=32)
    )
    print("variant | rows | ms (48 layers)")
    for rows_name, tree in (("tree", paper), ("one row", chain_tree([0], prefix_len=4096))):
        layers = build_layers(tree, 4 if NCU else 48, dev, gen)
        if SASS:
            for name in SASS_VARIANTS:
                run(layers, table[name])
            print_compiles()
            return
        for name, flags in table.items():
            run(layers, flags)
            torch.cuda.synchronize()
            if NCU:  # eager launches only, for the profiler (4 layers a variant, in this order)
                print(f"ncu: {name} | {rows_name}")
                continue
            ms = timer(CapturedStage(lambda f=flags, lay=layers: run(lay, f)).replay).median_ms
            print(f"{name} | {rows_name} | {ms:.3f}")


main()  # a device script run by path, like the shell scripts beside it (not a `lumobench bench` verb)
