"""Compile Triton kernels for Hopper (sm_90) ahead of time, without a GPU; run as a script.

Run with TRITON_INTERPRET unset (the interpreter replaces @triton.jit functions). Prints one JSON
object: for every kernel, {"ok": bool, "error": str, "wgmma": bool (wgmma in its PTX), "tma": bool
(tensor-memory copies in its PTX), "shared_bytes": int (static shared memory), "registers": int,
"spill_bytes": int (spill stores, from Triton's ptxas run again with -v)}.
"""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from lumotree.drafting import device_tree_drafter as tree_drafter
from lumotree.model.fused import elementwise, skinny_gemm
from lumotree.verify import device_ops, device_tree
from lumotree.verify.attention import decode as attention
from lumotree.verify.conv import fused_conv
from lumotree.verify.gdn import paths_scan, prepare, replay, row_scan, tree_scan, tree_value_major

HOPPER = GPUTarget("cuda", 90, 32)
QWEN = dict(H=16, HV=48, K=128)
TYPES = {
    "R": "i32",
    "anc_ptr": "*i32",
    "nactive_ptr": "*i32",
    "end_ptr": "*i32",
    "start_ptr": "*i32",
    "leaf_parent_ptr": "*i32",
    "leaf_walk_ptr": "*i32",
    "count_ptr": "*i32",
}
TYPES |= {name: "i64" for name in ("stride_qk", "stride_v", "stride_ab", "stride_param", "stride_state")}
TYPES |= {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "a_ptr", "b_ptr", "o_ptr")}
TYPES |= {name: "*bf16" for name in ("x_ptr", "w_ptr", "y_ptr", "r_ptr")}
TYPES |= {name: "i32" for name in ("M", "N", "K", "stride_xm", "stride_ym", "stride_rm", "k_per_split")}
# Arguments the launcher specializes as divisible by 16 at Qwen shapes (16-byte aligned pointers, K and
# strides multiples of 16): without that the compiler cannot vectorize the weight loads nor pipeline them.
SKINNY_DIVISIBLE = (
    "x_ptr",
    "w_ptr",
    "y_ptr",
    "r_ptr",
    "N",
    "K",
    "stride_xm",
    "stride_ym",
    "stride_rm",
    "k_per_split",
)
TV = tree_value_major
KERNELS = {
    "value-major prepare": (
        TV.gdn_tree_prepare_kernel,
        dict(QWEN, RP=32, LEVELS=TV.BLOCK_LEVELS, MERGES=2, PRECISION="tf32x3"),
        dict(num_warps=TV.DEFAULT_PREPARE_WARPS),
    ),
    "value-major apply": (
        TV.gdn_tree_apply_kernel,
        dict(QWEN, V=128, BV=TV.DEFAULT_BLOCK_V, RP=32, BK=TV.DEFAULT_BLOCK_K, PRECISION="tf32x3"),
        dict(num_warps=TV.DEFAULT_NUM_WARPS, num_stages=TV.DEFAULT_NUM_STAGES),
    ),
    "tree-parallel": (
        tree_scan.gdn_tree_kernel,
        dict(QWEN, V=128, BV=64, RP=32, BK=32, ROUNDS=11, PRODUCT=False, PRECISION="tf32x3"),
        dict(num_warps=8),
    ),
    "row scan": (row_scan.gdn_rows_kernel, dict(QWEN, V=128, BV=8, RP=32), dict(num_warps=1)),
    "paths scan": (paths_scan.gdn_paths_kernel, dict(QWEN, V=128, BV=8, RP=32, PATHS=8), dict(num_warps=1)),
    "paths scan, tree register cap": (
        paths_scan.gdn_paths_kernel,
        dict(QWEN, V=128, BV=8, RP=32, PATHS=8),
        dict(num_warps=1, maxnreg=device_ops.PATHS_TREE_REGISTERS),
    ),
}
# the GDN operands prepared once a node: on their own, and in the 27B layer's tree conv (10240 channels)
TYPES |= {"gather_ptr": "*i64", "record_ptr": "*bf16", "C": "i32", "stride_x": "i64"}
PREPARED = dict(HK=16 * 128, K=128, HVV=48 * 128, HV=48, HVP=64, BC=prepare.channel_block(128))
KERNELS["gdn prepare"] = (
    prepare.prepare_kernel,
    PREPARED,
    dict(num_warps=prepare.PREPARE_WARPS, enable_fp_fusion=False),
)
KERNELS["tree conv, operands prepared"] = (
    fused_conv.conv_operands_kernel,
    dict(PREPARED, W=4),
    dict(num_warps=prepare.PREPARE_WARPS, enable_fp_fusion=False),
)
# The configs SkinnyConfig.for_shape picks at the Qwen3.5-27B shapes, with 16- and 32-row tiles.
for block_n, block_k, tiles, splits in (
    (128, 64, 1, 1),
    (128, 64, 2, 1),
    (64, 128, 1, 1),
    (64, 128, 2, 1),
    (64, 128, 1, 3),
    (64, 128, 2, 3),
):
    KERNELS[f"skinny n{block_n} k{block_k} t{tiles}{' split' if splits > 1 else ''}"] = (
        skinny_gemm.skinny_gemm_kernel,
        dict(
            ROWS=16 * tiles,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            EVEN_K=True,
            PRECISION="tf32",
            SPLITS=splits,
            RESIDUAL=splits
            > 1,  # the split shapes include the MLP's down projection, which adds the residual
        ),
        dict(num_warps=4, num_stages=3),
        SKINNY_DIVISIBLE,
    )
# the MLP's gate-up with the SwiGLU epilogue: half of a 128-wide block's columns, gate and up tiles
for tiles in (1, 2):
    KERNELS[f"skinny swiglu n64 k64 t{tiles}"] = (
        skinny_gemm.skinny_gemm_kernel,
        dict(
            ROWS=16 * tiles,
            BLOCK_N=64,
            BLOCK_K=64,
            EVEN_K=True,
            PRECISION="tf32",
            SPLITS=1,
            RESIDUAL=False,
            SWIGLU=True,
        ),
        dict(num_warps=4, num_stages=3),
        SKINNY_DIVISIBLE,
    )
# The device tree drafter's launches at the paper geometry (5-depth spine, top-3, tail 6, rescues 4
# and 2, 32 rows, depth 11), keys of 2 tokens, matches to 24, 32 occurrences a key, 4096-token blocks
TYPES |= {
    f"{name}_ptr": "*i64"
    for name in (
        "hist", "hist_len", "cache", "cache_len", "spine", "emitted", "path_len", "topk", "picked",
        "picked_len", "rescue_lens", "feed", "merges",
    )
}  # fmt: skip
TYPES |= {"counts_ptr": "*i32", "ends_ptr": "*i32"}
KERNELS["tree drafter append"] = (
    tree_drafter.append_history_kernel,
    dict(CAP=33792, WP=16),
    dict(num_warps=1),
)
KERNELS["tree drafter scan"] = (
    tree_drafter.suffix_scan_kernel,
    dict(DEPTH=5, K=2, PK=32, BLOCK=4096, NBH=9, NBP=64),
    dict(num_warps=4),
)
KERNELS["tree drafter pick"] = (
    tree_drafter.suffix_pick_kernel,
    dict(
        DEPTH=5,
        K=2,
        MAXM=24,
        MAXMP=32,
        PER_KEY=32,
        PK=32,
        NBP=64,
        TAIL=6,
        MAXD=11,
        CANDIDATES=4,
        LENP=16,
        NCP=4,
    ),
    dict(num_warps=4),
)
KERNELS["tree drafter assemble"] = (
    tree_drafter.paper_tree_kernel,
    dict(DEPTH=5, KTOP=3, SIBS=2, TAIL=6, N_RESCUE=2, R=32, RP=32, MAXD=11, LENP=16, NCP=4, PAD=0),
    dict(num_warps=1),
)
# Tree attention at the 27B's heads (24 query, 4 KV, head dim 128), the engine's tiles
TYPES |= {"bits_ptr": "*i64", "prefix_ptr": "*i64", "qk_scale": "fp32", "chunk": "i32", "shorts": "i32"}
TYPES |= {name: "i64" for name in ("stride_qr", "stride_qh", "stride_kt")} | {"programs": "i32"}
TYPES |= {"o_part_ptr": "*bf16"}  # the partials in the activations' dtype (`partial_dtype`)
ATTENTION = dict(G=6, D=128, BM=64, MPAD=192, HKV=4, TAIL=attention.TAIL_KEYS)
# the tails in the split-K's launch; K and V tiles by descriptor (2-byte caches)
TAILS = dict(GP=16, TP=16, RP=attention.BITSET_SLOTS, SPLIT=22, DESCRIPTORS=True)
KERNELS["tree attention partial"] = (
    attention.tree_attention_partial_kernel,
    dict(ATTENTION, **TAILS, BN=32, PRECISION="tf32", BY_PREFIX=False, SHORT=attention.SHORT_KEYS),
    dict(num_warps=8, num_stages=2),
)
KERNELS["tree attention partial, by prefix"] = (
    attention.tree_attention_partial_kernel,
    dict(ATTENTION, **TAILS, BN=32, PRECISION="tf32", BY_PREFIX=True, SHORT=attention.SHORT_KEYS),
    dict(num_warps=8, num_stages=2),
)
ATTENTION_DIVISIBLE = ("q_ptr", "k_ptr", "v_ptr", "bits_ptr", "prefix_ptr", "o_part_ptr", "lse_part_ptr")
ATTENTION_DIVISIBLE += ("stride_qr", "stride_qh", "stride_kt", "chunk", "shorts")
# the engine's split-K at Qwen3.5-27B's attention (24 query and 4 KV heads of 256 dims, bf16 caches)
KERNELS["tree attention partial, 27B tiles"] = (
    attention.tree_attention_partial_kernel,
    dict(ATTENTION, **TAILS, D=256, BN=64, PRECISION="tf32", BY_PREFIX=False, SHORT=attention.SHORT_KEYS),
    dict(num_warps=4, num_stages=3),
    # what the launcher specializes at these shapes: allocations 16-byte aligned, strides and the
    # partition rows multiples of 16
    ATTENTION_DIVISIBLE,
)
# float32 caches at the 27B's heads: exact dots, 32-key tiles in 2 stages, masked loads (from the
# descriptors' tiles Triton 3.6 compiled them to 32 registers and 35-78 KB of spills)
KERNELS["tree attention partial, fp32"] = (
    attention.tree_attention_partial_kernel,
    {**ATTENTION, **TAILS, "D": 256, "BN": 32, "PRECISION": "ieee", "BY_PREFIX": False}
    | {"SHORT": attention.SHORT_KEYS, "DESCRIPTORS": False},
    dict(num_warps=4, num_stages=2),
    ATTENTION_DIVISIBLE,
    {name: "*fp32" for name in ("q_ptr", "k_ptr", "v_ptr", "o_part_ptr")},
)
# float32 at 64-key tiles in 2 stages on 8 warps (tests/kernel_tests/test_gpu_parity.py's second
# attention config), by masked loads as the launcher takes 4-byte tiles on the GPU
KERNELS["tree attention partial, fp32 BN64"] = (
    attention.tree_attention_partial_kernel,
    {**KERNELS["tree attention partial, fp32"][1], "BN": 64},
    dict(num_warps=8, num_stages=2),
    ATTENTION_DIVISIBLE,
    {name: "*fp32" for name in ("q_ptr", "k_ptr", "v_ptr", "o_part_ptr")},
)
# attention's q and k norms with RoPE in one launch (head dim 256, a quarter of it rotated)
TYPES |= {name: "*bf16" for name in ("wa_ptr", "wb_ptr", "ya_ptr", "yb_ptr")}
TYPES |= {name: "i64" for name in ("sa_r", "sa_h", "sb_r", "sb_h", "sc_r", "ss_r")}
TYPES |= {"heads_a": "i32", "D": "i32", "eps": "fp32"}
KERNELS["norm rope pair"] = (elementwise._norm_rope_kernel, dict(ROT=64, BLOCK_D=256), dict(num_warps=4))
# the merge as the GPU launches it: a grouped row a program, 64 partitions a load
TYPES |= {"stride_or": "i64", "stride_oh": "i64", "stride_gr": "i64", "stride_gh": "i64", "gate_ptr": "*bf16"}
KERNELS["tree attention merge"] = (
    attention.tree_attention_merge_kernel,
    dict(
        {k: v for k, v in ATTENTION.items() if k not in ("BM", "TAIL")},
        BD=attention.MERGE_BLOCK_D,
        BM=1,
        NB=attention.MERGE_PARTITIONS,
        BN=64,
        NSPLIT=33,
        BY_PREFIX=False,
        SHORT=attention.SHORT_KEYS,
        GATED=True,
    ),
    dict(num_warps=attention.MERGE_WARPS),
)
TYPES |= {"k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "slot_ptr": "*i64", "HD": "i32"}
TYPES |= {name: "i64" for name in ("stride_kr", "stride_vr", "stride_t")}
KERNELS["kv write"] = (attention.write_kv_kernel, dict(BD=1024, PREFIX=True), dict(num_warps=4))
# the launcher passes an integer argument equal to 1 as a constant: a 1-row AR step compiles so
KERNELS["skinny n64 k128 t1 split m1"] = (
    skinny_gemm.skinny_gemm_kernel,
    dict(M=1, ROWS=16, BLOCK_N=64, BLOCK_K=128, EVEN_K=True, PRECISION="tf32", SPLITS=3, RESIDUAL=True),
    dict(num_warps=4, num_stages=3),
    tuple(a for a in SKINNY_DIVISIBLE if a != "M"),
)


# The pending pre-norm (fused/pending_norm.py) at the 27B shapes: the output and down projections
# (split, residual) store the next norm's operands; the input projections and the gate-up read them
TYPES |= {"nw_ptr": "*bf16", "ny_ptr": "*bf16", "in_blocks": "i32", "eps": "fp32"}
PENDING_NORM_ENTRIES = {  # name (with the row tiles' count) -> constexprs besides ROWS
    "skinny n64 k128 t{} split norm out": dict(
        BLOCK_N=64, BLOCK_K=128, SPLITS=3, RESIDUAL=True, NORM_OUT=True
    ),
    # the shipped model's: one K range, its tile read back
    "skinny n64 k128 t{} norm out": dict(BLOCK_N=64, BLOCK_K=128, SPLITS=1, RESIDUAL=True, NORM_OUT=True),
    "skinny n128 k64 t{} norm in": dict(BLOCK_N=128, BLOCK_K=64, SPLITS=1, RESIDUAL=False, ROW_NORM=True),
    "skinny swiglu n64 k64 t{} norm in": dict(
        BLOCK_N=64, BLOCK_K=64, SPLITS=1, RESIDUAL=False, SWIGLU=True, ROW_NORM=True
    ),
}
for name, constexprs in PENDING_NORM_ENTRIES.items():
    for tiles in (1, 2):
        KERNELS[name.format(tiles)] = (
            skinny_gemm.skinny_gemm_kernel,
            dict(constexprs, ROWS=16 * tiles, EVEN_K=True, PRECISION="tf32", IN_BLOCKS_PAD=128),
            dict(num_warps=4, num_stages=3),
            (*SKINNY_DIVISIBLE, "in_sums_ptr", "out_sums_ptr", "ny_ptr", "in_blocks"),
        )


def compile_hopper(
    kernel: triton.JITFunction,
    constexprs: dict,
    options: dict,
    divisible: tuple[str, ...] = (),
    types: dict[str, str] | None = None,
) -> triton.compiler.CompiledKernel:
    """One kernel compiled for sm_90a at the given constexprs and compile options, the `divisible`
    arguments marked as multiples of 16, `types` over TYPES (the compiler's exception if it refuses)."""
    signature_params = inspect.signature(kernel.fn).parameters
    params = list(signature_params)
    defaults = {  # constexprs the entry leaves at their defaults (e.g. an epilogue switched off)
        name: p.default
        for name, p in signature_params.items()
        if p.default is not inspect.Parameter.empty and "constexpr" in str(p.annotation)
    }
    constexprs = defaults | constexprs
    known = TYPES | (types or {})
    signature = {p: "constexpr" if p in constexprs else known.get(p, "*fp32") for p in params}
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in divisible}
    constants = {(params.index(k),): v for k, v in constexprs.items()}
    source = ASTSource(kernel, signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=HOPPER, options=options)


def compile_for_hopper(
    kernel: triton.JITFunction,
    constexprs: dict,
    options: dict,
    divisible: tuple[str, ...] = (),
    types: dict[str, str] | None = None,
) -> dict:
    """{"ok", "error", "wgmma", "tma", "shared_bytes", "registers", "spill_bytes", "loop_spills",
    "reductions"} of `compile_hopper` (loop_spills: spill instructions inside the kernel's loops;
    reductions: `reductions` of its TTGIR)."""
    try:
        compiled = compile_hopper(kernel, constexprs, options, divisible, types)
    except Exception as exc:  # the test reports the compiler's message and its innermost cause's
        cause = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        return {
            "ok": False,
            "error": str(exc)[-1000:]
            + ("" if cause is exc else f"\ncaused by {type(cause).__name__}: {str(cause)[-1000:]}"),
            "wgmma": False,
            "tma": False,
            "shared_bytes": -1,
            "registers": -1,
            "spill_bytes": -1,
            "loop_spills": -1,
            "reductions": [],
        }
    ptx = compiled.asm["ptx"]
    return {
        "ok": True,
        "error": "",
        "wgmma": "wgmma.mma_async" in ptx,
        "tma": "cp.async.bulk.tensor" in ptx,
        "shared_bytes": compiled.metadata.shared,
        **resource_usage(ptx),
        "loop_spills": spills_in_loops(sass_of(compiled.asm["cubin"])),
        "reductions": reductions(compiled.asm["ttgir"]),
    }


# the device tree's tables at 32 rows, depth 11 (the paper tree's; one program, the leaf groups' loop)
DERIVE_TYPES = {
    name: "*i64"
    for name in (
        "feed_ptr", "emitted_ptr", "path_len_ptr", "spine_ptr", "tokens_ptr", "position_ptr", "depth_ptr",
        "slot_ptr", "bits_ptr", "conv_ptr", "child_nodes_ptr", "child_tokens_ptr", "ancestry_ptr",
        "n_active_ptr", "spine_nodes_ptr", "prefix_ptr",
    )
}  # fmt: skip
KERNELS["derive tables"] = (
    device_tree.derive_tables_kernel,
    dict(R=32, RP=32, W=4, MAXD=11, CHAINED=False, PAD=0),
    dict(num_warps=4),
    (),
    DERIVE_TYPES
    | {name: "*i32" for name in ("ancestry32_ptr", "n_active32_ptr", "path_end_ptr", "path_start_ptr")},
)
# publication's replay, and the AR step's row scan that advances the states in place instead
TYPES |= {"accepted_ptr": "*i64", "len_ptr": "*i64"}
TYPES |= {name: "i64" for name in ("layer_offset", "state_layer_stride", "rk_layer_stride")}
TYPES |= {name: "i64" for name in ("rv_layer_stride", "rg_layer_stride")}
KERNELS["replay"] = (replay.gdn_replay_kernel, dict(QWEN, V=128, BV=8), dict(num_warps=1))
KERNELS["row scan, advancing"] = (
    row_scan.gdn_rows_kernel,
    dict(QWEN, V=128, BV=8, RP=32, ADVANCE=True),
    dict(num_warps=1),
)


SASS_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")
SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
SASS_BRANCH = re.compile(r"BRA(?:\.\w+)* `\((\.L_x_\d+)\)")
SASS_PREDICATED = re.compile(r"@!?U?P\w+\s+BRA")


def sass_loops(sass: str) -> list[tuple[int, int]]:
    """(first, last) line of each loop of an nvdisasm listing: a label and a predicated branch back
    to it (unpredicated backward jumps are slow paths returning, not loops)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := SASS_LABEL.match(line))}
    loops = []
    for end, line in enumerate(lines):
        target = SASS_BRANCH.search(line) if SASS_PREDICATED.search(line) else None
        start = labels.get(target.group(1), end) if target else end
        if start < end:
            loops.append((start, end))
    return loops


def spills_in_loops(sass: str) -> int:
    """Local-memory (spill) instructions inside the listing's loops."""
    lines = sass.splitlines()
    return sum(
        1
        for start, end in sass_loops(sass)
        for line in lines[start : end + 1]
        if (m := SASS_INSTRUCTION.search(line)) and m.group(1) in ("LDL", "STL")
    )


TTGIR_LAYOUT = re.compile(r"(#\w+) = (#ttg\.blocked<\{[^}]*\}>)")
TTGIR_REDUCE = re.compile(
    r"\"tt\.reduce\"\(%\S+\) <\{axis = (\d+) : i32\}>.*?\}\) : \(tensor<[^,]*, (#\w+)>", re.S
)


def reductions(ttgir: str) -> list[str]:
    """Each tt.reduce of a TTGIR listing as "axis A <its operand's blocked layout>": the lanes and
    warps its sum runs over (two launches whose reductions read the same reduce alike)."""
    layouts = dict(TTGIR_LAYOUT.findall(ttgir))
    return [f"axis {axis} {layouts.get(name, name)}" for axis, name in TTGIR_REDUCE.findall(ttgir)]


def sass_of(cubin: bytes) -> str:
    """nvdisasm's listing of a cubin (the disassembler Triton ships), with source lines."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        nvdisasm = Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm"
        return subprocess.run(
            [str(nvdisasm), "-c", "-g", str(path)], capture_output=True, text=True, check=True
        ).stdout


def resource_usage(ptx: str) -> dict:
    """{"registers", "spill_bytes"} that Triton's ptxas reports (-v) for the PTX on sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        command = [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(source), "-o", str(Path(tmp) / "k.o")]
        log = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return {
        "registers": int(registers.group(1)) if registers else -1,
        "spill_bytes": int(spills.group(1)) if spills else 0,
    }


if __name__ == "__main__":
    print(json.dumps({name: compile_for_hopper(*spec) for name, spec in KERNELS.items()}))
