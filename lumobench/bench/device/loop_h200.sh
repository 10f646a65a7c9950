#!/usr/bin/env bash
# The real loop of a random-weight Qwen3.5-27B on the H200 (issue 23): the three lumotree arms'
# servers (`python -m lumotree.server --random-weights qwen3.5-27b`, bf16, forced acceptance at the
# paper's 4.05 / 3.17 accepted drafts per tree / MTP-5 cycle: speed work, outputs are not a
# model's), one after another (one 27B model fits the card at a time), each replayed by the harness
# with token-id prompts of CONTEXT tokens and TOKENS greedy ignore_eos tokens; then
# `python -m lumobench.bench.loop table` sets each server's wall time per cycle against its own
# device-timed cycle: $OUT/loop.json and loop.md. From the repository root:
#   OUT=/path/to/out LUMOBENCH_COMMIT=$(git rev-parse HEAD) bash lumobench/bench/device/loop_h200.sh
# Settings (environment):
#   OUT        output folder (required)
#   WHL        folder of the carried wheels                                     default .whl
#   CONTEXT    prompt tokens                                                    default 4096
#   TOKENS     generated tokens per request                                     default 256
#   REQUESTS   requests per arm                                                 default 4
#   FORCED     the forced-acceptance schedule (lumotree.sampling.forced)       default paper
#   ARMS       the arms                                    default "lumotree-ar lumotree-mtp5 lumotree"
#   DRAFT_VOCAB  ids of a random draft vocabulary for the MTP passes (0: none)    default 0
#   REPLAY_S   time limit of the replay in seconds                              default 480
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
source lumobench/bench/device/carried_wheels.sh
mkdir -p "$OUT"
runs=/tmp/loop-runs arms=/tmp/arms-27b corpus=/tmp/loop.jsonl
mkdir -p "$arms"
selected=()
for arm in ${ARMS:-lumotree-ar lumotree-mtp5 lumotree}; do  # the arms, with time to build a 27B model
    sed 's/^timeout_s = .*/timeout_s = 900/' "serving/arms/$arm.toml" > "$arms/$arm.toml"
    selected+=(--arm "$arms/$arm.toml")
done
python3 -m lumobench.bench.loop corpus "$corpus" --context "${CONTEXT:-4096}" --tokens "${TOKENS:-256}" \
    --requests "${REQUESTS:-4}"
export LUMOTREE_RANDOM_WEIGHTS=qwen3.5-27b LUMOTREE_DTYPE=bfloat16 LUMOTREE_FORCED_ACCEPTANCE=${FORCED:-paper}
export LUMOTREE_MAX_MODEL_LEN=$(( ${CONTEXT:-4096} + ${TOKENS:-256} + 64 ))
if (( ${DRAFT_VOCAB:-0} > 0 )); then
    python3 -m lumobench.bench.loop draft-vocab /tmp/draft-vocab.json --size "$DRAFT_VOCAB"
    export LUMOTREE_DRAFT_VOCAB=/tmp/draft-vocab.json
fi
command="LUMOTREE_RANDOM_WEIGHTS=qwen3.5-27b LUMOTREE_DTYPE=bfloat16 LUMOTREE_FORCED_ACCEPTANCE=${FORCED:-paper} \
lumobench replay loop.jsonl --api generate --sequential ${selected[*]} (context ${CONTEXT:-4096}, ${TOKENS:-256} tokens\
, draft vocabulary ${DRAFT_VOCAB:-0})"
timeout "${REPLAY_S:-480}" python3 -m lumobench.cli replay "$corpus" --api generate --sequential \
    "${selected[@]}" --out "$runs" > "$OUT/loop-replay.log" 2>&1
LUMOBENCH_COMMAND="$command" python3 -m lumobench.bench.loop table "$runs"/*/ --out "$OUT/loop" \
    || tail -30 "$OUT/loop-replay.log"
tar -czf "$OUT/loop-logs.tar.gz" -C "$runs" $(cd "$runs" && ls -d */server.log */requests.jsonl)
exit 0
