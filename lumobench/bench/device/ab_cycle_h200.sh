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
start_arms
run_arms cycle "${CYCLE_S:-150}" "^\| [0-9]" --contexts "${CONTEXTS:-4096}" --variants fused \
    --iters "${ITERS:-50}" --warmup 10 --draft-vocab "${DRAFT_VOCAB:-16384}"
