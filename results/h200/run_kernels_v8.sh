#!/usr/bin/env bash
# H200 run 8: confirmation of the defaults chosen from run 7 (value-major split solve, 4-stage
# apply loop; replay publication on one warp). GPU parity of the value-major variants and of the
# replay, the run-8 ablation table (results/h200/ablate_gdn.py --set run8), then the GDN suite
# side by side with run 4's best, native paths and fla's chain kernels in one benchmark
# process. From the repository root, with OUT set and the wheels in .whl/ (as for
# run_kernels.sh):  bash results/h200/run_kernels_v8.sh
set -uo pipefail
source results/h200/device_setup.sh
timeout "${PARITY_S:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    -k "value-major or parallel_keys or replay" tests/kernels/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity-v8.log"
timeout "${ABLATE_S:-100}" python3 results/h200/ablate_gdn.py --set run8 --out "$OUT" > "$OUT/ablate.log" 2>&1
timeout "${BENCH_S:-270}" python3 -m lumobench.bench.kernels --suites gdn \
    --methods "${METHODS:-value-major,tree-parallel tf32x3 product bv64,native,fla}" \
    --iters 100 --warmup 20 --eager-iters 5 --out "$OUT" > "$OUT/bench-gdn.log" 2>&1
tail -1 "$OUT/gpu_parity-v8.log"
cat "$OUT/ablate.log"
grep -E "^\| (lumotree|native|fla)" "$OUT/kernels.md" | grep -v "MiB\|buffer\| records\| tables\| bank\| staging" \
    | cut -d'|' -f2-5 | head -20
