"""`lumobench bench prefill`: time to first token of AR, chain MTP-5 and LumoTree in one process.

    lumobench bench prefill --tokens 3000 --reps 3 --march native --march haswell --out prefill.json

The corpus's longest prompt is cut to --tokens tokens. Each engine (one per arm and -march) prefills
it and decodes --max-tokens tokens (greedy, ignoring EOS, prefix cache off, so every repetition
prefills afresh). The arms take turns per repetition, so a drifting machine load hits them alike.
`--inline-mtp` adds the speculative arms with the prompt's MTP rows written inside the prefill steps
(`EngineConfig.overlap_prompt_mtp` off) beside the default worker thread. The result per arm: the
seconds from add_request to the step that returns the first token (TTFT) and from then to the last
token (the decode, which carries whatever prompt work was left after the first token), each with
its ratio to AR's, by minimum and by median.
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


def time_request(engine: LLMEngine, req: GenerationRequest) -> tuple[float, float]:
    """(seconds from submitting `req` to its first token, seconds from then to its end)."""
    start = time.perf_counter()
    first: float | None = None
    engine.add_request(req)
    while engine.has_unfinished():
        events = engine.step()
        if first is None and any(e.token_ids for e in events):
            first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None, "the request ended without a token"
    return first - start, end - first


def prefill_command(
    corpus: Annotated[Path, typer.Argument(help="Request corpus (JSONL).")] = Path("corpora/demo.jsonl"),
    tokens: Annotated[int, typer.Option(min=1, help="Cut the longest prompt to this many tokens.")] = 3000,
    reps: Annotated[int, typer.Option(min=1, help="Interleaved repetitions.")] = 3,
    max_tokens: Annotated[
        int, typer.Option(min=2, help="Tokens decoded after the prompt (EOS ignored): the decode time.")
    ] = 16,
    march: Annotated[
        list[str] | None, typer.Option(help="-march of the native forward; repeat it for each ISA path.")
    ] = None,
    inline_mtp: Annotated[
        bool,
        typer.Option(
            "--inline-mtp",
            help="Also run the speculative arms with the prompt's MTP rows written inside the prefill "
            "steps (EngineConfig.overlap_prompt_mtp off): the A/B of the worker thread.",
        ),
    ] = False,
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
    variants = [(kind, True) for kind in ARMS] + [(k, False) for k in ARMS if k != "ar" and inline_mtp]
    engines: dict[tuple[str, str, bool], LLMEngine] = {}
    for target in marches:
        for kind, overlap in variants:
            try:
                with native_march(target):
                    config = EngineConfig(
                        drafter=kind,  # type: ignore[arg-type]
                        max_model_len=len(ids) + max_tokens + 64,
                        prefix_cache=False,
                        overlap_prompt_mtp=overlap,
                    )
                    engines[(target, kind, overlap)] = LLMEngine(config)
            except ValueError as exc:
                console.print(f"[red]error:[/] {exc}")
                raise typer.Exit(2) from None
    load_before = os.getloadavg()[0]
    ttft: dict[tuple[str, str, bool], list[float]] = {key: [] for key in engines}
    decode: dict[tuple[str, str, bool], list[float]] = {key: [] for key in engines}
    for i in range(reps):
        for key, engine in engines.items():
            req = GenerationRequest(f"p{i}-{key[1]}", ids, SamplingParams(0.0), max_tokens, ignore_eos=True)
            first, rest = time_request(engine, req)
            ttft[key].append(first)
            decode[key].append(rest)
    arms: list[dict[str, Any]] = []
    for target, kind, overlap in engines:
        arm: dict[str, Any] = {"arm": ARMS[kind], "march": target, "overlap_prompt_mtp": overlap}
        for name, seconds in (("ttft", ttft), ("decode", decode)):
            values, ar = seconds[(target, kind, overlap)], seconds[(target, "ar", True)]
            arm |= {
                f"{name}_seconds": values, f"{name}_min_s": min(values),
                f"{name}_median_s": statistics.median(values), f"{name}_min_vs_ar": min(values) / min(ar),
                f"{name}_median_vs_ar": statistics.median(values) / statistics.median(ar),
            }  # fmt: skip
        arms.append(arm)
    result = {
        "prompt": longest.request_id, "prompt_tokens": len(ids), "max_tokens": max_tokens, "reps": reps,
        "cpu_model": cpu_model(), "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        "arms": arms,
    }  # fmt: skip
    title = f"time to first token and decode of {max_tokens} tokens, {len(ids)}-token prompt"
    table = Table(title=f"{title} ({longest.request_id}), one process")
    columns = ("arm", "MTP rows", "march", "TTFT min s", "TTFT median s", "min vs AR", "median vs AR",
               "decode min s", "decode min vs AR")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col in ("arm", "MTP rows", "march") else "right")
    for a in arms:
        rows = "-" if a["arm"] == ARMS["ar"] else "worker thread" if a["overlap_prompt_mtp"] else "inline"
        table.add_row(a["arm"], rows, a["march"], f"{a['ttft_min_s']:.3f}", f"{a['ttft_median_s']:.3f}",
                      f"{a['ttft_min_vs_ar']:.2f}x", f"{a['ttft_median_vs_ar']:.2f}x",
                      f"{a['decode_min_s']:.3f}", f"{a['decode_min_vs_ar']:.2f}x")  # fmt: skip
    Console(width=170).print(table)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {out}")
