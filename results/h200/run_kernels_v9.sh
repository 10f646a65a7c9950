#!/usr/bin/env bash
# H200 run 9: the final code of the value-major GDN kernel (split solve only, defaults from runs
# 6-8). Every GPU parity test of tests/kernels/test_gpu_parity.py, then the GDN suite side by side
# with run 4's best (tree-parallel product), native paths and fla's chain kernels in one benchmark
# process (100 timed iterations after 20 warm-up). From the repository root, with OUT set and the
# wheels in .whl/ (as for run_kernels.sh):  bash results/h200/run_kernels_v9.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$WHL"/fla_core-0.6.0-*.whl "$WHL"/pydantic-2.14.4-*.whl "$WHL"/pydantic_core-2.50.5-*.whl \
    "$WHL"/annotated_types-0.8.0-*.whl "$WHL"/typing_inspection-0.4.5-*.whl \
    "$WHL"/typing_extensions-4.16.0-*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/serving:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
timeout "${PARITY_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/kernels/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity-v9.log"
timeout "${BENCH_S:-200}" python3 -m lumobench.bench.kernels --suites gdn \
    --methods "${METHODS:-value-major,tree-parallel tf32x3 product bv64,native,fla}" \
    --iters 100 --warmup 20 --eager-iters 5 --out "$OUT" > "$OUT/bench-gdn.log" 2>&1
tail -1 "$OUT/gpu_parity-v9.log"
grep -E "^\| (lumotree|native|fla)" "$OUT/kernels.md" | grep -v "MiB\|buffer\| records\| tables\| bank\| staging\| scratch" \
    | cut -d'|' -f2-5 | head -20
