"""What a server's /metrics counted between two snapshots: every counter's and histogram's change, to set
beside what a client (GuideLLM, `vllm bench serve`) says it sent and received.

    curl -s URL/metrics > before.prom; <run the client>; curl -s URL/metrics > after.prom
    lumobench bench metrics-delta before.prom after.prom [--json OUT]
                                        (or python -m lumobench.bench.metrics_delta)

Prints one line per sample that changed (histograms: `_count` and `_sum`; `_bucket` lines are left out),
labels other than model_name kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

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


def metrics_delta_command(
    before: Annotated[Path, typer.Argument(help="/metrics text before the client ran.")],
    after: Annotated[Path, typer.Argument(help="/metrics text after it.")],
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the deltas here.")] = None,
) -> None:
    """Print every counter and histogram that changed between two /metrics snapshots."""
    try:
        changed = deltas(before.read_text(), after.read_text())
    except OSError as exc:
        typer.echo(f"error: cannot read {exc.filename}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    for key, value in changed.items():
        typer.echo(f"{key} {value:g}")
    if json_out:
        json_out.write_text(json.dumps(changed, indent=2) + "\n")


if __name__ == "__main__":
    typer.run(metrics_delta_command)
