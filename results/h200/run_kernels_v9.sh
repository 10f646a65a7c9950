#!/usr/bin/env bash
# H200 run 9: the final code of the value-major GDN kernel (split solve only, defaults from runs
# 6-8). Every GPU parity test of tests/kernels/test_gpu_parity.py, then the GDN suite side by side
# with run 4's best (tree-parallel product), native paths and fla's chain kernels in one benchmark
# process (100 timed iterations after 20 warm-up). From the repository root, with OUT set and the
# wheels in .whl/ (as for run_kernels.sh):  bash results/h200/run_kernels_v9.sh
set -uo pipefail
source results/h200/device_setup.sh
timeout "${PARITY_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/kernels/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity-v9.log"
timeout "${BENCH_S:-200}" python3 -m lumobench.bench.kernels --suites gdn \
    --methods "${METHODS:-value-major,tree-parallel tf32x3 product bv64,native,fla}" \
    --iters 100 --warmup 20 --eager-iters 5 --out "$OUT" > "$OUT/bench-gdn.log" 2>&1
tail -1 "$OUT/gpu_parity-v9.log"
grep -E "^\| (lumotree|native|fla)" "$OUT/kernels.md" | grep -v "MiB\|buffer\| records\| tables\| bank\| staging\| scratch" \
    | cut -d'|' -f2-5 | head -20
