"""Which sm_90 compile entries of tests/kernel_tests/hopper_aot.py get Triton layouts that run along
dim 0 (order [0, 1], ...) under this machine's Triton (session 19, call 5: on the H200's Triton 3.6 a
[heads, K] block's loads did, see results/h200/conv-diag.md). On the device, from the repository
root: python3 lumobench/bench/device/layouts.py"""

from __future__ import annotations

import sys

import triton

sys.path.insert(0, "tests/kernel_tests")
import hopper_aot  # the compile entries live beside the sm_90 compile test


def dim0_layouts(ttgir: str) -> tuple[int, list[str]]:
    """How many blocked layouts a kernel's TTGIR has, and those whose order starts at dim 0."""
    layouts = [line for line in ttgir.splitlines() if line.startswith("#blocked")]
    return len(layouts), [line for line in layouts if "order = [0, 1" in line]


def main() -> None:
    print("triton", triton.__version__)
    for name, spec in hopper_aot.KERNELS.items():
        try:
            compiled = hopper_aot.compile_hopper(*spec)
        except Exception as error:  # a compile error is reported, the survey goes on
            print(name, "ERROR", str(error)[-200:])
            continue
        count, odd = dim0_layouts(compiled.asm["ttgir"])
        print(
            f"{name}: {count} blocked layouts, {len(odd)} along dim 0"
            + "".join(f"\n    {line}" for line in odd)
        )


main()  # a device script run by path, like the shell scripts beside it (not a `lumobench bench` verb)
