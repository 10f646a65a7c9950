"""Where a decode cycle's time goes: per arm, the device-timed phases of the captured cycle, the
in-process loop around it, and the kernels of one eager cycle by family (count and device time), so
the gap between the graph's time and its kernels' time is what launching them costs.

    lumobench bench cycle-profile --out results/h200/cycle-tiny     (CUDA only; or python -m
    lumobench.bench.cycle_profile)
    lumobench bench cycle-profile --random-weights qwen3.5-27b --context 4096 --out results/h200/cycle-27b

The shipped lumo-tiny-coder shows what launches cost (its bytes are few); a random-weight preset
shows where a large model's cycle goes beyond its weight reads.

Each arm runs the engine's loop on `DeviceRunner` as `lumobench.bench.cycle` does (forced
acceptance at the paper's means, so every arm publishes paths of realistic length; the shipped
model's own acceptance is the replay's, `lumobench replay corpora/demo.jsonl`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import torch
import typer

from lumobench.bench.cycle import ARMS, GREEDY, Arm, build_runner, fill_state_, kernel_times, run_arm
from lumobench.bench.output import command_line, current_commit, write_tables
from lumobench.bench.timing import require_cuda
from lumotree.model import HybridLM, default_model_path, load_checkpoint
from lumotree.model.random_weights import preset_config, preset_names, random_model
from lumotree.sampling import SamplingParams

#: kernel families by the first name fragment that matches (lowercase), in this order
FAMILIES = (
    ("tree tables", ("derive_tables",)),
    ("tree drafting", ("append_history", "suffix_scan", "suffix_pick", "paper_tree")),
    ("GEMMs", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitk", "skinny")),
    ("attention", ("attention", "attn", "merge")),
    ("GDN", ("gdn", "tree_wy", "replay", "scan")),
    ("conv", ("conv",)),
    ("selection and walk", ("rank", "select", "walk", "force", "topk", "sort", "softmax")),
    ("norms, RoPE, gates", ("norm", "rope", "sigmoid", "silu", "gate")),
    ("copies and indexing", ("copy", "index", "cat", "gather", "scatter", "fill")),
)


TOP_KERNELS = 25  # the longest kernels of an arm's eager cycle listed by name
#: the request sampling a profile runs with: greedy, or the paper's agent sampling (most of the demo
#: corpus's requests and every agent-corpus request)
SAMPLINGS = {
    "greedy": GREEDY,
    "paper": SamplingParams(temperature=0.6, top_p=0.95, top_k=20, presence_penalty=1.0),
}


def family(name: str) -> str:
    low = name.lower()
    return next((fam for fam, keys in FAMILIES if any(k in low for k in keys)), "other elementwise")


def profile_arm(
    model: HybridLM, arm: Arm, ctx: int, cycles: int, warmup: int, params: SamplingParams = GREEDY
) -> dict:
    """One arm: device phases and loop (medians over `cycles`), and one eager cycle's kernels."""
    runner = build_runner(model, ctx, arm, graphs=True, cycles=cycles + warmup)
    fill_state_(runner, ctx)
    timed = run_arm(runner, arm, ctx, cycles, warmup, params)
    fill_state_(runner, ctx)
    hidden = torch.zeros(
        1, runner.model.config.hidden_size, device=runner.model.device, dtype=runner.model.dtype
    )
    runner.start_decode(hidden, 3)
    runner.sampler(params, 0, [3], [3])
    kernels = kernel_times(runner)
    families: dict[str, dict[str, float]] = {}
    for name, times in kernels.items():
        entry = families.setdefault(family(name), {"count": 0, "ms": 0.0})
        entry["count"] += len(times)
        entry["ms"] += sum(times)
    busy = sum(f["ms"] for f in families.values())
    by_name = sorted(((name, len(t), sum(t)) for name, t in kernels.items()), key=lambda e: -e[2])
    return timed | {
        "kernels": sum(int(f["count"]) for f in families.values()),
        "kernel_ms": busy,
        "launch_gaps_ms": timed["cycle_ms"] - busy,
        "families": dict(sorted(families.items(), key=lambda kv: -kv[1]["ms"])),
        "top_kernels": [{"name": n[:120], "count": c, "ms": ms} for n, c, ms in by_name[:TOP_KERNELS]],
    }


def markdown(doc: dict) -> str:
    lines = [
        f"# Where a decode cycle goes: {doc['model']} ({doc['dtype']}), {doc['context']} tokens of context, "
        f"{doc.get('sampling', 'greedy')} sampling",
        "",
        f"Command: `{doc['command']}` at commit {doc['commit']}.",
        "Device phases: CUDA events inside the captured cycle (medians); loop: wall per cycle of the "
        "runner driven back to back in-process; kernels: one eager cycle under the profiler (device "
        "time of the kernels alone), so cycle - kernels = what launching them inside the graph costs.",
        "",
        "| arm | tables + verify ms | accept + publish ms | draft ms | cycle ms | loop ms | kernels "
        "| kernel ms | launch gaps ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, a in doc["arms"].items():
        lines.append(
            f"| {name} | {a['verify_ms']:.3f} | {a['accept_publish_ms']:.3f} | {a['draft_ms']:.3f} "
            f"| {a['cycle_ms']:.3f} | {a['loop_ms']:.3f} | {a['kernels']} | {a['kernel_ms']:.3f} "
            f"| {a['launch_gaps_ms']:.3f} |"
        )
    lines += ["", "Kernels of one cycle by family (count, device ms):", ""]
    names = list(doc["arms"])
    lines += ["| family | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    fams = sorted({f for a in doc["arms"].values() for f in a["families"]})
    for fam in fams:
        cells = []
        for name in names:
            f = doc["arms"][name]["families"].get(fam)
            cells.append(f"{int(f['count'])}, {f['ms']:.3f}" if f else "")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    for name, a in doc["arms"].items():
        lines += ["", f"The longest kernels of the {name} cycle (count, device ms):", ""]
        lines += [f"- {k['name']}: {k['count']}, {k['ms']:.4f}" for k in a.get("top_kernels", [])]
    return "\n".join(lines) + "\n"


def cycle_profile_command(
    out: Annotated[Path, typer.Option(help="Output path without suffix: writes .json and .md.")] = Path(
        "results/h200/cycle-tiny"
    ),
    model: Annotated[Path | None, typer.Option(help="Checkpoint (default: lumo-tiny-coder).")] = None,
    random_weights: Annotated[
        str | None,
        typer.Option(help="A shape preset with random weights instead of a checkpoint, e.g. qwen3.5-27b."),
    ] = None,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "bfloat16",
    context: Annotated[int, typer.Option(min=1, help="Committed context tokens.")] = 1024,
    iters: Annotated[int, typer.Option(min=1, help="Timed cycles per arm.")] = 100,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up cycles.")] = 20,
    sampling: Annotated[
        str,
        typer.Option(
            help="Request sampling: greedy, or paper (temperature 0.6, top-p 0.95, top-k 20, presence "
            "penalty 1.0; the forced schedule still picks the accepted path)."
        ),
    ] = "greedy",
    draft_vocab: Annotated[
        int,
        typer.Option(
            min=0,
            help="Also profile MTP-5 and the tree with a draft vocabulary of this many token ids "
            "(`lumobench bench cycle`'s mtp5-dvN and tree-dvN arms); 0: none.",
        ),
    ] = 0,
) -> None:
    """Profile the AR step, the chain MTP-5 cycle and the paper tree cycle of a model."""
    require_cuda("the cycle profile")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        typer.echo(f"error: --dtype takes float32 or bfloat16, got {dtype!r}", err=True)
        raise typer.Exit(2)
    if sampling not in SAMPLINGS:
        typer.echo(f"error: --sampling takes {' or '.join(SAMPLINGS)}, got {sampling!r}", err=True)
        raise typer.Exit(2)
    if model is not None and random_weights is not None:
        typer.echo("error: give --model or --random-weights, not both", err=True)
        raise typer.Exit(2)
    cuda = torch.device("cuda")
    if random_weights is not None:
        if random_weights not in preset_names():
            known = ", ".join(preset_names())
            typer.echo(f"error: unknown --random-weights preset {random_weights!r}; known: {known}", err=True)
            raise typer.Exit(2)
        name = f"{random_weights} (random weights)"
        net = random_model(preset_config(random_weights), cuda, dtypes[dtype], seed=0)
    else:
        folder = model or default_model_path()
        name = folder.name
        net = load_checkpoint(folder, dtype=dtypes[dtype], device=cuda)
    arms = [Arm("ar", ARMS["ar"], 0.0), Arm("mtp5", ARMS["mtp5"], 3.17), Arm("tree", ARMS["tree"], 4.05)]
    if draft_vocab:
        if draft_vocab < net.config.vocab_size:
            arms += [replace(a, name=f"{a.name}-dv{draft_vocab}", draft_vocab=draft_vocab) for a in arms[1:]]
        else:
            typer.echo(f"note: --draft-vocab {draft_vocab} is the whole vocabulary: no dv arms", err=True)
    doc = {
        "model": name,
        "dtype": dtype,
        "context": context,
        "sampling": sampling,
        "arms": {
            arm.name: profile_arm(net, arm, context, iters, warmup, SAMPLINGS[sampling]) for arm in arms
        },
        "command": command_line("cycle-profile"),
        "commit": current_commit(),
    }
    write_tables(out, doc, markdown)


if __name__ == "__main__":
    typer.run(cycle_profile_command)
