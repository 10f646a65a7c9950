"""`lumobench bench engine`: the LumoTree engine on CPU in one process, AR vs chain MTP-5 vs LumoTree.

    lumobench bench engine --out results/cpu/engine-bench.json     (or python -m lumobench.bench.engine)

Every request runs in each arm in turn (so drifting machine load hits the arms alike), with the
corpus's sampling settings and a fixed seed per request. Per arm: the Eq. 5 pooled decode rate
sum(n - 1) / sum(t_end - t_first) (t_first: the first token's event, after prefill), its per-run
range, the same tokens over the engine thread's CPU time (stable when other processes share the
machine), accepted drafts per speculative event, acceptance by depth, tokens per cycle, mean phase
spans, and the weight-read floor: the bytes of weights a cycle must stream over the machine's
measured read bandwidth (the memory-bound limit of this model size on a CPU).

    lumobench bench engine --kernels cpu-native --kernels cpu-fast     (native C vs PyTorch forward)

With several --kernels every arm runs under each kernel set, all interleaved per request; "vs AR" is
then over the first set's AR arm, and each set reports whether its arms gave the same tokens.

    lumobench bench engine --tree-shape compact --tree-shape paper     (one tree arm per shape)
    lumobench bench engine --march native --march haswell   (every arm on each ISA path of the native
                                        forward: -march=haswell is the AVX2 + FMA build on any x86-64)
    lumobench bench engine --kernels cpu-fast --draft-vocab none --draft-vocab dv.json
                                        (MTP and tree arms per draft vocabulary, side by side)
"""

from __future__ import annotations

import json
import os
import platform
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table
from tokenizers import Tokenizer

from lumobench.bench.output import command_line
from lumobench.corpus import load_corpus
from lumotree.engine.config import CPU_KERNEL_SETS, TREE_SHAPES, EngineConfig
from lumotree.engine.llm_engine import LLMEngine
from lumotree.engine.sequence import GenerationRequest
from lumotree.model import HybridLM, default_model_path
from lumotree.model.chat_template import model_chat_template
from lumotree.model.native import build
from lumotree.sampling import SamplingParams

ARMS = {"ar": "lumotree-ar", "mtp": "lumotree-mtp5", "tree": "lumotree"}
console = Console(stderr=True)


@dataclass
class ArmRun:
    """Totals of one arm over one pass of the corpus."""

    tokens: int = 0  # sum(n - 1) over requests with n >= 2
    decode_s: float = 0.0
    decode_cpu_s: float = 0.0  # CPU time of the engine thread over the same spans
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.tokens / self.decode_s if self.decode_s else 0.0


def load_requests(
    corpus: Path, model_dir: Path, max_tokens: int | None, greedy: bool
) -> list[GenerationRequest]:
    """Corpus records rendered with the model folder's chat template and tokenizer; a seed per record
    (its own, or from its id)."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    template = model_chat_template(model_dir)
    out = []
    for rec in load_corpus(corpus):
        raw = rec.model_dump(exclude_none=True)
        if rec.input_ids:
            ids = rec.input_ids
        elif template is None:
            raise ValueError(f"the model at {model_dir} has no chat template to render {rec.id}")
        else:
            text = template.render(
                messages=raw["messages"], tools=raw.get("tools"), add_generation_prompt=True
            )
            ids = tokenizer.encode(text).ids
        fields = {k: v for k, v in rec.sampling().items() if k not in ("max_tokens", "seed", "ignore_eos")}
        fields["top_k"] = max(fields.get("top_k", 0), 0)  # vLLM's -1 is "off", here 0
        params = SamplingParams(0.0) if greedy else SamplingParams(**fields)
        seed = rec.seed if rec.seed is not None else zlib.crc32(rec.id.encode())
        limit = max_tokens or rec.max_tokens or 128
        out.append(GenerationRequest(rec.id, ids, params, limit, seed=seed, ignore_eos=bool(rec.ignore_eos)))
    return out


def timed_request(engine: LLMEngine, req: GenerationRequest) -> tuple[list[int], float, float]:
    """Run one request alone: (tokens emitted, wall and thread-CPU seconds from the first token's
    event to the last)."""
    engine.add_request(req)
    first = end = (0.0, 0.0)
    tokens: list[int] = []
    while engine.has_unfinished():
        for event in engine.step():
            now = (time.perf_counter(), time.thread_time())
            if event.token_ids and not tokens:
                first = now
            tokens += event.token_ids
            end = now
    return tokens, end[0] - first[0], end[1] - first[1]


def read_bandwidth_gbs(mib: int = 256) -> float:
    """Single-thread streaming read bandwidth of this machine (GB/s, best of 5 sums)."""
    buf = torch.ones(mib * 2**18)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - start)
    return buf.numel() * 4 / best / 1e9


def weight_bytes(model: HybridLM) -> dict[str, int]:
    """Bytes a forward streams: the decoder layers and the vocabulary projection; the MTP layer."""
    size = {name: p.numel() * p.element_size() for name, p in model.named_parameters()}
    return {
        "layers": sum(
            v for k, v in size.items() if k.startswith("model.layers.") or k == "model.norm.weight"
        ),
        "lm_head": model.lm_head.weight.numel() * model.lm_head.weight.element_size(),
        "mtp": sum(v for k, v in size.items() if k.startswith("mtp.")),
    }


def _total(runs: list[ArmRun], key: str) -> float:
    return sum(r.metrics[key] for r in runs)


def summarise(
    kind: str,
    runs: list[ArmRun],
    bytes_: dict[str, int],
    bandwidth: float,
    depth: int,
    weight_scale: float = 1.0,
) -> dict[str, Any]:
    """Over all runs: pooled rate (and the per-run range), acceptance, mean spans, the weight-read floor."""
    spans = {
        phase: {
            "seconds": sum(r.metrics["spans"][phase]["seconds"] for r in runs),
            "count": sum(r.metrics["spans"][phase]["count"] for r in runs),
        }
        for phase in runs[0].metrics["spans"]
    }
    spec = {
        key: sum(r.metrics["spec"][key] for r in runs)
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    }
    per_pos = [sum(c) for c in zip(*(r.metrics["spec"]["accepted_per_pos"] for r in runs), strict=True)]
    cycles = spans["target"]["count"]
    # every request's first token comes from its prefill, not from a cycle
    tokens_per_cycle = (
        (_total(runs, "generation_tokens") - _total(runs, "requests")) / cycles if cycles else 0.0
    )
    passes = 0 if kind == "ar" else depth
    # weight_scale: the bytes the kernels stream per byte of the model's weights (the native forward
    # reads bfloat16 panels of a float32 model: 0.5)
    cycle_bytes = weight_scale * (
        bytes_["layers"] + bytes_["lm_head"] + passes * (bytes_["mtp"] + bytes_["lm_head"])
    )
    drafts = spec["num_drafts"]
    return {
        "arm": ARMS[kind],
        "pooled_tokens_per_s": sum(r.tokens for r in runs) / sum(r.decode_s for r in runs),
        # the same tokens over the engine thread's CPU time: insensitive to other processes
        # taking the cores (not to their cache and memory traffic)
        "pooled_tokens_per_cpu_s": sum(r.tokens for r in runs) / sum(r.decode_cpu_s for r in runs),
        "per_run_tokens_per_s": [r.rate for r in runs],
        "accepted_per_event": spec["num_accepted_tokens"] / drafts if drafts else None,
        "accepted_per_pos": per_pos,
        "draft_tokens_per_event": spec["num_draft_tokens"] / drafts if drafts else None,
        "tokens_per_cycle": tokens_per_cycle,
        "span_ms_per_cycle": {k: 1e3 * v["seconds"] / max(v["count"], 1) for k, v in spans.items()},
        "weight_read_floor_ms_per_token": 1e3 * cycle_bytes / (bandwidth * 1e9) / max(tokens_per_cycle, 1e-9),
        "prefix_cache_hit_rate": _total(runs, "prefix_cache_hits")
        / max(_total(runs, "prefix_cache_queries"), 1),
        "counters_per_run": [r.metrics for r in runs],
    }


def _metrics_json(engine: LLMEngine, requests: int) -> dict[str, Any]:
    m = engine.metrics()
    return {
        "spec": vars(m.spec),
        "generation_tokens": m.generation_tokens,
        "requests": requests,
        "prefix_cache_queries": m.prefix_cache_queries,
        "prefix_cache_hits": m.prefix_cache_hits,
        "spans": {k: {"seconds": v.seconds, "count": v.count} for k, v in m.spans.items()},
    }


def engine_command(
    corpus: Annotated[Path, typer.Argument(help="Request corpus (JSONL).")] = Path("corpora/demo.jsonl"),
    out: Annotated[Path | None, typer.Option(help="Write the results as JSON here.")] = None,
    runs: Annotated[int, typer.Option(min=1, help="Passes over the corpus (fresh engines each).")] = 3,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="Override every request's max_tokens.")
    ] = None,
    greedy: Annotated[bool, typer.Option(help="Greedy decoding instead of the corpus's sampling.")] = False,
    model: Annotated[
        Path | None, typer.Option(help="Checkpoint folder (default: the shipped model).")
    ] = None,
    kernels: Annotated[
        list[str] | None,
        typer.Option(
            help="Kernel set of the engines (auto, cpu-native, cpu-fast, reference); repeat it to "
            "run every arm under each set side by side, interleaved per request (default: auto)."
        ),
    ] = None,
    tree_shape: Annotated[
        list[str] | None,
        typer.Option(
            help="Tree shape of the LumoTree arm (auto, paper, compact); repeat it for one tree arm "
            "per shape (default: auto, the engine's choice for the kernels)."
        ),
    ] = None,
    draft_vocab: Annotated[
        list[str] | None,
        typer.Option(
            help="Draft vocabulary file of the MTP and tree arms (python -m lumotree.drafting.draft_vocab) "
            "or none; repeat it for those arms once per vocabulary."
        ),
    ] = None,
    march: Annotated[
        list[str] | None,
        typer.Option(
            help="-march of the native forward's build (native, haswell = AVX2 + FMA, ...); repeat it to "
            "run every arm on each ISA path side by side (default: $LUMOTREE_NATIVE_MARCH or native)."
        ),
    ] = None,
) -> None:
    """Benchmark AR, chain MTP-5 and LumoTree on CPU in one process (see the module docstring)."""
    if not corpus.is_file():
        console.print(f"[red]error:[/] no corpus at {corpus}")
        raise typer.Exit(2)
    sets = kernels or ["auto"]
    bad = [k for k in sets if k not in CPU_KERNEL_SETS]
    if bad or len(set(sets)) != len(sets):
        console.print(f"[red]error:[/] --kernels takes distinct values of {', '.join(CPU_KERNEL_SETS)}")
        raise typer.Exit(2)
    shapes = tree_shape or ["auto"]
    if any(s not in TREE_SHAPES for s in shapes) or len(set(shapes)) != len(shapes):
        console.print(f"[red]error:[/] --tree-shape takes distinct values of {', '.join(TREE_SHAPES)}")
        raise typer.Exit(2)
    vocabs = draft_vocab or ["none"]
    missing = [v for v in vocabs if v != "none" and not Path(v).is_file()]
    if missing or len(set(vocabs)) != len(vocabs):
        console.print(f"[red]error:[/] --draft-vocab takes distinct files or none; not a file: {missing}")
        raise typer.Exit(2)
    marches = march or [build.march()]
    if len(set(marches)) != len(marches):
        console.print("[red]error:[/] --march takes distinct values")
        raise typer.Exit(2)
    for target in marches:
        try:
            with native_march(target):
                build.load_library()
        except build.NativeBuildError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2) from None
    torch.set_num_threads(1)
    folder = model or default_model_path()
    requests = load_requests(corpus, folder, max_tokens, greedy)
    bandwidth = read_bandwidth_gbs()
    load_before = os.getloadavg()
    # (-march, kernel set, drafter, tree shape, draft vocabulary)
    keys = [
        (target, k, kind, shape, vocab)
        for target in marches
        for k in sets
        for kind in ARMS
        for shape in (shapes if kind == "tree" else ["auto"])
        for vocab in (vocabs if kind != "ar" else ["none"])
    ]
    totals: dict[tuple[str, ...], list[ArmRun]] = {key: [] for key in keys}
    outputs: dict[tuple[str, ...], dict[str, list[int]]] = {key: {} for key in keys}
    with Progress(console=console) as progress:
        task = progress.add_task("requests", total=runs * len(requests))
        for _ in range(runs):
            engines = {}
            for key in keys:
                target, k, kind, shape, vocab = key
                with native_march(target):  # the engine's native model binds this build's library
                    engines[key] = LLMEngine(
                        EngineConfig(
                            model=folder,
                            drafter=kind,  # type: ignore[arg-type]
                            kernels=k,  # type: ignore[arg-type]
                            tree_shape=shape,  # type: ignore[arg-type]
                            draft_vocab=None if vocab == "none" else vocab,
                        )
                    )
            current = {key: ArmRun() for key in keys}
            for req in requests:
                for key, engine in engines.items():
                    tokens, seconds, cpu_seconds = timed_request(engine, req)
                    outputs[key].setdefault(req.request_id, tokens)
                    if len(tokens) >= 2:
                        current[key].tokens += len(tokens) - 1
                        current[key].decode_s += seconds
                        current[key].decode_cpu_s += cpu_seconds
                progress.advance(task)
            for key, engine in engines.items():
                current[key].metrics = _metrics_json(engine, len(requests))
                totals[key].append(current[key])
    probe = engines[(marches[0], sets[0], "tree", shapes[0], vocabs[0])]
    bytes_ = weight_bytes(probe.model)
    arms = []
    for key in keys:
        target, k, kind, _, vocab = key
        engine = engines[key]
        scale = 2 / probe.model.dtype.itemsize if engine.config.kernels == "cpu-native" else 1.0
        arm = summarise(kind, totals[key], bytes_, bandwidth, engine.geometry.depth_mtp, scale)
        if kind == "tree" and len(shapes) > 1:
            arm["arm"] += f"[{engine.config.tree_shape}]"
        if kind != "ar" and len(vocabs) > 1:
            arm["arm"] += f"[dv {Path(vocab).stem}]" if vocab != "none" else "[full vocab]"
        arm["draft_vocab"] = None if vocab == "none" else vocab
        if len(sets) > 1:
            arm["arm"] += f"[{k}]"
        native = engine.config.kernels == "cpu-native"
        with native_march(target):
            arm["native_isa"] = build.isa() if native else None
        if len(marches) > 1:
            arm["arm"] += f"[{arm['native_isa'] or k}]"
        arm["march"] = target if native else None
        arm["kernels"] = engine.config.kernels  # what "auto" became on this machine
        arm["tree_shape"] = engine.config.tree_shape if kind == "tree" else None
        arm["rows"] = engine.geometry.rows
        arms.append(arm)
    ar_rate = arms[0]["pooled_tokens_per_s"]
    ar_cpu_rate = arms[0]["pooled_tokens_per_cpu_s"]
    for arm in arms:
        arm["speedup_vs_ar"] = arm["pooled_tokens_per_s"] / ar_rate
        arm["cpu_time_speedup_vs_ar"] = arm["pooled_tokens_per_cpu_s"] / ar_cpu_rate
    same = {
        f"{k}[{target}]" if len(marches) > 1 else k: _same_outputs(
            [outputs[key] for key in keys if key[:2] == (target, k)]
        )
        for target in marches
        for k in sets
    }
    result = {
        "command": command_line("engine"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(),
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "read_bandwidth_gbs": bandwidth,
            # other processes on the machine slow every arm alike (requests interleave across arms)
            "load_average_1min_before_after": [load_before[0], os.getloadavg()[0]],
        },
        "corpus": str(corpus),
        "requests": len(requests),
        "runs": runs,
        "sampling": "greedy" if greedy else "corpus settings, fixed seed per request",
        "model": str(folder),
        "weight_bytes": bytes_,
        "geometry": {"rows": probe.geometry.rows, "max_depth": probe.geometry.max_depth},
        "arms": arms,
        # per kernel set: requests whose first run gave the same tokens in every arm of that set
        "same_output_requests": same,
    }
    _print_table(arms, bandwidth)
    for k, n in same.items():
        console.print(f"{escape(k)}: same output in every arm on {n}/{len(requests)} requests")
    console.print(f"vs AR: over {arms[0]['arm']}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {out}")


@contextmanager
def native_march(target: str) -> Iterator[None]:
    """$LUMOTREE_NATIVE_MARCH set to `target` inside the block (the engine reads it when it loads
    the native library)."""
    before = os.environ.get(build.MARCH_ENV)
    os.environ[build.MARCH_ENV] = target
    try:
        yield
    finally:
        if before is None:
            del os.environ[build.MARCH_ENV]
        else:
            os.environ[build.MARCH_ENV] = before


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _same_outputs(arms: list[dict[str, list[int]]]) -> int:
    """Requests whose tokens are the same in every arm (each arm: request id -> tokens)."""
    return sum(all(arm[rid] == tokens for arm in arms[1:]) for rid, tokens in arms[0].items())


def _print_table(arms: list[dict[str, Any]], bandwidth: float) -> None:
    table = Table(title=f"engine on CPU, one process (read bandwidth {bandwidth:.1f} GB/s)")
    for col in ("arm", "pooled tok/s", "per-run range", "vs AR", "tok/CPU-s", "vs AR (CPU)", "accepted/event",
                "tok/cycle", "target ms", "drafter ms", "dispatch ms", "floor ms/tok", "ms/tok"):  # fmt: skip
        table.add_column(col, justify="left" if col == "arm" else "right")
    for a in arms:
        spans = a["span_ms_per_cycle"]
        rate = a["pooled_tokens_per_s"]
        acc = a["accepted_per_event"]
        table.add_row(
            escape(a["arm"]),  # "lumotree-ar[cpu-fast]" is not a style tag
            f"{rate:.1f}",
            f"{min(a['per_run_tokens_per_s']):.1f}–{max(a['per_run_tokens_per_s']):.1f}",
            f"{a['speedup_vs_ar']:.2f}x",
            f"{a['pooled_tokens_per_cpu_s']:.1f}",
            f"{a['cpu_time_speedup_vs_ar']:.2f}x",
            "–" if acc is None else f"{acc:.2f}",
            f"{a['tokens_per_cycle']:.2f}",
            f"{spans['target']:.2f}",
            f"{spans['drafter']:.2f}",
            f"{spans['dispatch']:.2f}",
            f"{a['weight_read_floor_ms_per_token']:.2f}",
            f"{1e3 / rate:.2f}",
        )
    Console(width=190).print(table)


if __name__ == "__main__":
    typer.run(engine_command)
