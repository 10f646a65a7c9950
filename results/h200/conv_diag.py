"""Diagnostic of session 19 (NOTES.md, calls 2-4): where the conv that prepares the GDN operands
spent its ~1.3 us a launch over the plain conv. Variants of session 18's `conv_operands_kernel`, one
feature at a time, over every GDN layer of the 27B in model order in one CUDA graph (as `lumobench
bench gdn-forms --conv-warps`); DIAG_NCU=1 launches each variant eagerly for `ncu`, DIAG_SASS=1
prints the device's Triton layouts and loads of three of them. It imports the helpers as they were
at 3711116 (`head_channels`, the [heads, K] `prepared_channels`), so run it against that tree:

    git archive 3711116 serving | tar -x -C .stage/diag-base     # here, then on the device:
    PYTHONPATH=.stage/diag-base/serving:$PYTHONPATH python3 results/h200/conv_diag.py

Its finding (the [heads, K] block laid out along the heads on Triton 3.6) is fixed at 9ca593c.
"""

import os
import random

import torch
import triton
import triton.language as tl

from lumobench.bench.timing import Timer
from lumobench.checks.random_trees import paper_tree
from lumotree.drafting.geometry import GeometryConfig
from lumotree.model.random_weights import preset_config
from lumotree.tree import MAX_DEPTH, chain_tree
from lumotree.verify.conv.fused_conv import tree_conv_, tree_conv_kernel, tree_conv_row
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.prepare import head_channels, prepared_channels, store_gates, store_operands
from lumotree.verify.graphs import CapturedStage


@triton.jit
def diag_kernel(
    x_ptr, state_ptr, w_ptr, gather_ptr, record_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, rq_ptr, rk_ptr,
    rv_ptr, rg_ptr, rb_ptr, y_ptr, C, stride_x, stride_ab, W: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
    HVV: tl.constexpr, HV: tl.constexpr, HVP: tl.constexpr, BC: tl.constexpr,
    RECORD: tl.constexpr, NORM: tl.constexpr, GATES: tl.constexpr, SPLIT_STORE: tl.constexpr,
    FLAT: tl.constexpr = False,
):  # fmt: skip
    r = tl.program_id(0)
    block = tl.program_id(1)
    if block * BC < C:
        if FLAT:  # the plain conv's 1D channel block, the norm over a reshaped view
            offs_c = block * BC + tl.arange(0, BC)
        else:
            offs_c = head_channels(block, K, BC)
        y = tree_conv_row(
            x_ptr, state_ptr, w_ptr, w_ptr, gather_ptr, record_ptr, r, offs_c, C, stride_x, W, False, RECORD
        )
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
        if NORM:
            if FLAT:
                y = tl.reshape(prepared_channels(tl.reshape(y, [BC // K, K]), tl.reshape(offs_c, [BC // K, K]), HK), [BC])
            else:
                y = prepared_channels(y, offs_c, HK)
        if SPLIT_STORE:
            store_operands(y, offs_c, offs_c < C, r, rq_ptr, rk_ptr, rv_ptr, HK, HVV)
        else:
            tl.store(y_ptr + r * C + offs_c, y, mask=offs_c < C)
    elif GATES:
        store_gates(a_ptr, b_ptr, stride_ab, alog_ptr, dtb_ptr, rg_ptr, rb_ptr, r, HV, HVP)


NCU = os.environ.get("DIAG_NCU") == "1"
SASS = os.environ.get("DIAG_SASS") == "1"


def sass_of(cubin: bytes) -> str:
    import pathlib, subprocess, tempfile  # noqa: E401, PLC0415

    nvdisasm = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm"
    path = pathlib.Path(tempfile.mkdtemp()) / "k.cubin"
    path.write_bytes(cubin)
    return subprocess.run([str(nvdisasm), "-c", str(path)], capture_output=True, text=True).stdout


def main() -> None:
    dev = torch.device("cuda")
    cfg = preset_config("qwen3.5-27b")
    h, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    channels = 2 * h * dk + hv * dv
    timer = Timer(dev, 50, 10)
    gen = torch.Generator(device=dev).manual_seed(2)
    print("variant | rows | ms (48 layers)")
    paper = paper_tree(random.Random(0), cfg.vocab_size, 4096, GeometryConfig(rows=32))
    for rows_name, tree in (("tree", paper), ("one row", chain_tree([0], prefix_len=4096))):
        rows = tree.rows
        gather = DeviceTree(rows, MAX_DEPTH, dev).load_(tree).conv_gather
        layers = []
        for _ in range(4 if NCU else 48):
            x = torch.randn(rows, channels, generator=gen, device=dev).bfloat16()
            ab = torch.randn(rows, 2 * hv, generator=gen, device=dev).bfloat16()
            st = torch.randn(channels, 3, generator=gen, device=dev).bfloat16()
            w = torch.randn(channels, 4, generator=gen, device=dev).bfloat16()
            alog, dtb = torch.randn(hv, device=dev), torch.randn(hv, device=dev)
            outs = [torch.empty(rows, n, device=dev) for n in (h * dk, h * dk, hv * dv, hv, hv, channels)]
            layers.append((x, st, w, ab, alog, dtb, outs, torch.empty_like(x)))

        def run(flags: dict | None) -> None:
            flags = dict(flags) if flags is not None else None
            for x, st, w, ab, alog, dtb, (q, k, v, g, beta, y), rec in layers:
                if flags is None:
                    tree_conv_(x, st, w, None, gather, rec)
                    continue
                if "PLAIN" in flags:  # tree_conv_kernel launched directly: output dtype, extra programs
                    out = y if flags["PLAIN"] == "fp32" else rec
                    tree_conv_kernel[(rows, triton.cdiv(channels, 256) + flags["EXTRA"])](
                        x, st, w, w, gather, out, channels, x.stride(0), W=4, HAS_BIAS=False, BC=256,
                        enable_fp_fusion=False,
                    )
                    continue
                extra = flags.pop("EXTRA", 1)
                diag_kernel[(rows, triton.cdiv(channels, 256) + extra)](
                    x, st, w, gather, rec, ab[:, :hv], ab[:, hv:], alog, dtb, q, k, v, g, beta, y, channels,
                    x.stride(0), ab.stride(0), W=4, HK=h * dk, K=dk, HVV=hv * dv, HV=hv, HVP=64, BC=256,
                    enable_fp_fusion=False, num_warps=4, **flags,
                )  # fmt: skip

        variants = {
            "plain conv (tree_conv_)": None,
            "plain kernel, bf16 store, direct launch": dict(PLAIN="bf16", EXTRA=0),
            "plain kernel, fp32 store": dict(PLAIN="fp32", EXTRA=0),
            "plain kernel, bf16 store, one program more a row": dict(PLAIN="bf16", EXTRA=1),
            "diag: nothing, no gates program": dict(EXTRA=0, RECORD=False, NORM=False, GATES=False, SPLIT_STORE=False),
            "diag: nothing (fp32 store)": dict(RECORD=False, NORM=False, GATES=False, SPLIT_STORE=False),
            "diag: + record": dict(RECORD=True, NORM=False, GATES=False, SPLIT_STORE=False),
            "diag: + norm": dict(RECORD=False, NORM=True, GATES=False, SPLIT_STORE=False),
            "diag: + gates": dict(RECORD=False, NORM=False, GATES=True, SPLIT_STORE=False),
            "diag: + split store": dict(RECORD=False, NORM=False, GATES=False, SPLIT_STORE=True),
            "diag: all (the engine's)": dict(RECORD=True, NORM=True, GATES=True, SPLIT_STORE=True),
            "flat: nothing": dict(RECORD=False, NORM=False, GATES=False, SPLIT_STORE=False, FLAT=True),
            "flat: + norm": dict(RECORD=False, NORM=True, GATES=False, SPLIT_STORE=False, FLAT=True),
            "flat: all": dict(RECORD=True, NORM=True, GATES=True, SPLIT_STORE=True, FLAT=True),
        }
        if SASS and rows_name == "one row":
            for flags in (None, variants["diag: nothing (fp32 store)"], variants["flat: all"]):
                run(flags)
            for kern in (tree_conv_kernel, diag_kernel):
                for key, compiled in kern.device_caches[0][0].items():
                    print("=== SASS", kern.fn.__name__, str(key)[-300:])
                    print("\n".join(l for l in compiled.asm["ttgir"].splitlines() if l.startswith("#")))
                    sass = sass_of(compiled.asm["cubin"])
                    body = [l for l in sass.splitlines() if "/*0" in l]
                    print(len(body), "instructions")
                    print("\n".join(l.strip() for l in body if any(k in l for k in ("LDG", "STG", "BAR", "SHFL"))))
            return
        for name, flags in variants.items():
            run(flags)
            torch.cuda.synchronize()
            if NCU:  # eager launches only, for the profiler (4 layers a variant, in this order)
                print(f"ncu: {name} | {rows_name}")
                continue
            ms = timer(CapturedStage(lambda f=flags: run(f)).replay).median_ms
            print(f"{name} | {rows_name} | {ms:.3f}")


if __name__ == "__main__":
    main()
