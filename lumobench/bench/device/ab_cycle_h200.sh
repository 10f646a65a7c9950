#!/usr/bin/env bash
# The cycle benchmark of a baseline revision's serving/ and of the working tree's, back to back in
# one call on the device machine (one machine, one speed: like for like). Stage the baseline here
# first (the device copy has no repository):
#   rm -rf .stage/base && mkdir -p .stage/base && git archive REV serving | tar -x -C .stage/base && rm -r .stage/base/serving/models && git rev-parse --short REV > .stage/base/COMMIT
# then on the device, carrying .whl and .stage:
#   OUT=$OUT bash lumobench/bench/device/ab_cycle_h200.sh
# Run n of an arm writes $OUT/cycle-ARM-n/cycle.md and cycle.json and its log $OUT/cycle-ARM-n.log;
# ORDER sets the runs (default "base head"; repeat names to alternate, e.g. "base head base head"):
# "head" is the working tree, labelled LUMOBENCH_COMMIT, any other NAME the revision staged as above
# under .stage/NAME (labelled by .stage/NAME/COMMIT).
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
source "$(dirname "$0")/staged_arms.sh"
require_staged ${ORDER:-base head}
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
source lumobench/bench/device/carried_wheels.sh
mkdir -p "$OUT"
args=(--contexts "${CONTEXTS:-4096}" --variants fused --iters "${ITERS:-50}" --warmup 10
    --draft-vocab "${DRAFT_VOCAB:-16384}")
run=0
for arm in ${ORDER:-base head}; do
    run=$((run + 1))
    staged_arm "$arm"
    dest="$OUT/cycle-$arm-$run"
    PYTHONPATH=$path python3 -c "import lumotree; print('lumotree from', lumotree.__file__)" > "$dest.log"
    LUMOBENCH_COMMIT=$commit PYTHONPATH=$path timeout "${CYCLE_S:-150}" python3 -m lumobench.bench.cycle \
        --out "$dest" "${args[@]}" >> "$dest.log" 2>&1
    echo "$arm (run $run): $(head -1 "$dest.log")"
    grep -E "^\| [0-9]" "$dest/cycle.md" 2>/dev/null | head -7 || tail -5 "$dest.log"
done
