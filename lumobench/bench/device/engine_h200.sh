#!/usr/bin/env bash
# One device-machine run of the LumoTree engine on the GPU (H200; no network there): install the
# carried wheels (the harness and server dependencies the image lacks), record the card's state,
# then, each step inside its own time limit,
#   1. the engine's GPU tests (tests/engine/test_device_path_gpu.py: drafters identical, one
#      synchronisation per cycle, the cycle captured, forced acceptance, the random-weight preset),
#   2. for each corpus and dtype: `lumobench replay CORPUS` with the three lumotree arms and the
#      tree drafted on the host (lumotree-hostdraft, the A/B of device drafting), interleaved,
#      launched by the harness on this machine (their server picks the GPU: device auto), its
#      `lumobench report --format json` as $OUT/engine-<tag>-<dtype>.json, and the server's wall
#      time per cycle against its device-timed cycle (`lumobench bench loop table`) as
#      loop-<tag>-<dtype>.json in the archive (tag: "tiny" for corpora/demo.jsonl, else "tiny-<corpus name>"),
# and print the tables; the logs, the loop tables' markdown and the replays' requests.jsonl files
# come back in one archive ($OUT/logs.tar.gz; a device call returns at most 8 files). From the
# repository root:
#   OUT=/path/to/out LUMOBENCH_COMMIT=$(git rev-parse HEAD) bash lumobench/bench/device/engine_h200.sh
# Settings (environment):
#   OUT        output folder (required)
#   WHL        folder of the carried wheels (pydantic, fastapi, starlette, uvicorn, opentelemetry-api
#              and their needs)                                            default .whl
#   DTYPES     engine dtypes to replay (LUMOTREE_DTYPE of the arms)       default "float32 bfloat16"
#   CORPORA    corpora to replay, each with every dtype                   default corpora/demo.jsonl
#   TESTS_S    GPU test time limit in seconds; 0 skips them               default 240
#   REPLAY_S   time limit of each replay in seconds                       default 170
#   RUNS       repetitions per arm in each replay (fresh engine each)     default 1
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
source lumobench/bench/device/carried_wheels.sh
logs=/tmp/engine-logs
mkdir -p "$OUT" "$logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$logs/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$logs/gpu.txt"

if (( ${TESTS_S:-240} > 0 )); then
    timeout "${TESTS_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/engine/test_device_path_gpu.py > "$logs/engine-gpu-tests.log" 2>&1
fi
arm_flags="--arm lumotree-ar --arm lumotree-mtp5 --arm lumotree --arm lumotree-hostdraft"
tags=()
for corpus in ${CORPORA:-corpora/demo.jsonl}; do
    name=$(basename "$corpus" .jsonl)
    tag=tiny; [[ $name == demo ]] || tag=tiny-$name
    for dtype in ${DTYPES:-float32 bfloat16}; do
        tags+=("$tag-$dtype")
        runs=/tmp/engine-replay/$tag-$dtype
        # shellcheck disable=SC2086
        LUMOTREE_DTYPE=$dtype timeout "${REPLAY_S:-170}" python3 -m lumobench.cli replay "$corpus" \
            $arm_flags --runs "${RUNS:-1}" --out "$runs" > "$logs/replay-$tag-$dtype.log" 2>&1
        # AR first: the reference
        arms=("$runs"/*-lumotree-ar "$runs"/*-lumotree-mtp5 "$runs"/*-lumotree "$runs"/*-lumotree-hostdraft)
        python3 -m lumobench.cli report "${arms[@]}" --format json > "$OUT/engine-$tag-$dtype.json"
        LUMOBENCH_COMMAND="LUMOTREE_DTYPE=$dtype lumobench replay $corpus $arm_flags --runs ${RUNS:-1}" \
            python3 -m lumobench.bench.loop table "${arms[@]}" --out "$logs/loop-$tag-$dtype" > /dev/null 2>&1
        for dir in "$runs"/*/; do cp "$dir/server.log" "$logs/server-$tag-$dtype-$(basename "$dir").log"; done
    done
done
tar -czf "$OUT/logs.tar.gz" -C "$logs" . -C /tmp/engine-replay $(cd /tmp/engine-replay && ls -d */*/requests.jsonl)

[[ -f "$logs/engine-gpu-tests.log" ]] && tail -3 "$logs/engine-gpu-tests.log"
for tag in "${tags[@]}"; do
    echo "== $tag"
    grep -E "^│|differs" "$logs/replay-$tag.log"
    [[ -f "$logs/loop-$tag.md" ]] && grep -E "^\| (ar|mtp5|tree)" "$logs/loop-$tag.md"
done
exit 0
