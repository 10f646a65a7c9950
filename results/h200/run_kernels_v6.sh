#!/usr/bin/env bash
# H200 run 6: the value-major GDN kernel's split solve (prepare launch per key head: blocked
# (I + A)^-1; apply launch: value-major products). GPU parity of the value-major variants, the
# ablation table (results/h200/ablate_gdn.py), then the GDN suite side by side with run 4's best,
# native paths and fla's chain kernels in one benchmark process. From the repository root, with OUT
# set and the wheels in .whl/ (as for run_kernels.sh):  bash results/h200/run_kernels_v6.sh
set -uo pipefail
source results/h200/device_setup.sh
timeout "${PARITY_S:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    -k "value-major or parallel_keys" tests/kernels/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity-v6.log"
timeout "${ABLATE_S:-90}" python3 results/h200/ablate_gdn.py --out "$OUT" > "$OUT/ablate.log" 2>&1
timeout "${BENCH_S:-270}" python3 -m lumobench.bench.kernels --suites gdn \
    --methods "${METHODS:-value-major,tree-parallel tf32x3 product bv64,native,fla}" \
    --iters 50 --warmup 10 --eager-iters 5 --out "$OUT" > "$OUT/bench-gdn.log" 2>&1
tail -3 "$OUT/gpu_parity-v6.log"
cat "$OUT/ablate.log"
grep -E "^\| (lumotree|native|fla)" "$OUT/kernels.md" | grep -v "MiB\|buffer\| records\| tables\| bank\| staging" \
    | cut -d'|' -f2-5 | head -20
