#!/usr/bin/env bash
# H200 run 5: the value-major tree-parallel GDN kernel (tree_inverse.py at commit b1b63f8; since
# renamed tree_value_major.py and reduced to the split solve, so this script runs at that commit). GPU parity of its
# configurations (fp32 and bf16 at Qwen shapes, the parallel-keys case, one launch over layers),
# then the GDN suite side by side with run 4's best (tree-parallel tf32x3 product bv64 w8), native
# paths and fla's chain kernels, all in one benchmark process. From the repository root, with OUT
# set and the wheels in .whl/ (as for run_kernels.sh):  bash results/h200/run_kernels_v5.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$WHL"/fla_core-0.6.0-*.whl "$WHL"/pydantic-2.14.4-*.whl "$WHL"/pydantic_core-2.50.5-*.whl \
    "$WHL"/annotated_types-0.8.0-*.whl "$WHL"/typing_inspection-0.4.5-*.whl \
    "$WHL"/typing_extensions-4.16.0-*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/serving:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
timeout "${PARITY_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    -k "value-major or parallel_keys" tests/kernels/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity-v5.log"
timeout "${BENCH_S:-330}" python3 -m lumobench.bench.kernels --suites gdn \
    --methods "${METHODS:-value-major,tree-parallel tf32x3 product bv64,native,fla}" \
    --iters 50 --warmup 10 --eager-iters 5 --out "$OUT" > "$OUT/bench-gdn.log" 2>&1
grep -E "^\| (lumotree|native|fla)" "$OUT/kernels.md" | grep -v "MiB\|buffer\| records\| tables\| bank\| staging" \
    | cut -d'|' -f2-5 | head -20
tail -3 "$OUT/gpu_parity-v5.log"
