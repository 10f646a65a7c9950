#!/usr/bin/env bash
# H200 run 4 (short: ~3 device minutes were left): GPU parity of the BN64/22-split attention config,
# then the tree-parallel GDN kernel with the default "substitution" solve side by side with the
# "product" solve of run 3. From the repository root, with OUT set and the wheels in .whl/ (as for
# run_kernels.sh):  bash results/h200/run_kernels_v4.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$WHL"/pydantic-2.14.4-*.whl "$WHL"/pydantic_core-2.50.5-*.whl "$WHL"/annotated_types-0.8.0-*.whl \
    "$WHL"/typing_inspection-0.4.5-*.whl "$WHL"/typing_extensions-4.16.0-*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/serving:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
timeout "${PARITY_S:-50}" python3 -m pytest -q -m gpu -p no:cacheprovider -k "BN64" \
    tests/kernels/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity-v4.log"
timeout "${BENCH_S:-110}" python3 -m lumobench.bench.kernels --suites gdn --no-fla \
    --methods "tree-parallel tf32x3" --iters 50 --warmup 10 --eager-iters 5 --out "$OUT" \
    > "$OUT/bench-gdn.log" 2>&1
grep -E "^\| lumotree tree-parallel" "$OUT/kernels.md" | head -12
tail -3 "$OUT/gpu_parity-v4.log"
