"""Resident memory of a launched arm, the figure its `memory_gb` records (the interleaving decision).

    lumobench bench arm-memory ARM [ARM...]      (or python -m lumobench.bench.arm_memory)

Each arm is launched as replay launches it (own process group), sent one greedy demo request of 64
tokens, then sampled for 5 s: the most resident memory its whole process group held (API server,
engine core and workers together; Linux /proc).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from lumobench.arms import REPO_ROOT, load_arm, resolve_arm
from lumobench.errors import LumobenchError
from lumobench.launch import launched
from lumobench.probe import call_sync
from lumobench.proc_cpu import PROC

PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLES, EVERY_S = 10, 0.5


def group_rss_bytes(pgid: int) -> int:
    """Resident bytes of the live processes of process group `pgid`."""
    total = 0
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
                total += int((entry / "statm").read_text().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return total


def measure(name: str, log_dir: Path) -> str:
    """One line: the arm's start-up time and the most its group held after one request (GiB)."""
    config, source = load_arm(name)
    arm = resolve_arm(config, source, port=0)
    record = json.loads((REPO_ROOT / "corpora" / "demo-greedy.jsonl").read_text().splitlines()[0])
    start = time.monotonic()
    with launched(arm, log_dir / f"{name}.log") as server:
        ready_s = time.monotonic() - start
        body = {"model": server.served_model, "messages": record["messages"], "max_tokens": 64}
        answer = call_sync("POST", arm.base_url + "/v1/chat/completions", 600, json=body | {"temperature": 0})
        assert server.proc is not None
        peak = 0
        for _ in range(SAMPLES):
            peak = max(peak, group_rss_bytes(server.proc.pid))
            time.sleep(EVERY_S)
    return (
        f"{name}: ready after {ready_s:.0f} s, HTTP {answer.status}, process group RSS {peak / 2**30:.2f} GiB"
    )


def arm_memory_command(
    arms: Annotated[list[str], typer.Argument(help="Arms to measure: names in serving/arms or .toml files.")],
) -> None:
    """Launch each arm, send it one request and print the most resident memory its process group held."""
    with tempfile.TemporaryDirectory(prefix="arm-memory-") as logs:
        try:
            for name in arms:
                typer.echo(measure(name, Path(logs)))
        except LumobenchError as exc:
            typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)
            raise typer.Exit(2) from None


if __name__ == "__main__":
    typer.run(arm_memory_command)
