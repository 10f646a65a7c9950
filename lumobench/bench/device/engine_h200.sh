#!/usr/bin/env bash
# One device-machine run of the LumoTree engine on the GPU (H200; no network there): install the
# carried wheels (the harness and server dependencies the image lacks), record the card's state,
# then, each step inside its own time limit and writing to $OUT,
#   1. the engine's GPU tests (tests/engine/test_device_path_gpu.py: drafters identical, one
#      synchronisation per cycle, graphs captured, the random-weight preset),
#   2. for each dtype: `lumobench replay corpora/demo.jsonl` with the three lumotree arms, launched
#      by the harness on this machine (their server picks the GPU: device auto), and its
#      `lumobench report --format json` as $OUT/engine-tiny-<dtype>.json; the run directories stay
#      on the machine (/tmp/engine-replay), their requests.jsonl files come back in one archive,
# and print the tables. From the repository root:
#   OUT=/path/to/out bash lumobench/bench/device/engine_h200.sh
# Settings (environment):
#   OUT        output folder (required)
#   WHL        folder of the carried wheels (pydantic, fastapi, starlette, uvicorn, opentelemetry-api
#              and their needs)                                            default .whl
#   DTYPES     engine dtypes to replay (LUMOTREE_DTYPE of the arms)       default "float32 bfloat16"
#   TESTS_S    GPU test time limit in seconds; 0 skips them               default 240
#   REPLAY_S   time limit of each replay in seconds                       default 170
#   RUNS       repetitions per arm in each replay (fresh engine each)     default 1
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
source lumobench/bench/device/carried_wheels.sh
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"

if (( ${TESTS_S:-240} > 0 )); then
    timeout "${TESTS_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/engine/test_device_path_gpu.py > "$OUT/engine-gpu-tests.log" 2>&1
fi
for dtype in ${DTYPES:-float32 bfloat16}; do
    LUMOTREE_DTYPE=$dtype timeout "${REPLAY_S:-170}" python3 -m lumobench.cli replay corpora/demo.jsonl \
        --runs "${RUNS:-1}" --out "/tmp/engine-replay/$dtype" > "$OUT/replay-$dtype.log" 2>&1
    runs=/tmp/engine-replay/$dtype  # AR first: the report compares every arm with the first
    python3 -m lumobench.cli report "$runs"/*-lumotree-ar "$runs"/*-lumotree-mtp5 "$runs"/*-lumotree \
        --format json > "$OUT/engine-tiny-$dtype.json"
done
tar -czf "$OUT/replay-rows.tar.gz" -C /tmp/engine-replay $(cd /tmp/engine-replay && ls -d */*/requests.jsonl)

[[ -f "$OUT/engine-gpu-tests.log" ]] && tail -1 "$OUT/engine-gpu-tests.log"
for dtype in ${DTYPES:-float32 bfloat16}; do
    echo "== $dtype"
    grep -E "^│|differs" "$OUT/replay-$dtype.log"
done
exit 0
