"""The LumoTree decode cycle of a random-weight Qwen3.5-27B on one GPU, through the engine's own
runner (`DeviceRunner.cycle`: the triton kernel set, one captured graph per cycle, the device walk),
against the weight-read floor measured in the same process (paper §VII-H, Tables XIV-XV).

    lumobench bench cycle --out results/h200     (CUDA only; or python -m lumobench.bench.cycle)

Per context length: the AR step (1 row), the chain MTP-5 cycle (6 rows) and the paper tree cycle
(32 rows). Each arm is the engine's loop without the engine around it: the runner built as the
engine builds it, its drafter (`lumotree.drafting.drafter.Drafter`, the tree's suffix drafter primed
with a repetitive history so that tails and rescue branches appear) forming each tree from the last
cycle's results, and `runner.cycle(tree, sampler, chain_next=True, follow=...)` back to back, as
the engine calls it (every cycle launched ahead, the tree drafted on the device as the engine's
runner does). Random weights accept nothing, so the runner runs
with a forced-acceptance schedule (the paper's mean 4.05 accepted drafts per tree event and 3.17
per MTP-5 event, as `--tree-accepted` / `--mtp-accepted`; `lumotree.sampling.forced`): publication
and drafting work on paths of realistic length. Reported per arm, medians over the timed cycles:
the device-timed cycle and its phases (CUDA events inside the graph: tables + verify, accept +
publish, drafting), and the wall time per cycle of the loop in this process (`loop_ms`: what the
host adds when nothing but the runner runs). The projected decode rate is (accepted + 1) / cycle.
Also: GDN verification of the 48 GDN layers in model order (one launch per layer, captured, 32
rows; the scans from prepared records as the engine runs them, and from raw inputs), tree attention
at each context against its KV-read floor, memory, and (`--gemv`, the default) the skinny GEMM alone
at the 27B projection shapes, 1 / 6 / 32 rows, as a fraction of the copy bandwidth: what one GEMM
adds to a CUDA graph of them (`gemv_fraction_of_copy_bw`, since session 14; `lumobench bench
skinny-gemm` has the full table and the earlier one-graph figure).

Variants, side by side in the one process: "fused" is the product's path (fused projections and
the dense Triton kernels of `lumotree/model/fused/`, the skinny Triton GEMM for every projection up
to 32 rows: row-invariant), "fused-skinny" the skinny GEMM only where it beat cuBLAS, up to 16 rows
(the fastest mix, not row-invariant), "fused-cublas" cuBLAS for every projection, "unfused" the
engine with all of them off (separate cuBLAS projections, PyTorch elementwise ops);
"fused-launched-norms" the product's path with every pre-norm a launch of its own (before session
22's producer-side norms). The first variant
named is timed at every context, the others at the first; each variant's AR cycle is also
profiled once eagerly (kernel count, GEMM time against the rest).

With `--draft-vocab N` (default 32768) the first variant also times MTP-5 and the tree with a draft
vocabulary of N token ids (`lumotree/drafting/draft_vocab.py`: each MTP pass reads N rows of the
vocabulary projection instead of all of them), under the same forced acceptance: the acceptance a
smaller draft vocabulary costs is measured on the shipped model (results/cpu/draft-vocab.md).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import torch
import typer

from lumobench.bench.output import command_line, current_commit
from lumobench.bench.skinny_gemm import bench_skinny_gemm, for_shape_fractions
from lumobench.bench.timing import Timer, copy_bandwidth, require_cuda
from lumobench.checks.random_trees import paper_tree
from lumotree.drafting.drafter import Drafter
from lumotree.drafting.geometry import GeometryConfig
from lumotree.drafting.suffix import SuffixDrafter
from lumotree.engine.device_runner import DeviceRunner
from lumotree.engine.runner import CycleResult
from lumotree.model.fused.ops import GemmBackend, KernelMode, kernel_mode
from lumotree.model.model import HybridLM
from lumotree.model.random_weights import preset_config, random_model
from lumotree.model.state import GDNState, KVCache
from lumotree.sampling import SamplingParams
from lumotree.sampling.forced import ForcedAcceptance, mean_schedule
from lumotree.tree import TreeDescriptor, TreeTopology
from lumotree.verify import device_ops
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.plan import count_paths
from lumotree.verify.gdn.prepare import prepare_operands_
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands
from lumotree.verify.graphs import CapturedStage

if TYPE_CHECKING:  # (the revisions before session 22 that ab_cycle_h200.sh times have no such name)
    from lumotree.model.fused.ops import NormPlacement

MAX_DEPTH = 11
VARIANTS: dict[str, tuple[KernelMode, GemmBackend, NormPlacement]] = {
    "fused": ("auto", "exact", "pending"),
    "fused-launched-norms": ("auto", "exact", "launched"),
    "fused-skinny": ("auto", "skinny", "pending"),
    "fused-cublas": ("auto", "cublas", "pending"),
    "unfused": ("off", "cublas", "pending"),
}
GEMM_KERNELS = ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitkreduce")


def variant_mode(variant: str) -> AbstractContextManager[None]:
    """`kernel_mode` of a variant; the pre-norms' placement passed only when it is not the default
    (so the variants of revisions before session 22, whose kernel_mode takes no `norms`, still run
    when `ab_cycle_h200.sh` times their serving/ with this benchmark)."""
    mode, gemm, norms = VARIANTS[variant]
    return kernel_mode(mode, gemm) if norms == "pending" else kernel_mode(mode, gemm, norms)


GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True)
class Arm:
    """A drafter: its geometry (AR, chain MTP-5 or the paper tree padded to 32 rows), the forced
    mean accepted drafts, and the size of the MTP passes' draft vocabulary (0: the whole one)."""

    name: str
    geometry: GeometryConfig
    accepted: float
    draft_vocab: int = 0

    @property
    def mtp(self) -> tuple[int, int] | None:
        g = self.geometry
        return None if g.depth_mtp == 0 else (g.depth_mtp, 1 + g.siblings_per_depth)


ARMS = {
    "ar": GeometryConfig(0, 0, 0, (), rows=1, max_depth=MAX_DEPTH),
    "mtp5": GeometryConfig(5, 0, 0, (), rows=6, max_depth=MAX_DEPTH),
    "tree": GeometryConfig(rows=32, max_depth=MAX_DEPTH),
}


def _tensors(obj: object, depth: int = 3) -> list[torch.Tensor]:
    """Tensors reachable through the attributes, lists, tuples and dicts of `obj` (a few levels)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth == 0 or isinstance(obj, torch.nn.Module | str | int | float | bool | type(None)):
        return []
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, list | tuple):
        items = list(obj)
    else:
        items = list(getattr(obj, "__dict__", {}).values())
    return [t for item in items for t in _tensors(item, depth - 1)]


def persistent_buffers(runner: DeviceRunner) -> list[dict]:
    """The runner's device memory by name (paper Table XV): the weights by part, the request state
    by kind, the MTP drafter, the tree tables, the walk, and the graphs' pool; each storage counted
    once, under the first name that reaches it."""
    model, seen = runner.model, set()

    def size(tensors: list[torch.Tensor]) -> int:
        total = 0
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    layers = model.model.layers
    gdn = [s for s in runner.state.layers if isinstance(s, GDNState)]
    kv = [s for s in runner.state.layers if isinstance(s, KVCache)]
    mtp = runner.device_mtp
    linear = [p for layer in layers if layer.is_linear for p in layer.parameters()]
    attention = [p for layer in layers if not layer.is_linear for p in layer.parameters()]
    parts = [
        ("weights: embedding", list(model.model.embed_tokens.parameters())),
        ("weights: vocabulary projection (none of its own when tied)", [model.lm_head.weight]),
        ("weights: GDN layers (projections, conv, norms, MLPs)", linear),
        ("weights: attention layers (with their MLPs)", attention),
        ("weights: final norm", list(model.model.norm.parameters())),
        ("weights: MTP module", list((model.mtp or torch.nn.Module()).parameters())),
        ("state: GDN recurrent bank (fp32)", [runner.state.gdn_bank, *(s.recurrent for s in gdn)]),
        ("state: conv states", [s.conv for s in gdn]),
        ("state: KV caches", [t for s in kv for t in (s.key, s.value)]),
        ("MTP drafter: KV cache", [] if mtp is None else [mtp.cache.key, mtp.cache.value]),
        ("MTP drafter: draft-vocabulary rows and buffers", [] if mtp is None else _tensors(mtp)),
        ("tree tables (DeviceTree)", _tensors(runner.tables)),
        ("device walk and sampler", _tensors(runner.walk) + _tensors(runner.acceptance)),
        ("cycle results (device and pinned slots)", _tensors(runner, depth=2)),
    ]  # fmt: skip
    rows = [{"buffer": name, "mib": size([t for t in ts if t is not None]) / 2**20} for name, ts in parts]
    rows.append({"buffer": "CUDA graph pool (the captured cycles)", "mib": runner.graph_bytes / 2**20})
    return rows


def draft_ids(size: int, vocab: int, device: torch.device) -> torch.Tensor | None:
    """`size` sorted token ids drawn at random (a random-weight model has no frequent tokens: any
    subset streams the same bytes), None for 0."""
    if not size:
        return None
    generator = torch.Generator().manual_seed(size)
    return torch.randperm(vocab, generator=generator)[:size].sort().values.to(device)


def build_runner(model: HybridLM, ctx: int, arm: Arm, graphs: bool, cycles: int = 0) -> DeviceRunner:
    """The runner the engine builds for this arm, with its forced acceptance and draft vocabulary,
    and room for `ctx` committed tokens plus what `cycles` cycles may emit."""
    geo = arm.geometry
    forced = ForcedAcceptance(mean_schedule(arm.accepted), f"{arm.accepted}") if arm.mtp else None
    ids = draft_ids(arm.draft_vocab, model.config.vocab_size, model.device)
    capacity = ctx + (cycles + 2) * (MAX_DEPTH + 1) + geo.rows
    tree = Drafter(geo, SuffixDrafter()).kind == "tree"
    drafting = (geo, SuffixDrafter()) if tree else None  # the tree drafted on the device, as the engine does
    return DeviceRunner(
        model, capacity, geo.rows, MAX_DEPTH, arm.mtp, not tree, graphs, ids, forced, drafting
    )


def weight_bytes(model: HybridLM) -> int:
    """Bytes a decode step must stream: every parameter once, except the embedding table (one
    row is read) and the MTP module (drafting only)."""
    skip = {id(model.model.embed_tokens.weight)} | {
        id(p) for p in (model.mtp or torch.nn.Module()).parameters()
    }
    if model.lm_head.weight is model.model.embed_tokens.weight:
        skip.discard(id(model.lm_head.weight))
    params = {id(p): p for p in model.parameters() if id(p) not in skip}
    return sum(p.numel() * p.element_size() for p in params.values())


def kv_bytes_per_token(model: HybridLM) -> int:
    """KV-cache bytes one token takes in every attention layer of the target."""
    cfg = model.config
    layers = sum(not layer.is_linear for layer in model.model.layers)
    return layers * 2 * cfg.num_key_value_heads * cfg.head_dim * model.dtype.itemsize


def history(length: int, vocab: int, period: int = 97) -> list[int]:
    """A repetitive token history: the suffix drafter finds continuations in it, so the paper tree
    gets a principal tail and rescue branches (random-weight MTP drafts alone would leave it a bare
    MTP part)."""
    pattern = random.Random(period).sample(range(3, min(vocab, 60000)), period)
    return [pattern[i % period] for i in range(length)]


def run_arm(
    runner: DeviceRunner,
    arm: Arm,
    ctx: int,
    cycles: int,
    warmup: int,
    params: SamplingParams = GREEDY,
) -> dict[str, float]:
    """The engine's decode loop on `runner` at context `ctx`: medians over `cycles` cycles (after
    `warmup`) of the device-timed cycle and phases and of the host wall time per cycle, and the
    mean accepted drafts. `params`: the request's sampling (the forced schedule still picks the
    accepted path; sampling settings change the logits processing every cycle runs)."""
    suffix = SuffixDrafter()
    drafter = Drafter(arm.geometry, suffix)
    prompt = history(ctx, runner.model.config.vocab_size)
    drafter.begin(prompt)
    root = prompt[-1]
    runner.load_drafting(prompt[:-1], suffix)  # (start_decode adds the root)
    hidden = torch.zeros(
        1, runner.model.config.hidden_size, device=runner.model.device, dtype=runner.model.dtype
    )
    proposal = runner.start_decode(hidden, root)
    sampler = runner.sampler(params, 0, prompt, [root])
    spans: dict[str, list[float]] = {}
    walls, accepted = [], []
    tree = drafter.topology(root, proposal)

    def follow(result: CycleResult) -> TreeTopology:
        """As the engine does: the next tree as soon as the results are in (started at once)."""
        nonlocal tree
        drafter.emitted(result.emitted)
        tree = result.next_tree or drafter.topology(result.emitted[-1], result.proposal)
        return tree

    for i in range(warmup + cycles):
        start = time.perf_counter()
        result = runner.cycle(tree, sampler, chain_next=True, follow=follow)
        sampler.advance(result.emitted)
        if i >= warmup:
            walls.append(time.perf_counter() - start)
            accepted.append(len(result.accepted) - 1)
            for phase, seconds in result.spans.items():
                spans.setdefault(phase, []).append(seconds)
    runner.reset()
    ms = {f"{phase}_ms": statistics.median(v) * 1e3 for phase, v in spans.items()}
    return {
        "cycle_ms": ms.pop("cycle_ms"),
        "verify_ms": ms["target_ms"],
        "accept_publish_ms": ms["dispatch_ms"],
        "draft_ms": ms["drafter_ms"],
        "loop_ms": statistics.median(walls) * 1e3,
        "accepted": sum(accepted) / len(accepted),
    }


def gdn_model_order(
    model: HybridLM,
    tree: TreeDescriptor,
    timer: Timer,
    config: device_ops.GdnConfig | None = None,
    prepared: bool = False,
) -> float:
    """Median ms of the GDN verification of every GDN layer, in model order, in one graph (the
    engine's form unless `config` names another): from raw inputs through `gdn_verify` (the row and
    paths scans prepare their operands first, one launch more a layer), or, `prepared`, the scans
    alone from records prepared before the graph (the engine's path: its tree conv prepares them)."""
    cfg, dev = model.config, model.device
    tables = DeviceTree(tree.rows, MAX_DEPTH, dev, paths=count_paths(tree)).load_(tree)  # as the engine
    gen = torch.Generator(device=dev).manual_seed(1)
    rows, h, hv, k, v = (
        tree.rows,
        cfg.linear_num_key_heads,
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    )

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=dev).to(model.dtype)

    layers = [layer.linear_attn for layer in model.model.layers if layer.is_linear]

    def layer_inputs(g: torch.nn.Module) -> GdnInputs:
        qk = (randn(rows, h, k), randn(rows, h, k))
        return GdnInputs(*qk, randn(rows, hv, v), randn(rows, hv), randn(rows, hv), g.A_log, g.dt_bias)

    inputs = [(layer_inputs(g), torch.randn(hv, v, k, generator=gen, device=dev) * 0.1) for g in layers]

    records = [prepared_records(x) for x, _ in inputs] if prepared else []

    def all_layers() -> None:
        if prepared:
            for ops, (_, state) in zip(records, inputs, strict=True):
                device_ops.gdn_scan(ops, state, tables, model.dtype, config)
            return
        for x, state in inputs:
            device_ops.gdn_verify(x, state, tables, config)

    return timer(CapturedStage(all_layers).replay).median_ms


def prepared_records(x: GdnInputs) -> GdnOperands:
    """The records the engine's tree conv would prepare from x, by the standalone preparation (the
    same arithmetic; a scan's time does not depend on their last bits)."""
    rows, heads, dk = x.q.shape
    ops = empty_operands(rows, heads, x.v.shape[1], dk, x.v.shape[2], x.q.device)
    prepare_operands_(x, ops)
    return ops


def attention_over_floor(
    model: HybridLM, tree: TreeDescriptor, ctx: int, timer: Timer, bandwidth: float
) -> float:
    """The tree attention of one layer at context `ctx` (captured), over its KV-read floor."""
    cfg, dev = model.config, model.device
    tables = DeviceTree(tree.rows, MAX_DEPTH, dev).load_(tree)
    keys = ctx + tree.rows
    kc = torch.randn(keys, cfg.num_key_value_heads, cfg.head_dim, device=dev).to(model.dtype)
    vc = torch.randn_like(kc)
    q = torch.randn(tree.rows, cfg.num_attention_heads, cfg.head_dim, device=dev).to(model.dtype)
    ms = timer(CapturedStage(lambda: device_ops.tree_attention(q, kc, vc, tables)).replay).median_ms
    floor_ms = 2 * ctx * kc.shape[1] * kc.shape[2] * kc.element_size() / bandwidth * 1e3
    return ms / floor_ms


def kernel_times(runner: DeviceRunner) -> dict[str, list[float]]:
    """The device ms of every kernel of one eager cycle (the runner's stages in a graph's order)
    under the profiler, by kernel name; launch gaps excluded."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():  # as the engine runs it: no autograd, so the fused path applies
        runner.run_stages()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runner.run_stages()
            torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name, []).append(event.device_time_total / 1e3)
    return kernels


def kernel_profile(runner: DeviceRunner, top: int = 12) -> dict:
    """One eager cycle under the profiler: kernels launched, GEMM time and the rest, and the
    costliest kernels."""
    kernels = kernel_times(runner)
    gemm = {n: t for n, t in kernels.items() if any(g in n.lower() for g in GEMM_KERNELS)}
    ranked = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "kernels": sum(len(t) for t in kernels.values()),
        "gemm_kernels": sum(len(t) for t in gemm.values()),
        "gemm_ms": sum(sum(t) for t in gemm.values()),
        "other_ms": sum(sum(t) for n, t in kernels.items() if n not in gemm),
        "top": [{"name": n[:120], "count": len(t), "ms": sum(t)} for n, t in ranked],
    }


def fill_state_(runner: DeviceRunner, ctx: int) -> None:
    """A context of `ctx` committed tokens: random KV rows and GDN states (values do not change
    the timing, but zeros are never timed)."""
    for layer in runner.state.layers:
        if isinstance(layer, KVCache):
            layer.key.normal_()
            layer.value.normal_()
        elif isinstance(layer, GDNState):
            layer.recurrent.normal_(0, 0.1)
            layer.conv.normal_()
    runner.state.length = ctx
    if runner.device_mtp is not None:
        runner.device_mtp.cache.key.normal_()
        runner.device_mtp.cache.value.normal_()
        runner.device_mtp.reset(ctx - 1)


def bench(
    contexts: list[int],
    iters: int,
    warmup: int,
    tree_accepted: float,
    mtp_accepted: float,
    variants: list[str],
    draft_vocab: int,
    gemv: bool = True,
) -> dict:
    device = torch.device("cuda")
    timer = Timer(device, iters, warmup)
    bandwidth = copy_bandwidth(device)
    model = random_model(preset_config("qwen3.5-27b"), device, torch.bfloat16, seed=0)
    floor_ms = weight_bytes(model) / bandwidth * 1e3
    arms = [
        Arm("ar", ARMS["ar"], 0.0),
        Arm("mtp5", ARMS["mtp5"], mtp_accepted),
        Arm("tree", ARMS["tree"], tree_accepted),
    ]
    if draft_vocab:  # the same accepted schedules: what the smaller vocabulary costs in acceptance is
        # measured on the shipped model (results/cpu/draft-vocab.md), not here
        arms += [
            Arm(f"mtp5-dv{draft_vocab}", ARMS["mtp5"], mtp_accepted, draft_vocab),
            Arm(f"tree-dv{draft_vocab}", ARMS["tree"], tree_accepted, draft_vocab),
        ]
    result: dict = {
        "floor_ms": floor_ms,
        "copy_bandwidth_tbps": bandwidth / 1e12,
        "weight_gb": weight_bytes(model) / 1e9,
        "variants": variants,
        "draft_vocab": draft_vocab,
        "contexts": {},
        "profile": {},
    }
    if gemv:  # the skinny GEMM alone at the 27B projection shapes, in this process
        result["gemv_fraction_of_copy_bw"] = for_shape_fractions(
            bench_skinny_gemm(iters=iters, warmup=warmup, neighbours=False, bandwidth=bandwidth)
        )
    for variant in variants:
        with variant_mode(variant):
            runner = build_runner(model, 4096, arms[0], graphs=False)
            fill_state_(runner, 4096)
            hidden = torch.zeros(1, model.config.hidden_size, device=device, dtype=model.dtype)
            runner.start_decode(hidden, 1)
            runner.sampler(GREEDY, 0, [1], [1])
            result["profile"][variant] = kernel_profile(runner)
            del runner
    for ctx in contexts:
        row: dict = {}
        for variant in variants if ctx == contexts[0] else variants[:1]:
            for arm in arms if variant == variants[0] else arms[:3]:
                with variant_mode(variant):
                    runner = build_runner(model, ctx, arm, graphs=True, cycles=iters + warmup)
                fill_state_(runner, ctx)
                name = arm.name if variant == variants[0] else f"{arm.name}-{variant}"
                row[name] = run_arm(runner, arm, ctx, iters, warmup) | {
                    "graph_mib": runner.graph_bytes / 2**20,
                    "capture_s": runner.capture_seconds,
                    "variant": variant,
                }
                if variant == variants[0] and arm.name.startswith("tree"):
                    row.setdefault("buffers", {})[arm.name] = persistent_buffers(runner)
                del runner
                torch.cuda.empty_cache()
        tree = paper_tree(random.Random(0), model.config.vocab_size, ctx, GeometryConfig(rows=32))
        row["gdn_verify_model_order_ms"] = gdn_model_order(model, tree, timer, prepared=True)
        row["gdn_verify_raw_model_order_ms"] = gdn_model_order(model, tree, timer)
        row["attention_over_floor"] = attention_over_floor(model, tree, ctx, timer, bandwidth)
        free, total = torch.cuda.mem_get_info()
        row["memory"] = {
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "free_gib": free / 2**30,
            "total_gib": total / 2**30,
            "kv_tokens_fit_in_free": free // kv_bytes_per_token(model),
        }
        row["projected_tokens_per_s"] = {
            name: (t["accepted"] + 1) * 1e3 / t["cycle_ms"]
            for name, t in row.items()
            if isinstance(t, dict) and "cycle_ms" in t
        }
        result["contexts"][str(ctx)] = row
    return result


def summary(result: dict, command: str) -> dict:
    """The issue's headline fields at the first context."""
    ctx = next(iter(result["contexts"]))
    row = result["contexts"][ctx]
    rates = row["projected_tokens_per_s"]
    return {
        "floor_ms": result["floor_ms"],
        "ar_step_ms": row["ar"]["cycle_ms"],
        "mtp5_cycle_ms": row["mtp5"]["cycle_ms"],
        "tree_cycle_ms": row["tree"]["cycle_ms"],
        "gdn_verify_model_order_ms": row["gdn_verify_model_order_ms"],
        "attention_32k_over_floor": result["contexts"].get("32768", row)["attention_over_floor"],
        "projected_tree_over_ar": rates["tree"] / rates["ar"],
        "projected_tree_over_mtp5": rates["tree"] / rates["mtp5"],
        **_draft_vocab_summary(result, row, rates),
        "draft_ms": {name: row[name]["draft_ms"] for name in rates},
        "gemv_fraction_of_copy_bw": result.get("gemv_fraction_of_copy_bw", {}),
        "context": int(ctx),
        "command": command,
        "commit": current_commit(),
    }


def _draft_vocab_summary(result: dict, row: dict, rates: dict) -> dict:
    """The draft-vocabulary arms' headline fields (none without them)."""
    size = result.get("draft_vocab")
    if not size:
        return {}
    mtp, tree = f"mtp5-dv{size}", f"tree-dv{size}"
    return {
        "draft_vocab": size,
        "mtp5_cycle_ms_draft_vocab": row[mtp]["cycle_ms"],
        "tree_cycle_ms_draft_vocab": row[tree]["cycle_ms"],
        "projected_tree_over_ar_draft_vocab": rates[tree] / rates["ar"],
        "projected_tree_over_mtp5_draft_vocab": rates[tree] / rates[mtp],
    }


def markdown(result: dict, head: dict) -> str:
    lines = [
        "# LumoTree decode cycle, random-weight Qwen3.5-27B, one H200 (bf16 weights, fp32 GDN state)",
        "",
        f"Command: `{head['command']}` at commit {head['commit']}.",
        f"Weight-read floor {result['floor_ms']:.2f} ms = {result['weight_gb']:.2f} GB at "
        f"{result['copy_bandwidth_tbps']:.2f} TB/s (device copy, read + write, same process).",
        "Each arm is the engine's cycle (`DeviceRunner.cycle`, one graph per cycle, forced acceptance), "
        "driven back to back by its drafter; device phases from CUDA events inside the graph; loop = wall "
        "time per cycle of that loop in this process.",
        "",
        "| context | arm | rows | tables + verify ms | accept + publish ms | draft ms | cycle ms | loop ms "
        "| x floor | accepted | projected tok/s |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = {name: geo.rows for name, geo in ARMS.items()}
    for ctx, row in result["contexts"].items():
        for name, t in row.items():
            if not (isinstance(t, dict) and "cycle_ms" in t):
                continue
            lines.append(
                f"| {ctx} | {name} | {rows[name.split('-')[0]]} | {t['verify_ms']:.3f} "
                f"| {t['accept_publish_ms']:.3f} | {t['draft_ms']:.3f} | {t['cycle_ms']:.3f} "
                f"| {t['loop_ms']:.3f} "
                f"| {t['cycle_ms'] / result['floor_ms']:.2f} | {t['accepted']:.2f} "
                f"| {row['projected_tokens_per_s'][name]:.1f} |"
            )
        lines.append(
            f"| {ctx} | GDN verify, 48 layers in model order (32 rows, one launch per layer, the "
            f"operands prepared by the conv) | | {row['gdn_verify_model_order_ms']:.3f} | | | | | | | |"
        )
        if "gdn_verify_raw_model_order_ms" in row:
            lines.append(
                f"| {ctx} | the same from raw inputs (a preparation launch more per layer) | | "
                f"{row['gdn_verify_raw_model_order_ms']:.3f} | | | | | | | |"
            )
        lines.append(
            f"| {ctx} | tree attention, one layer, over its KV-read floor | | "
            f"{row['attention_over_floor']:.2f}x | | | | | | | |"
        )
    lines += [
        "",
        "AR cycle at 4096, one eager run under the profiler (kernel device time only):",
        "",
        "| variant | kernels | GEMM kernels | GEMM ms | other ms | costliest kernels (count, ms) |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for variant, prof in result.get("profile", {}).items():
        top = "; ".join(f"{k['name'][:48]} ({k['count']}, {k['ms']:.2f})" for k in prof["top"][:4])
        lines.append(
            f"| {variant} | {prof['kernels']} | {prof['gemm_kernels']} | {prof['gemm_ms']:.2f} "
            f"| {prof['other_ms']:.2f} | {top} |"
        )
    return "\n".join(lines + gemv_lines(result) + buffer_table(result)) + "\n"


def gemv_lines(result: dict) -> list[str]:
    """The skinny GEMM's fraction of the copy bandwidth per projection shape, at 1 / 6 / 32 rows."""
    fractions = result.get("gemv_fraction_of_copy_bw")
    if not fractions:
        return []
    lines = [
        "",
        "The skinny GEMM alone (its for_shape config), fraction of the copy bandwidth by rows, from the "
        "time one GEMM adds to a graph of them (`lumobench bench skinny-gemm`: a graph launch's own "
        "constant drops out; from session 14 on, earlier tables shared it among the copies):",
        "",
    ]
    counts = sorted({int(m) for per_rows in fractions.values() for m in per_rows})
    lines.append("| N x K | " + " | ".join(f"{m} rows" for m in counts) + " |")
    lines.append("| --- |" + " ---: |" * len(counts))
    for shape, per_rows in fractions.items():
        cells = " | ".join(f"{per_rows[str(m)]:.1%}" if str(m) in per_rows else "" for m in counts)
        lines.append(f"| {shape.replace('x', ' x ')} | {cells} |")
    return lines


def buffer_table(result: dict) -> list[str]:
    """Table XV: the tree runners' device buffers by name, per context (MiB)."""
    columns = [
        (ctx, name, bufs)
        for ctx, row in result["contexts"].items()
        for name, bufs in row.get("buffers", {}).items()
    ]
    if not columns:
        return []
    lines = [
        "",
        "Device memory of the tree cycle's runner by buffer (MiB; Table XV), per context and arm:",
        "",
        "| buffer | " + " | ".join(f"{ctx} {name}" for ctx, name, _ in columns) + " |",
        "| --- |" + " ---: |" * len(columns),
    ]
    for i, entry in enumerate(columns[0][2]):
        values = " | ".join(f"{bufs[i]['mib']:.1f}" for *_, bufs in columns)
        lines.append(f"| {entry['buffer']} | {values} |")
    return lines


def cycle_command(
    out: Annotated[Path, typer.Option(help="Folder for cycle.json and cycle.md.")] = Path("results/h200"),
    contexts: Annotated[str, typer.Option(help="Committed context lengths, comma-separated.")] = "4096,32768",
    iters: Annotated[int, typer.Option(help="Timed iterations per median.")] = 50,
    warmup: Annotated[int, typer.Option(help="Warm-up iterations.")] = 10,
    tree_accepted: Annotated[float, typer.Option(help="Forced mean accepted drafts per tree cycle.")] = 4.05,
    mtp_accepted: Annotated[float, typer.Option(help="Forced mean accepted drafts per MTP-5 cycle.")] = 3.17,
    variants: Annotated[
        str,
        typer.Option(
            help="Comma-separated, the headline first: fused (the product path), fused-skinny, "
            "fused-cublas, unfused."
        ),
    ] = "fused,fused-cublas,unfused",
    draft_vocab: Annotated[
        int,
        typer.Option(
            min=0,
            help="Also time MTP-5 and the tree with a draft vocabulary of this many token ids (the "
            "first variant, same forced acceptance); 0: none.",
        ),
    ] = 32768,
    gemv: Annotated[
        bool,
        typer.Option(
            help="Also time the skinny GEMM alone at the 27B projection shapes (1, 6 and 32 rows) for "
            "gemv_fraction_of_copy_bw."
        ),
    ] = True,
) -> None:
    """Time the AR step, the chain MTP-5 cycle and the tree cycle of a random-weight Qwen3.5-27B."""
    require_cuda("the cycle benchmark")
    chosen = [v.strip() for v in variants.split(",") if v.strip()]
    if not chosen or any(v not in VARIANTS for v in chosen):
        typer.echo(f"error: --variants takes {', '.join(VARIANTS)}, got {variants!r}", err=True)
        raise typer.Exit(2)
    command = command_line("cycle")
    result = bench(
        [int(c) for c in contexts.split(",")],
        iters,
        warmup,
        tree_accepted,
        mtp_accepted,
        chosen,
        draft_vocab,
        gemv,
    )
    head = summary(result, command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cycle.json").write_text(json.dumps(head | {"detail": result}, indent=2) + "\n")
    (out / "cycle.md").write_text(markdown(result, head))
    typer.echo(markdown(result, head))
    typer.echo(json.dumps(head, indent=2))


if __name__ == "__main__":
    typer.run(cycle_command)
