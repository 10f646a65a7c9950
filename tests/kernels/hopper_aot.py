"""Compile Triton kernels for Hopper (sm_90) ahead of time, without a GPU; run as a script.

Run with TRITON_INTERPRET unset (the interpreter replaces @triton.jit functions). Prints one JSON
object: for every kernel, {"ok": bool, "error": str, "wgmma": bool (wgmma in its PTX)}.
"""

from __future__ import annotations

import inspect
import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lumotree.verify.gdn import tree_scan, tree_value_major

HOPPER = GPUTarget("cuda", 90, 32)
QWEN = dict(H=16, HV=48, K=128)
TYPES = {"R": "i32", "anc_ptr": "*i32", "nactive_ptr": "*i32"}
TYPES |= {name: "i64" for name in ("stride_qk", "stride_v", "stride_ab", "stride_param", "stride_state")}
TYPES |= {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "a_ptr", "b_ptr", "o_ptr")}
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
}


def compile_for_hopper(kernel: triton.JITFunction, constexprs: dict, options: dict) -> dict:
    """{"ok", "error", "wgmma"} for one kernel at the given constexprs and compile options."""
    params = list(inspect.signature(kernel.fn).parameters)
    signature = {p: "constexpr" if p in constexprs else TYPES.get(p, "*fp32") for p in params}
    source = ASTSource(kernel, signature, constexprs={(params.index(k),): v for k, v in constexprs.items()})
    try:
        compiled = triton.compile(source, target=HOPPER, options=options)
    except Exception as exc:  # the test reports the compiler's message
        return {"ok": False, "error": str(exc)[-2000:], "wgmma": False}
    return {"ok": True, "error": "", "wgmma": "wgmma.mma_async" in compiled.asm["ptx"]}


if __name__ == "__main__":
    print(json.dumps({name: compile_for_hopper(*spec) for name, spec in KERNELS.items()}))
