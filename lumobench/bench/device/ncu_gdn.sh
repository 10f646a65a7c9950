#!/usr/bin/env bash
# ncu of the staged GDN variants' scans on the H200 (session 17): per kernel launch, the warp-level
# instructions executed, duration, active warps, issue-slot use and the stall reasons per issued
# instruction, as $OUT/ncu-gdn.csv, and one line per launch printed. Stage the variants first
# (`lumobench bench gdn-variants stage old=REV ...`, carry .stage). From the repository root:
#   OUT=/path/to/out VARIANTS="old lanes" bash lumobench/bench/device/ncu_gdn.sh
set -euo pipefail
: "${OUT:?set OUT}"
VARIANTS=${VARIANTS:-old lanes}
M=smsp__inst_executed.sum,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,smsp__issue_active.avg.pct_of_peak_sustained_active
for s in mio_throttle short_scoreboard long_scoreboard math_pipe_throttle barrier wait lg_throttle \
    no_instruction dispatch_stall not_selected selected branch_resolving; do
    M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
ncu --clock-control none --metrics "$M" --csv -k regex:gdn_ \
    python3 -m lumobench.bench.gdn_variants launch "${VARIANTS// /,}" > "$OUT/ncu-gdn.csv"
python3 - "$OUT/ncu-gdn.csv" <<'PY'
import collections, csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
launches = collections.defaultdict(dict)
for r in rows[head + 1:]:
    d = dict(zip(rows[head], r))
    name = d["Metric Name"].replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
    launches[(d["ID"], d["Kernel Name"])][name] = d["Metric Value"]
for (launch, kernel), metrics in launches.items():
    print(launch, kernel, "; ".join(f"{m} {v}" for m, v in sorted(metrics.items())))
PY
