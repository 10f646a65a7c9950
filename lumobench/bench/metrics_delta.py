"""What a server's /metrics counted between two snapshots: every counter's and histogram's change, to set
beside what a client (GuideLLM, `vllm bench serve`) says it sent and received.

    curl -s URL/metrics > before.prom; <run the client>; curl -s URL/metrics > after.prom
    python -m lumobench.bench.metrics_delta before.prom after.prom [--json OUT]

Prints one line per sample that changed (histograms: `_count` and `_sum`; `_bucket` lines are left out),
labels other than model_name kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lumobench.metrics import parse_prometheus


def deltas(before: str, after: str) -> dict[str, float]:
    """after − before of every sample that changed, keyed `name{label=value,...}` (model_name dropped)."""

    def flat(text: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, samples in parse_prometheus(text).items():
            if name.endswith("_bucket"):
                continue
            for labels, value in samples:
                shown = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "model_name")
                key = f"{name}{{{shown}}}" if shown else name
                out[key] = out.get(key, 0.0) + value
        return out

    b, a = flat(before), flat(after)
    return {k: a[k] - b.get(k, 0.0) for k in sorted(a) if a[k] != b.get(k, 0.0)}


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lumobench.bench.metrics_delta", description=__doc__.splitlines()[0]
    )
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--json", type=Path, help="Also write the deltas here.")
    args = parser.parse_args()
    try:
        changed = deltas(args.before.read_text(), args.after.read_text())
    except OSError as exc:
        print(f"error: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    for key, value in changed.items():
        print(f"{key} {value:g}")
    if args.json:
        args.json.write_text(json.dumps(changed, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
