"""The real loop against the cycle its kernels allow: the server's own tokens/s and wall time per
cycle, measured by the harness, next to the same server's device-timed cycle (issue 23).

    lumobench bench loop corpus loop-4k.jsonl --context 4096 --tokens 256
    LUMOTREE_RANDOM_WEIGHTS=qwen3.5-27b LUMOTREE_FORCED_ACCEPTANCE=paper ... \\
        lumobench replay loop-4k.jsonl --api generate --sequential --arm ... --out RUNS
    lumobench bench loop table RUNS/*-lumotree-ar RUNS/*-lumotree-mtp5 RUNS/*-lumotree \\
        --out results/h200/loop

(`python -m lumobench.bench.loop ...` is the same, for a copy without the console script.)

`corpus` writes token-id prompts (SGLang `/generate`: a random-weight model's tokens need no text,
and `/generate` times the first token by its count, not by decoded text) of `--context` tokens with
greedy, ignore_eos sampling of `--tokens` tokens. `table` reads the harness's run directories, one
per arm, and writes `loop.json` (+ `.md`):

    {"arms": {"ar": {"loop_ms", "cycle_ms", "loop_over_cycle", "accepted_per_cycle",
                     "tokens_per_s", ...}, "mtp5": {...}, "tree": {...}},
     "ratios": {...}, "command": ..., "commit": ...}

loop_ms = the harness's wall time per decode cycle: over every completed request, the time from the
stream chunk that brought its first token to the one that brought its last, over the chunks that
brought new tokens after the first (the server streams one chunk per cycle); cycle_ms = the same
server's device-timed cycle (the mean of its `lumotree:phase_seconds{phase="cycle"}`: CUDA events
inside the cycle's graph on a GPU, the runner's wall time on a CPU); tokens_per_s = the harness's
Eq. 5 pooled rate. With forced acceptance (speed work) the outputs are not a model's, so "same
output" is not reported.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Annotated

import typer

from lumobench.bench.output import command_line, current_commit, write_tables
from lumobench.errors import LumobenchError
from lumobench.metrics import phase_totals
from lumobench.reports.summary import build_report, load_run
from lumobench.results import RequestRow
from lumotree.drafting.draft_vocab import save_draft_vocab

loop_app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0], no_args_is_help=True)
ARM_KEYS = {
    "lumotree-ar": "ar",
    "lumotree-mtp5": "mtp5",
    "lumotree": "tree",
    "lumotree-hostdraft": "tree-host",
}


@loop_app.command()
def corpus(
    out: Annotated[Path, typer.Argument(help="Corpus file to write (JSONL).")],
    context: Annotated[int, typer.Option(min=1, help="Prompt tokens of every request.")] = 4096,
    tokens: Annotated[int, typer.Option(min=2, help="Tokens generated per request (ignore_eos).")] = 256,
    requests: Annotated[int, typer.Option(min=1, help="Requests in the corpus.")] = 6,
    vocab: Annotated[int, typer.Option(min=2, help="Prompt ids are drawn below this.")] = 8192,
) -> None:
    """Write a corpus of token-id prompts for the loop measurement."""
    rng = random.Random(context)
    with out.open("w") as f:
        for i in range(requests):
            record = {
                "id": f"loop-{context}-{i}",
                "messages": [{"role": "user", "content": "token ids, see input_ids"}],
                "input_ids": [rng.randrange(3, vocab) for _ in range(context)],
                "temperature": 0.0,
                "max_tokens": tokens,
                "ignore_eos": True,
            }
            f.write(json.dumps(record) + "\n")
    typer.echo(f"wrote {out}: {requests} requests of {context} prompt tokens, {tokens} tokens each")


@loop_app.command("draft-vocab")
def draft_vocab(
    out: Annotated[Path, typer.Argument(help="Draft vocabulary file to write (JSON).")],
    size: Annotated[int, typer.Option(min=1, help="Token ids in it.")] = 32768,
    vocab: Annotated[int, typer.Option(min=2, help="The model's vocabulary size.")] = 248320,
) -> None:
    """A draft vocabulary of `size` ids drawn at random (a random-weight model has no frequent
    tokens: any subset streams the same bytes), for `--draft-vocab` in speed work."""
    ids = random.Random(size).sample(range(vocab), min(size, vocab))
    save_draft_vocab(out, ids, vocab, f"{size} random ids (speed work)")
    typer.echo(f"wrote {out}: {len(ids)} of {vocab} ids")


def client_cycles(rows: list[RequestRow]) -> tuple[float, int]:
    """(seconds, cycles) the client saw: per request, from the chunk with its first token to the
    chunk with its last, and the token-bearing chunks after the first."""
    seconds, cycles = 0.0, 0
    for row in rows:
        if row.status != "completed" or not row.chunk_tokens or not row.chunk_ns:
            continue
        times, seen = [], 0
        for tokens, ns in zip(row.chunk_tokens, row.chunk_ns, strict=False):
            if tokens > seen:
                times.append(ns)
                seen = tokens
        if len(times) > 1:
            seconds += (times[-1] - times[0]) / 1e9
            cycles += len(times) - 1
    return seconds, cycles


def arm_loop(path: Path) -> dict:
    """One arm's loop figures from its run directory (see the module docstring)."""
    run, meta, rows = load_run(path)
    report = build_report([path])[0]
    device_s = server_cycles = 0.0
    for _, _, before, after in run.metric_segments():
        s, c = phase_totals(before, after).get("cycle", (0.0, 0.0))
        device_s, server_cycles = device_s + s, server_cycles + c
    wall_s, cycles = client_cycles(rows)
    if not server_cycles or not cycles:
        raise typer.BadParameter(
            f"{path}: no decode cycles measured (no cycle metric or no per-chunk counts)"
        )
    loop_ms, cycle_ms = 1e3 * wall_s / cycles, 1e3 * device_s / server_cycles
    return {
        "arm": meta.arm.name,
        "run_dir": str(path),
        "loop_ms": loop_ms,
        "cycle_ms": cycle_ms,
        "loop_over_cycle": loop_ms / cycle_ms,
        "accepted_per_cycle": report.accepted_per_event or 0.0,
        "tokens_per_s": report.pooled_tokens_per_s,
        "tokens": report.tokens,
        "cycles": cycles,
        "server_cycles": int(server_cycles),
        "completed": report.completed,
        "phase_ms": report.phase_ms,
    }


def markdown(doc: dict) -> str:
    lines = [
        "# The real loop on the H200: server wall time per cycle against its device-timed cycle",
        "",
        f"Command: `{doc['command']}` at commit {doc['commit']}.",
        "loop = the harness's decode wall time over the server's decode cycles; cycle = the same server's "
        "device-timed cycle (CUDA events inside its graph); tok/s = Eq. 5 pooled rate.",
        "",
        "| arm | loop ms | cycle ms | loop / cycle | accepted / cycle | tok/s | cycles |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, a in doc["arms"].items():
        lines.append(
            f"| {key} | {a['loop_ms']:.3f} | {a['cycle_ms']:.3f} | {a['loop_over_cycle']:.3f} "
            f"| {a['accepted_per_cycle']:.2f} | {a['tokens_per_s']:.1f} | {a['cycles']} |"
        )
    lines += ["", *(f"- {name}: {value:.3f}" for name, value in doc["ratios"].items())]
    return "\n".join(lines) + "\n"


@loop_app.command()
def table(
    runs: Annotated[list[Path], typer.Argument(help="Run directories of the lumotree arms (any order).")],
    out: Annotated[Path, typer.Option(help="Output path without suffix: writes .json and .md.")] = Path(
        "results/h200/loop"
    ),
) -> None:
    """Assemble loop.json / loop.md from the run directories of one loop measurement."""
    arms: dict[str, dict] = {}
    for path in runs:
        try:
            figures = arm_loop(path)
        except LumobenchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        arms[ARM_KEYS.get(figures["arm"], figures["arm"])] = figures
    rate = {k: a["tokens_per_s"] for k, a in arms.items()}
    ratios = {}
    if {"ar", "tree"} <= rate.keys():
        ratios["tree_over_ar"] = rate["tree"] / rate["ar"]
    if {"mtp5", "tree"} <= rate.keys():
        ratios["tree_over_mtp5"] = rate["tree"] / rate["mtp5"]
    if {"tree-host", "tree"} <= rate.keys():  # trees drafted on the device against the host
        ratios["tree_over_tree_host"] = rate["tree"] / rate["tree-host"]
    doc = {
        "arms": arms,
        "ratios": ratios,
        "command": os.environ.get("LUMOBENCH_COMMAND") or command_line("loop"),
        "commit": current_commit(),
    }
    write_tables(out, doc, markdown)


if __name__ == "__main__":
    loop_app()
