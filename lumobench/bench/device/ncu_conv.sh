# ncu durations of the conv diagnostic's eager launches (4 layers a variant), mean a variant (session 19).
# Usage on the device, from the repository root: bash lumobench/bench/device/ncu_conv.sh $OUT
W=$1
DIAG_NCU=1 timeout 200 ncu --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_write.sum,dram__bytes_read.sum \
  -k regex:"tree_conv_kernel|diag_kernel" python3 lumobench/bench/device/conv_diag.py > $W/ncu-conv.csv 2> $W/ncu-conv.err
python3 - "$W" <<'PY'
import csv, sys, io
W = sys.argv[1]
text = open(f"{W}/ncu-conv.csv").read()
names = [l[5:] for l in text.splitlines() if l.startswith("ncu: ")]
rows = list(csv.DictReader(io.StringIO("\n".join(l for l in text.splitlines() if l.startswith('"')))))
launches = {}
for r in rows:
    launches.setdefault(int(r["ID"]), {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
ids = sorted(launches)
print(len(ids), "launches,", len(names), "variants")
for i, name in enumerate(names):
    group = [launches[j] for j in ids[4 * i: 4 * i + 4]]
    if group:
        t = sum(g["gpu__time_duration.sum"] for g in group) / len(group)
        print(f"{name} | {t / 1000:.2f} us")
PY
