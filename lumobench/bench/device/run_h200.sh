#!/usr/bin/env bash
# One device-machine run of the LumoTree kernels (H200; no network there): install the carried
# wheels, record the card's state, then, each step inside its own time limit and writing to $OUT,
#   1. the GPU parity tests (tests/kernel_tests/test_gpu_parity.py),
#   2. optionally a GDN ablation table (lumobench/bench/kernels/ablate_gdn.py),
#   3. the kernel benchmark (`lumobench bench kernels`, checkpointed after every method),
# and print the parity summary and the benchmark's method rows. From the repository root:
#   OUT=/path/to/out bash lumobench/bench/device/run_h200.sh
# Settings (environment; the defaults reproduce H200 run 9, see results/h200/NOTES.md):
#   OUT          output folder (required)
#   WHL          folder of the carried wheels (fla-core 0.6.0 for the baseline; pydantic and its
#                needs for lumobench)                                    default .whl
#   RUN          tag of the log names (gpu_parity-v$RUN.log)              default 9
#   PARITY_K     pytest -k filter of the parity tests (empty: all)        default ""
#   PARITY_S     parity time limit in seconds; 0 skips the parity tests   default 240
#   ABLATE_SET   ablation set (run7, run8; empty: no ablation)            default ""
#   ABLATE_S     ablation time limit in seconds                           default 100
#   SUITES       benchmark suites (gdn,attention,selection,walk,commit)   default gdn
#   METHODS      GDN methods: label substrings, comma-separated (empty: all)
#                                      default value-major,tree-parallel tf32x3 product bv64,native,fla
#   ITERS, WARMUP, EAGER_ITERS         timed / warm-up / eager iterations default 100, 20, 5
#   FLA          1: include fla's chain kernels; 0: --no-fla             default 1
#   BENCH_S      benchmark time limit in seconds; 0 skips the benchmark   default 200
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
RUN=${RUN:-9}
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$WHL"/fla_core-0.6.0-*.whl "$WHL"/pydantic-2.14.4-*.whl "$WHL"/pydantic_core-2.50.5-*.whl \
    "$WHL"/annotated_types-0.8.0-*.whl "$WHL"/typing_inspection-0.4.5-*.whl \
    "$WHL"/typing_extensions-4.16.0-*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/serving:${PYTHONPATH:-}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"

if (( ${PARITY_S:-240} > 0 )); then
    timeout "${PARITY_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider -k "${PARITY_K:-}" \
        tests/kernel_tests/test_gpu_parity.py 2>&1 | tee "$OUT/gpu_parity-v$RUN.log"
fi
if [[ -n "${ABLATE_SET:-}" ]]; then
    timeout "${ABLATE_S:-100}" python3 -m lumobench.bench.kernels.ablate_gdn --set "$ABLATE_SET" \
        --out "$OUT" > "$OUT/ablate.log" 2>&1
fi
if (( ${BENCH_S:-200} > 0 )); then
    fla=(); [[ "${FLA:-1}" == 0 ]] && fla=(--no-fla)
    timeout "${BENCH_S:-200}" python3 -m lumobench.bench.kernels --suites "${SUITES:-gdn}" "${fla[@]}" \
        --methods "${METHODS-value-major,tree-parallel tf32x3 product bv64,native,fla}" \
        --iters "${ITERS:-100}" --warmup "${WARMUP:-20}" --eager-iters "${EAGER_ITERS:-5}" --out "$OUT" \
        > "$OUT/bench-gdn.log" 2>&1
fi

[[ -f "$OUT/gpu_parity-v$RUN.log" ]] && tail -1 "$OUT/gpu_parity-v$RUN.log"
[[ -f "$OUT/ablate.log" ]] && cat "$OUT/ablate.log"
[[ -f "$OUT/kernels.md" ]] && grep -E "^\| (lumotree|native|fla)" "$OUT/kernels.md" \
    | grep -v "MiB\|buffer\| records\| tables\| bank\| staging\| scratch" | cut -d'|' -f2-5 | head -20
exit 0
