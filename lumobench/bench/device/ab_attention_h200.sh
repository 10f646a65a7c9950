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
start_arms
run_arms attention "${ATTN_S:-150}" "^\| (BM|[0-9])" --contexts "${CONTEXTS:-4096,32768}" ${ATTN_ARGS:-}
