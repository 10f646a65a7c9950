#!/usr/bin/env bash
# The attention benchmark (`lumobench bench attention`) of staged revisions of serving/ and of the
# working tree's, back to back in one call on the device machine (one machine, one speed). Stage
# each revision NAME here first (the device copy has no repository):
#   rm -rf .stage/NAME && mkdir -p .stage/NAME && git archive REV serving | tar -x -C .stage/NAME && rm -r .stage/NAME/serving/models && git rev-parse --short REV > .stage/NAME/COMMIT
# (or copy a scratch serving/ there and write what it is into COMMIT), then on the device, carrying
# .whl and .stage:
#   OUT=$OUT ORDER="base NAME head" bash lumobench/bench/device/ab_attention_h200.sh
# Run n of an arm writes $OUT/attention-ARM-n/attention.md and .json and its log $OUT/attention-ARM-n.log;
# "head" is the working tree (labelled LUMOBENCH_COMMIT), any other name .stage/NAME/serving.
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
source "$(dirname "$0")/staged_arms.sh"
require_staged ${ORDER:-base head}
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
source lumobench/bench/device/carried_wheels.sh
mkdir -p "$OUT"
run=0
for arm in ${ORDER:-base head}; do
    run=$((run + 1))
    staged_arm "$arm"
    dest="$OUT/attention-$arm-$run"
    PYTHONPATH=$path python3 -c "import lumotree; print('lumotree from', lumotree.__file__)" > "$dest.log"
    LUMOBENCH_COMMIT=$commit PYTHONPATH=$path timeout "${ATTN_S:-150}" python3 -m lumobench.bench.attention \
        --out "$dest" --contexts "${CONTEXTS:-4096,32768}" ${ATTN_ARGS:-} >> "$dest.log" 2>&1
    echo "$arm (run $run, $commit): $(head -1 "$dest.log")"
    grep -E "^\| (BM|[0-9])" "$dest/attention.md" 2>/dev/null | head -8 || tail -5 "$dest.log"
done
