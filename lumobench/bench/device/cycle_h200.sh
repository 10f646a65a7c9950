#!/usr/bin/env bash
# One device-machine run of the 27B decode-cycle work (issue 12; H200, no network there): install
# the carried wheels, record the card's state, then, each step inside its own time limit and
# writing to $OUT,
#   1. the dense-path and tree-attention GPU tests (tests/kernel_tests/test_gpu_dense.py,
#      test_gpu_skinny_gemm.py, the attention tests of test_gpu_parity.py),
#   2. the decode-cycle benchmark (`python3 -m lumobench.bench.cycle`: fused, fused-cublas and
#      unfused variants side by side, random-weight Qwen3.5-27B),
#   3. the skinny-GEMM benchmark (`python3 -m lumobench.bench.skinny_gemm`),
#   4. the engine's GPU tests (tests/engine/test_device_path_gpu.py, the tiny model end to end),
#   5. the tree attention of the 16 layers in model order (`python3 -m lumobench.bench.attention`,
#      with ATTN_SWEEP=1 its grid of tiles and split rules),
# and print the tables. From the repository root:
#   OUT=/path/to/out LUMOBENCH_COMMIT=$(git rev-parse HEAD) bash lumobench/bench/device/cycle_h200.sh
# Settings (environment):
#   OUT        output folder (required)
#   WHL        folder of the carried wheels (pydantic, fastapi and their needs)   default .whl
#   CONTEXTS   committed contexts of the cycle benchmark                         default 4096,32768
#   VARIANTS   cycle variants, the headline first                 default fused,fused-cublas,unfused
#   ITERS      timed cycles per median                                           default 50
#   DRAFT_VOCAB  ids of the draft-vocabulary arms (the cycle benchmark's default: 32768)
#   ATTN_SWEEP set: the attention benchmark sweeps its grid                      default unset
#   DENSE_S, CYCLE_S, GEMM_S, ENGINE_S, ATTN_S   time limits in seconds (0 skips)
#                                                      default 120, 300, 90, 110, 0
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
source lumobench/bench/device/carried_wheels.sh
mkdir -p "$OUT"
# the card's state heads the first log (at most 8 files come back from a device call)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/dense-tests.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    >> "$OUT/dense-tests.log"

step() {  # step LIMIT LOG command...: run a step inside its limit, its output appended to $OUT/LOG
    local limit=$1 log=$2; shift 2
    (( limit > 0 )) && timeout "$limit" "$@" >> "$OUT/$log" 2>&1
}
step "${DENSE_S:-120}" dense-tests.log python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/kernel_tests/test_gpu_dense.py tests/kernel_tests/test_gpu_skinny_gemm.py tests/kernel_tests/test_gpu_parity.py \
    -k "dense or skinny or fused or attention"
step "${CYCLE_S:-300}" cycle.log python3 -m lumobench.bench.cycle --out "$OUT" \
    --contexts "${CONTEXTS:-4096,32768}" --variants "${VARIANTS:-fused,fused-cublas,unfused}" \
    --iters "${ITERS:-50}" --warmup 10 ${DRAFT_VOCAB:+--draft-vocab "$DRAFT_VOCAB"}
step "${GEMM_S:-90}" cycle.log python3 -m lumobench.bench.skinny_gemm --out "$OUT"
step "${ENGINE_S:-110}" engine-gpu-tests.log python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/engine/test_device_path_gpu.py
step "${ATTN_S:-0}" attention.log python3 -m lumobench.bench.attention --out "$OUT" \
    --contexts "${CONTEXTS:-4096,32768}" ${ATTN_SWEEP:+--sweep}

for log in dense-tests engine-gpu-tests; do [[ -f "$OUT/$log.log" ]] && echo "$log: $(tail -1 "$OUT/$log.log")"; done
[[ -f "$OUT/cycle.md" ]] && grep -E "^\| [0-9]|^\| (fused|unfused)" "$OUT/cycle.md" || tail -20 "$OUT/cycle.log"
[[ -f "$OUT/skinny_gemm.md" ]] && cat "$OUT/skinny_gemm.md" || tail -5 "$OUT/cycle.log"
[[ -f "$OUT/attention.md" ]] && head -30 "$OUT/attention.md" || { [[ -f "$OUT/attention.log" ]] && tail -20 "$OUT/attention.log"; }
exit 0
