#!/usr/bin/env bash
# The exact run that produced results/h200/kernels.{md,json} and gpu_parity.log on the H200 device
# machine (torch 2.11, triton 3.6, no network). From the repository root, with OUT set to a
# directory for the outputs and the wheels (fla-core 0.6.0 for the baseline; pydantic and its
# needs for the lumobench CLI) in .whl/:
#   bash results/h200/run_kernels.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$WHL"/fla_core-0.6.0-*.whl "$WHL"/pydantic-2.14.4-*.whl "$WHL"/pydantic_core-2.50.5-*.whl \
    "$WHL"/annotated_types-0.8.0-*.whl "$WHL"/typing_inspection-0.4.5-*.whl "$WHL"/typing_extensions-4.16.0-*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/serving:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, triton, fla; print(torch.__version__, triton.__version__, fla.__version__)" >> "$OUT/gpu.txt" 2>&1
# PARITY: a pytest -k filter (default: every gpu test); SUITES: the benchmark suites (default: all).
timeout "${PARITY_TIMEOUT:-170}" python3 -m pytest -q -m gpu -p no:cacheprovider -k "${PARITY:-}" \
    tests/kernels/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity.log"
bench=(bench kernels --out "$OUT" --iters 100 --warmup 20 --eager-iters 20 --suites "${SUITES:-gdn,attention,selection,walk,commit}")
if python3 -c "import lumobench.cli" 2>/dev/null; then
    timeout "${BENCH_TIMEOUT:-280}" python3 -m lumobench.cli "${bench[@]}" 2>&1 | tee "$OUT/bench.log"
else
    timeout "${BENCH_TIMEOUT:-280}" python3 -m lumobench.bench.kernels "${bench[@]:2}" 2>&1 | tee "$OUT/bench.log"
fi
