#!/usr/bin/env bash
# H200 run 5: the value-major tree-parallel GDN kernel (tree_inverse.py at commit b1b63f8; since
# renamed tree_value_major.py and reduced to the split solve, so this script runs at that commit). GPU parity of its
# configurations (fp32 and bf16 at Qwen shapes, the parallel-keys case, one launch over layers),
# then the GDN suite side by side with run 4's best (tree-parallel tf32x3 product bv64 w8), native
# paths and fla's chain kernels, all in one benchmark process. From the repository root, with OUT
# set and the wheels in .whl/ (as for run_kernels.sh):  bash results/h200/run_kernels_v5.sh
set -uo pipefail
source results/h200/device_setup.sh
timeout "${PARITY_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    -k "value-major or parallel_keys" tests/kernels/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity-v5.log"
timeout "${BENCH_S:-330}" python3 -m lumobench.bench.kernels --suites gdn \
    --methods "${METHODS:-value-major,tree-parallel tf32x3 product bv64,native,fla}" \
    --iters 50 --warmup 10 --eager-iters 5 --out "$OUT" > "$OUT/bench-gdn.log" 2>&1
grep -E "^\| (lumotree|native|fla)" "$OUT/kernels.md" | grep -v "MiB\|buffer\| records\| tables\| bank\| staging" \
    | cut -d'|' -f2-5 | head -20
tail -3 "$OUT/gpu_parity-v5.log"
