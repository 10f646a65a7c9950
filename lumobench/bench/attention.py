"""Tree attention in model order on a CUDA GPU, against its KV-read floor.

Every attention layer of Qwen3.5-27B (16, each over its own cache) runs in one captured graph, as a
decode cycle runs them; the median graph time over the layers is a layer's time, and its ratio to
the layer's KV-read floor (K and V of the committed context, read once at the copy bandwidth
measured in the same process) is the figure issue 26 targets. Row sets: the one-row step (AR),
MTP-5's 6-row chain and the paper tree (32 rows), each at every context.

Default: the engine's tiles and split rule (`attention/decode.py`), then its two launches timed
apart (the split-K partials with the tails, the merge). --sweep: a grid of tiles at the engine's
split rule, then the fastest tiles under other split rules; each setting is also checked against the reference
(max |error| of the tree's outputs at the first context). One setting serves every row count
(row invariance: `attention/decode.py`), so the table ranks settings by the tree and shows AR's
and the chain's times beside it.

Usage: lumobench bench attention --out DIR [--contexts 4096,32768] [--sweep]
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated

import torch
import typer

from lumobench.bench.kernels.decode import AttentionShape
from lumobench.bench.output import command_line
from lumobench.bench.timing import Timer, copy_bandwidth, require_cuda
from lumobench.checks.random_trees import paper_tree
from lumotree.drafting.device_mtp import ATTENTION_PARTITIONS
from lumotree.tree import MAX_DEPTH, TreeDescriptor, chain_tree
from lumotree.verify.attention import decode, reference
from lumotree.verify.attention.decode import (
    KEYS_PER_SPLIT,
    SHORT_KEYS,
    SHORT_PARTITIONS,
    STAGES,
    AttentionConfig,
    cache_partitions,
    partial_buffers,
    short_partitions,
    tree_attention_,
)
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.graphs import CapturedStage

LAYERS = 16  # Qwen3.5-27B's attention layers
ROW_SETS = ("ar", "chain", "tree")
SWEEP_TILES = [
    AttentionConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
    for bm, bn, w, s in itertools.product((16, 32, 64), (32, 64, 128), (4, 8), (2, 3))
    if bm * bn <= 64 * 64 or w == 8  # the widest tiles only with 8 warps
]
SPLIT_RULES = [(2, 256), (1, 256), (4, 256), (2, 128), (2, 512), (2, 1024)]  # (program waves, keys a split)
SWEEP_FINALISTS = 3
DRAFTER_PARTITIONS = (16, 32, 64, 128)  # the prefix spread over this many partitions
DRAFTER_ROW_SETS = ("ar", "chain")  # a speculative pass's one row, pass 1's queued chain


@dataclass(frozen=True)
class Setting:
    """Tiles, split-K program waves (in the config) and the cache rows a partition; or, with
    `prefix_partitions`, the committed prefix spread over that many (the MTP drafter's form)."""

    config: AttentionConfig
    keys: int = KEYS_PER_SPLIT
    prefix_partitions: int = 0

    def label(self) -> str:
        c = self.config
        tiles = f"BM{c.block_m} BN{c.block_n} w{c.num_warps} s{c.num_stages}"
        if self.prefix_partitions:
            return f"{tiles} prefix over {self.prefix_partitions}"
        short = f"{SHORT_PARTITIONS}x{SHORT_KEYS}+" if self.keys > SHORT_KEYS else ""
        return f"{tiles} waves{c.program_waves} keys{short}{self.keys}"

    def short(self, capacity: int) -> int:
        """Short partitions of a cache of `capacity` rows (none when spread over the prefix)."""
        return 0 if self.prefix_partitions else short_partitions(capacity, self.keys)


class Workload:
    """One row set at one context: a cache, queries and outputs per layer, the tree's device tables
    (capacity: cache rows a layer, at least the context and one tree)."""

    def __init__(
        self,
        tree: TreeDescriptor,
        shape: AttentionShape,
        device: torch.device,
        seed: int,
        capacity: int = 0,
        layers: int = LAYERS,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.tree, self.shape, self.device = tree, shape, device
        self.capacity = max(capacity, tree.prefix_len + tree.rows + MAX_DEPTH + 1)
        gen = torch.Generator(device=device).manual_seed(seed)

        def randn(*size: int) -> torch.Tensor:
            return torch.randn(*size, generator=gen, device=device).to(dtype)

        cache = (self.capacity, shape.kv_heads, shape.dim)
        self.k = [randn(*cache) for _ in range(layers)]
        self.v = [randn(*cache) for _ in range(layers)]
        self.q = [randn(tree.rows, shape.q_heads, shape.dim) for _ in range(layers)]
        self.o = [torch.empty_like(q) for q in self.q]
        self.lse = [torch.empty(tree.rows, shape.q_heads, device=device) for _ in range(layers)]
        self.tables = DeviceTree(tree.rows, MAX_DEPTH, device).load_(tree)

    def splits(self, setting: Setting) -> int:
        return setting.prefix_partitions or cache_partitions(self.capacity, setting.keys)

    def run(self, setting: Setting, stages: frozenset[str] = STAGES) -> None:
        """Every layer's attention, in order (one scratch shared, as the engine's graph pool does)."""
        s, splits = self.shape, self.splits(setting)
        sizes = (self.tree.rows, s.q_heads, s.kv_heads, s.dim, splits, setting.config.block_m, self.device)
        if hasattr(decode, "partial_dtype"):  # as the engine of the revision timed stores them
            o_part, lse_part = partial_buffers(*sizes, decode.partial_dtype(self.q[0].dtype))
        else:  # (revisions before session 22 store fp32 partials)
            o_part, lse_part = partial_buffers(*sizes)
        for layer in range(len(self.q)):
            tree_attention_(
                self.q[layer], self.k[layer], self.v[layer], self.tables.bits, self.tables.prefix_len,
                self.o[layer], self.lse[layer], o_part, lse_part, splits, 1 / math.sqrt(s.dim),
                setting.config, stages, by_prefix=bool(setting.prefix_partitions),
                short=setting.short(self.capacity),
            )  # fmt: skip

    def layer_ms(self, setting: Setting, timer: Timer, stages: frozenset[str] = STAGES) -> float:
        """Median ms of one layer: the captured graph of all layers over their count."""
        self.run(setting, stages)  # compile outside the capture
        torch.cuda.synchronize()
        return timer(CapturedStage(lambda: self.run(setting, stages)).replay).median_ms / len(self.q)

    def max_error(self, setting: Setting) -> float:
        """max |o - reference| over the first layer's rows (the reference in float32)."""
        self.run(setting)
        got = self.o[0].float()
        expected, _ = reference.tree_attention(
            self.q[0].float(), self.k[0].float(), self.v[0].float(), self.tree
        )
        return float((got - expected.float()).abs().max())

    def floor_ms(self, bandwidth: float) -> float:
        """One layer's committed K and V, read once."""
        s = self.shape
        return 2 * self.tree.prefix_len * s.kv_heads * s.dim * 2 / bandwidth * 1e3


def row_set(kind: str, ctx: int) -> TreeDescriptor:
    """The one-row step, MTP-5's chain or the paper tree, verified after `ctx` committed keys."""
    if kind == "ar":
        return chain_tree([0], prefix_len=ctx)
    if kind == "chain":
        return chain_tree(list(range(6)), prefix_len=ctx)
    return paper_tree(random.Random(ctx), vocab=1000, prefix_len=ctx)


def measure(
    settings: list[Setting], workloads: dict[tuple[int, str], Workload], timer: Timer, bandwidth: float
) -> list[dict]:
    """One row per (setting, context, row set): ms a layer and its ratio to the floor."""
    first = min(ctx for ctx, _ in workloads)
    rows = []
    for setting in settings:
        error = None
        for (ctx, kind), work in workloads.items():
            rule = {"keys": setting.keys, "splits": work.splits(setting)}
            row = {"setting": setting.label(), **asdict(setting.config), **rule, "context": ctx, "rows": kind}
            try:
                if error is None and ctx == first and kind == "tree":
                    error = row["max_error"] = work.max_error(setting)
                ms = work.layer_ms(setting, timer)
                rows.append(row | {"layer_ms": ms, "over_floor": ms / work.floor_ms(bandwidth)})
            except Exception as exc:  # one failing setting must not end the table
                rows.append(row | {"error": repr(exc)[:300]})
    return rows


def stage_rows(setting: Setting, workloads: dict[tuple[int, str], Workload], timer: Timer) -> list[dict]:
    """The setting's launches timed apart (each alone in its own graph over the layers)."""
    return [
        {
            "context": ctx,
            "rows": kind,
            "stage": stage,
            "layer_ms": work.layer_ms(setting, timer, frozenset({stage})),
        }
        for (ctx, kind), work in workloads.items()
        for stage in sorted(STAGES, reverse=True)  # the partials' launch, then the merge
    ]


def drafter_settings() -> list[Setting]:
    """The MTP drafter's attention (`drafting/device_mtp.py`): the engine's tiles over its
    ATTENTION_PARTITIONS, then a 16-row query tile (a pass has 6 to 36 grouped rows) over
    DRAFTER_PARTITIONS."""
    engine = Setting(AttentionConfig(), prefix_partitions=ATTENTION_PARTITIONS)
    return [engine, *(Setting(AttentionConfig(block_m=16), prefix_partitions=p) for p in DRAFTER_PARTITIONS)]


def measure_drafter(
    settings: list[Setting], workloads: dict[tuple[int, str], Workload], timer: Timer, bandwidth: float
) -> list[dict]:
    """`measure` over the drafter's row sets (its one-row passes and MTP-5's queued chain), each
    setting's error checked on the first context's chain."""
    first = min(ctx for ctx, _ in workloads)
    rows = measure(settings, workloads, timer, bandwidth)
    errors = {s.label(): workloads[(first, "chain")].max_error(s) for s in settings}
    return [r | {"max_error": errors[r["setting"]]} for r in rows]


def render_drafter(rows: list[dict], contexts: list[int]) -> str:
    """The drafter's settings by context and row set (us a layer, over the KV-read floor)."""
    kinds = DRAFTER_ROW_SETS
    by = {(r["setting"], r["context"], r["rows"]): r for r in rows}
    head = " | ".join(f"{kind} {ctx} us (x floor)" for ctx in contexts for kind in kinds)
    lines = [f"| setting | {head} | max error |", "|---" * (2 + len(contexts) * len(kinds)) + "|"]
    for label in dict.fromkeys(r["setting"] for r in rows):
        cells = [
            f"{r['layer_ms'] * 1e3:.1f} ({r['over_floor']:.2f}x)" if "layer_ms" in r else "error"
            for r in (by.get((label, ctx, kind), {}) for ctx in contexts for kind in kinds)
        ]
        error = next(r["max_error"] for r in rows if r["setting"] == label)
        lines.append(f"| {label} | {' | '.join(cells)} | {error:.2e} |")
    return "\n".join(lines) + "\n"


def rank(rows: list[dict], contexts: list[int]) -> list[str]:
    """Setting labels, fastest first by the tree's summed layer time over the contexts."""
    totals: dict[str, list[float]] = {}
    for r in rows:
        if r["rows"] == "tree" and "layer_ms" in r and r["context"] in contexts:
            totals.setdefault(r["setting"], []).append(r["layer_ms"])
    complete = [s for s, times in totals.items() if len(times) == len(contexts)]
    return sorted(complete, key=lambda s: sum(totals[s]))


def render(rows: list[dict], stages: list[dict], order: list[str], contexts: list[int]) -> str:
    """The settings (fastest first) by context and row set, then the first setting's launches apart
    (the engine's unless --keys)."""
    by = {(r["setting"], r["context"], r["rows"]): r for r in rows}
    head = " | ".join(f"{kind} {ctx} us (x floor)" for ctx in contexts for kind in ROW_SETS)
    lines = [f"| setting | {head} | max error |", "|---" * (2 + len(contexts) * len(ROW_SETS)) + "|"]
    for label in order:
        cells = []
        for ctx in contexts:
            for kind in ROW_SETS:
                r = by.get((label, ctx, kind), {})
                ok = "layer_ms" in r
                cells.append(f"{r['layer_ms'] * 1e3:.1f} ({r['over_floor']:.2f}x)" if ok else "error")
        error = next(
            (by[(label, c, "tree")].get("max_error") for c in contexts if (label, c, "tree") in by), None
        )
        lines.append(f"| {label} | {' | '.join(cells)} | {error if error is None else f'{error:.2e}'} |")
    failed = sorted({r["setting"] for r in rows if "error" in r})
    if failed:
        lines += ["", "Settings that failed: " + "; ".join(failed)]
    if stages:
        lines += ["", "The first setting's launches apart (us a layer):", "",
                  "| context | rows | split-K and tails | merge |", "|---|---|---:|---:|"]  # fmt: skip
        for ctx in contexts:
            for kind in ROW_SETS:
                us = {
                    s["stage"]: s["layer_ms"] * 1e3
                    for s in stages
                    if s["context"] == ctx and s["rows"] == kind
                }
                lines.append(f"| {ctx} | {kind} | {us['partials']:.1f} | {us['merge']:.1f} |")
    return "\n".join(lines) + "\n"


def attention_command(
    out: Annotated[Path, typer.Option(help="directory for attention.json and attention.md")],
    contexts: Annotated[str, typer.Option(help="committed contexts, comma-separated")] = "4096,32768",
    capacity: Annotated[
        int,
        typer.Option(
            help="Cache rows a layer (0: the context and one tree; the engine's: max_model_len + tree)."
        ),
    ] = 0,
    keys: Annotated[
        int,
        typer.Option(help="Cache rows a partition of the first setting (0: the engine's KEYS_PER_SPLIT)."),
    ] = 0,
    sweep: Annotated[
        bool, typer.Option(help="Time a grid of tiles and split rules, not only the engine's.")
    ] = False,
    tiles: Annotated[
        str,
        typer.Option(
            help="Also time these tiles at the engine's split rule: comma-separated BM/BN/warps/stages, "
            "e.g. 128/64/8/2."
        ),
    ] = "",
    drafter: Annotated[
        bool,
        typer.Option(help="Also time the MTP drafter's form (the prefix spread over partitions, by tile)."),
    ] = True,
    iters: int = 30,
    warmup: int = 5,
) -> None:
    """Time the tree attention of Qwen3.5-27B's 16 layers in model order against its KV-read floor."""
    try:
        extra = parse_tiles(tiles)
    except ValueError as exc:
        typer.echo(f"error: --tiles: {exc}", err=True)
        raise typer.Exit(2) from None
    require_cuda("the attention benchmark")
    try:
        ctxs = sorted({int(c) for c in contexts.split(",")})
    except ValueError:
        typer.echo(f"error: --contexts takes comma-separated integers, got {contexts!r}", err=True)
        raise typer.Exit(2) from None
    device = torch.device("cuda")
    timer = Timer(device, iters, warmup)
    bandwidth = copy_bandwidth(device)
    shape = AttentionShape()
    workloads = {
        (ctx, kind): Workload(row_set(kind, ctx), shape, device, seed=ctx + i, capacity=capacity)
        for ctx in ctxs
        for i, kind in enumerate(ROW_SETS)
    }
    engine = Setting(AttentionConfig(), keys or KEYS_PER_SPLIT)
    cache = f"{capacity} cache rows a layer" if capacity else "caches of the context and one tree"
    meta = {
        "device": torch.cuda.get_device_name(),
        "command": command_line("attention"),
        "layers": LAYERS,
        "copy_bandwidth_gbs": bandwidth / 1e9,
        "capacity": capacity,
        "setting": engine.label(),
        "head": f"`{command_line('attention')}`: setting {engine.label()}; {cache}; "
        f"copy bandwidth {bandwidth / 1e9:.0f} GB/s",
    }
    out.mkdir(parents=True, exist_ok=True)
    rows = measure([engine], workloads, timer, bandwidth)
    stages = stage_rows(engine, workloads, timer)
    write(out, meta, rows, stages, ctxs)  # after each phase: a time limit keeps what was measured
    if drafter:
        drafting = {key: work for key, work in workloads.items() if key[1] in DRAFTER_ROW_SETS}
        meta["drafter"] = measure_drafter(drafter_settings(), drafting, timer, bandwidth)
        write(out, meta, rows, stages, ctxs)
    if extra:
        rows += measure([Setting(c) for c in extra], workloads, timer, bandwidth)
        write(out, meta, rows, stages, ctxs)
    if sweep:
        tiles = [Setting(c) for c in SWEEP_TILES if c != engine.config]
        rows += measure(tiles, workloads, timer, bandwidth)
        write(out, meta, rows, stages, ctxs)
        finalists = [s for s in [engine, *tiles] if s.label() in rank(rows, ctxs)[:SWEEP_FINALISTS]]
        rules = [
            Setting(replace(s.config, program_waves=w), k)
            for s in finalists
            for w, k in SPLIT_RULES
            if (w, k) != (s.config.program_waves, s.keys)
        ]
        rows += measure(rules, workloads, timer, bandwidth)
        write(out, meta, rows, stages, ctxs)
    print((out / "attention.md").read_text())


def parse_tiles(text: str) -> list[AttentionConfig]:
    """Configs from "BM/BN/warps/stages,..." (empty: none); ValueError naming a malformed entry."""
    configs = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        parts = entry.split("/")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"{entry!r} is not BM/BN/warps/stages (four positive integers)")
        bm, bn, warps, stages = map(int, parts)
        configs.append(AttentionConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages))
    return configs


def write(out: Path, meta: dict, rows: list[dict], stages: list[dict], contexts: list[int]) -> None:
    """attention.json (every number) and attention.md (the tables) under `out`."""
    (out / "attention.json").write_text(json.dumps(meta | {"results": rows, "stages": stages}, indent=2))
    text = meta["head"] + "\n\n" + render(rows, stages, rank(rows, contexts), contexts)
    if meta.get("drafter"):
        text += "\nThe MTP drafter's attention (one layer; its prefix spread over partitions):\n\n"
        text += render_drafter(meta["drafter"], contexts)
    (out / "attention.md").write_text(text)


if __name__ == "__main__":
    typer.run(attention_command)
