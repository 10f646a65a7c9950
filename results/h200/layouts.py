"""Which sm_90 compile entries of tests/kernel_tests/hopper_aot.py get Triton layouts that run along dim 0
(order [0, 1], ...) under this machine's Triton (session 19, call 5). Run on the device from the
repository root: python3 results/h200/layouts.py"""
import inspect, sys
sys.path.insert(0, "tests/kernel_tests")
import triton
import hopper_aot as H
from triton.compiler import ASTSource
print("triton", triton.__version__)
for name, spec in H.KERNELS.items():
    kernel, constexprs, options = spec[:3]
    divisible = spec[3] if len(spec) > 3 else ()
    params = list(inspect.signature(kernel.fn).parameters)
    signature = {p: "constexpr" if p in constexprs else H.TYPES.get(p, "*fp32") for p in params}
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in divisible}
    constants = {(params.index(k),): v for k, v in constexprs.items()}
    try:
        c = triton.compile(ASTSource(kernel, signature, constexprs=constants, attrs=attrs), target=H.HOPPER, options=options)
    except Exception as e:
        print(name, "ERROR", str(e)[-200:]); continue
    lay = [l for l in c.asm["ttgir"].splitlines() if l.startswith("#blocked")]
    odd = [l for l in lay if "order = [0, 1" in l]
    print(f"{name}: {len(lay)} blocked layouts, {len(odd)} along dim 0" + ("".join("\n    " + l for l in odd)))
