#!/usr/bin/env bash
# H200 run 3 (scan v3 and the tree-parallel kernel): GPU parity of the new kernels, then the GDN
# suite, then the attention suite, each inside a share of one deadline and checkpointed to $OUT, so
# a time limit keeps what finished. From the repository root, with OUT set and the wheels (fla-core
# 0.6.0, pydantic and its needs) in .whl/, as for run_kernels.sh:
#   BUDGET_S=380 bash results/h200/run_kernels_v3.sh
# TINY=1 runs the same steps on a CPU under the Triton interpreter (small shapes; a rehearsal, its
# numbers mean nothing; the gpu-marked parity tests skip there).
set -uo pipefail
export PYTHONUNBUFFERED=1
DEADLINE=$((SECONDS + ${BUDGET_S:-380}))
left() { echo $((DEADLINE - SECONDS)); }
if [[ -z "${TINY:-}" ]]; then
    export TRITON_INTERPRET=0
    WHL=${WHL:-.whl}
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        "$WHL"/fla_core-0.6.0-*.whl "$WHL"/pydantic-2.14.4-*.whl "$WHL"/pydantic_core-2.50.5-*.whl \
        "$WHL"/annotated_types-0.8.0-*.whl "$WHL"/typing_inspection-0.4.5-*.whl "$WHL"/typing_extensions-4.16.0-*.whl
    export PYTHONPATH=/tmp/site:$PWD:$PWD/serving:${PYTHONPATH:-}
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > "$OUT/gpu.txt"
    py=(python3)
    size=(--iters 100 --warmup 20 --eager-iters 20)
else
    export TRITON_INTERPRET=1
    py=(${PY:-.venv/bin/python})
    size=(--tiny --no-fla --iters 2 --warmup 0 --eager-iters 1)
fi
"${py[@]}" -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt" 2>&1

timeout "${PARITY_S:-75}" "${py[@]}" -m pytest -q -m gpu -p no:cacheprovider -k "v3 or tree or attention" \
    tests/kernels/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity-v3.log"

bench() {  # bench SUITE SECONDS
    local args=(bench kernels --out "$OUT/$1" --suites "$1" "${size[@]}")
    if "${py[@]}" -c "import lumobench.cli" 2>/dev/null; then
        timeout "$2" "${py[@]}" -m lumobench.cli "${args[@]}" 2>&1 | tee "$OUT/bench-$1.log"
    else
        timeout "$2" "${py[@]}" -m lumobench.bench.kernels "${args[@]:2}" 2>&1 | tee "$OUT/bench-$1.log"
    fi
}
# The GDN suite gets its share but leaves ATTENTION_S for the attention suite.
gdn_s=$(( $(left) - ${ATTENTION_S:-110} ))
bench gdn "$(( gdn_s > 30 ? gdn_s : 30 ))"
bench attention "$(( $(left) > 10 ? $(left) : 10 ))"
ls -R "$OUT" | head -40
