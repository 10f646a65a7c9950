"""Which sm_90 compile entries of tests/kernel_tests/hopper_aot.py get Triton layouts that run along
dim 0 (order [0, 1], ...) under this machine's Triton (session 19, call 5: on the H200's Triton 3.6 a
[heads, K] block's loads did, see results/h200/conv-diag.md). On the device, from the repository
root: python3 lumobench/bench/device/layouts.py"""

from __future__ import annotations

import inspect
import sys

import triton
from triton.compiler import ASTSource

sys.path.insert(0, "tests/kernel_tests")
import hopper_aot  # the compile entries live beside the sm_90 compile test


def dim0_layouts(ttgir: str) -> tuple[int, list[str]]:
    """How many blocked layouts a kernel's TTGIR has, and those whose order starts at dim 0."""
    layouts = [line for line in ttgir.splitlines() if line.startswith("#blocked")]
    return len(layouts), [line for line in layouts if "order = [0, 1" in line]


def main() -> None:
    print("triton", triton.__version__)
    for name, (kernel, constexprs, options, *rest) in hopper_aot.KERNELS.items():
        params = list(inspect.signature(kernel.fn).parameters)
        signature = {p: "constexpr" if p in constexprs else hopper_aot.TYPES.get(p, "*fp32") for p in params}
        attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in (rest[0] if rest else ())}
        constants = {(params.index(k),): v for k, v in constexprs.items()}
        source = ASTSource(kernel, signature, constexprs=constants, attrs=attrs)
        try:
            compiled = triton.compile(source, target=hopper_aot.HOPPER, options=options)
        except Exception as error:  # a compile error is reported, the survey goes on
            print(name, "ERROR", str(error)[-200:])
            continue
        count, odd = dim0_layouts(compiled.asm["ttgir"])
        print(
            f"{name}: {count} blocked layouts, {len(odd)} along dim 0"
            + "".join(f"\n    {line}" for line in odd)
        )


main()  # a device script run by path, like the shell scripts beside it (not a `lumobench bench` verb)
