"""`lumobench bench prefill`: time to first token of AR, chain MTP-5 and LumoTree in one process.

    lumobench bench prefill --tokens 3000 --reps 3 --march native --march haswell --out prefill.json

The corpus's longest prompt is cut to --tokens tokens. Each engine (one per arm and -march) prefills
it with max_tokens 1 (greedy, prefix cache off, so every repetition prefills afresh). The arms take
turns per repetition, so a drifting machine load hits them alike. The result per arm is the
seconds from add_request to the first token and the ratio to AR's, by minimum and by median.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.console import Console
from rich.table import Table

from lumobench.bench.engine import ARMS, cpu_model, load_requests, native_march
from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.model import default_model_path
from lumotree.model.native import build
from lumotree.sampling import SamplingParams

console = Console(stderr=True)


def time_to_first_token(engine: LLMEngine, req: GenerationRequest) -> float:
    """Seconds from submitting `req` (max_tokens 1) until it finished."""
    start = time.perf_counter()
    engine.add_request(req)
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def prefill_command(
    corpus: Annotated[Path, typer.Argument(help="Request corpus (JSONL).")] = Path("corpora/demo.jsonl"),
    tokens: Annotated[int, typer.Option(min=1, help="Cut the longest prompt to this many tokens.")] = 3000,
    reps: Annotated[int, typer.Option(min=1, help="Interleaved repetitions.")] = 3,
    march: Annotated[
        list[str] | None, typer.Option(help="-march of the native forward; repeat it for each ISA path.")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the results as JSON here.")] = None,
) -> None:
    """Prefill time (TTFT) of the AR, MTP-5 and tree arms side by side (see the module docstring)."""
    if not corpus.is_file():
        console.print(f"[red]error:[/] no corpus at {corpus}")
        raise typer.Exit(2)
    marches = march or [build.march()]
    torch.set_num_threads(1)
    folder = default_model_path()
    longest = max(load_requests(corpus, folder, 1, True), key=lambda r: len(r.prompt_token_ids))
    ids = longest.prompt_token_ids[:tokens]
    engines: dict[tuple[str, str], LLMEngine] = {}
    for target in marches:
        for kind in ARMS:
            try:
                with native_march(target):
                    config = EngineConfig(drafter=kind, max_model_len=len(ids) + 64, prefix_cache=False)  # type: ignore[arg-type]
                    engines[(target, kind)] = LLMEngine(config)
            except ValueError as exc:
                console.print(f"[red]error:[/] {exc}")
                raise typer.Exit(2) from None
    load_before = os.getloadavg()[0]
    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in engines}
    for i in range(reps):
        for key, engine in engines.items():
            req = GenerationRequest(f"p{i}-{key[1]}", ids, SamplingParams(0.0), 1)
            seconds[key].append(time_to_first_token(engine, req))
    arms: list[dict[str, Any]] = []
    for (target, kind), values in seconds.items():
        ar, median = seconds[(target, "ar")], statistics.median(values)
        arms.append({
            "arm": ARMS[kind], "march": target, "seconds": values, "min_s": min(values), "median_s": median,
            "min_vs_ar": min(values) / min(ar), "median_vs_ar": median / statistics.median(ar),
        })  # fmt: skip
    result = {
        "prompt": longest.request_id, "prompt_tokens": len(ids), "reps": reps, "cpu_model": cpu_model(),
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]], "arms": arms,
    }  # fmt: skip
    table = Table(title=f"time to first token, {len(ids)}-token prompt ({longest.request_id}), one process")
    for col in ("arm", "march", "min s", "median s", "min vs AR", "median vs AR"):
        table.add_column(col, justify="left" if col in ("arm", "march") else "right")
    for a in arms:
        table.add_row(a["arm"], a["march"], f"{a['min_s']:.3f}", f"{a['median_s']:.3f}",
                      f"{a['min_vs_ar']:.2f}x", f"{a['median_vs_ar']:.2f}x")  # fmt: skip
    Console(width=150).print(table)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {out}")
