"""The GDN verification forms side by side at a random-weight preset's shapes (CUDA only): every GDN
layer in model order in one graph per form (the row scan, the paths scan, the tree WY form) for the
paper tree and for MTP-5's chain (6 rows: the forms with AR's bits), and whether the paths scan gives
the row scan's bits (outputs and records) on random trees of every shape.

    lumobench bench gdn-forms --out results/h200/gdn-forms      (or python -m lumobench.bench.gdn_forms)
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated

import torch
import typer

from lumobench.bench.cycle import gdn_model_order
from lumobench.bench.output import command_line, current_commit, write_tables
from lumobench.bench.timing import Timer, require_cuda
from lumobench.checks.random_trees import SHAPES, paper_tree, random_tree
from lumotree.drafting.geometry import GeometryConfig
from lumotree.model import default_model_path, load_checkpoint
from lumotree.model.config import HybridConfig
from lumotree.model.model import HybridLM
from lumotree.model.random_weights import preset_config, random_model
from lumotree.tree import MAX_DEPTH, TreeDescriptor, chain_tree
from lumotree.verify import device_ops
from lumotree.verify.conv.fused_conv import conv_operands_, tree_conv_
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn import common
from lumotree.verify.gdn.plan import count_paths
from lumotree.verify.gdn.reference import GateInputs, GdnInputs
from lumotree.verify.graphs import CapturedStage

CHAIN_ROWS = 6  # MTP-5: the root and five drafts
SCANS = ("paths",)  # the forms besides the row scan with its bits


def scans_match_rows(
    cfg: HybridConfig,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    paths: device_ops.GdnConfig | None = None,
) -> list[dict]:
    """Per random tree shape: one GDN layer of `cfg`'s shapes (random operands and gates) verified by
    the row scan and the paths scan (`paths`, default its plain config; the default path programs,
    so that trees with more walks loop) from the same inputs; a scan is equal to the row scan when
    every output and record of an active row is bitwise equal (`<form>_records_equal`: the records
    alone, which each call prepares for itself: unequal ones point at the preparation, not the
    scans)."""
    configs = {"rows": device_ops.GdnConfig(form="rows"), "paths": paths or device_ops.GdnConfig("paths")}
    gen = torch.Generator(device=device).manual_seed(seed)
    h, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim

    def randn(*s: int) -> torch.Tensor:
        return torch.randn(s, generator=gen, device=device)

    cases = []
    for i, shape in enumerate(SHAPES):
        tree = random_tree(shape, random.Random(seed + i))
        rows = tree.rows
        shapes = ((rows, h, dk), (rows, h, dk), (rows, hv, dv), (rows, hv), (rows, hv))
        x = GdnInputs(*(randn(*s).to(dtype) for s in shapes), randn(hv).abs().log(), randn(hv))
        state = randn(hv, dv, dk) * 0.1
        tables = DeviceTree(rows, MAX_DEPTH, device).load_(tree)
        got = {form: device_ops.gdn_verify(x, state, tables, configs[form]) for form in ("rows", *SCANS)}
        active = tree.n_active
        case = {"shape": shape, "rows": active, "depth": int(tree.depth.max()), "paths": count_paths(tree)}
        for form in SCANS:
            pairs = [(got["rows"].o[:active], got[form].o[:active])]
            pairs += [
                (getattr(got["rows"].operands, f)[:active], getattr(got[form].operands, f)[:active])
                for f in ("q", "k", "v", "g", "beta")
            ]
            case[f"{form}_equal"] = all(torch.equal(a, b) for a, b in pairs)
            case[f"{form}_records_equal"] = all(torch.equal(a, b) for a, b in pairs[1:])
        cases.append(case)
    return cases


def markdown(doc: dict) -> str:
    lines = [
        f"# GDN verification forms, {doc['preset']} shapes ({doc['device']})",
        "",
        f"Command: `{doc['command']}` at commit {doc['commit']}.",
        f"Every GDN layer ({doc['layers']}) in model order in one CUDA graph, the paper tree "
        f"({doc['tree_rows']} active rows, depth {doc['tree_depth']}), median of {doc['iters']} replays:",
        "",
        "| form | ms | bits |",
        "| --- | ---: | --- |",
    ]
    bits = {
        "rows": "the one-row step's",
        "paths": "the row scan's",
        "wy": "its own (not row-invariant)",
    }
    lines += [f"| {form} | {ms:.3f} | {bits[form]} |" for form, ms in doc["model_order_ms"].items()]
    lines += ["", f"MTP-5's chain ({doc['chain_rows']} rows), the same layers and replays:", ""]
    lines += ["| form | ms |", "| --- | ---: |"]
    lines += [f"| {form} | {ms:.3f} |" for form, ms in doc["chain_model_order_ms"].items()]
    lines += ["", "The scans against the row scan, one layer, random trees (outputs, records bitwise):", ""]
    lines += [
        "| tree shape | active rows | depth | walks | bitwise equal |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for c in doc["scans_vs_rows"]:
        equal = " | ".join(str(c[f"{form}_equal"]) for form in SCANS)
        lines.append(f"| {c['shape']} | {c['rows']} | {c['depth']} | {c['paths']} | {equal} |")
    if doc.get("block_v"):
        lines += [
            "",
            "Value-tile heights (the row scan, the paths scan and the replay alike; model order):",
            "",
        ]
        lines += [
            "| rows a tile | tree rows / paths ms | chain rows / paths ms | one-row step ms | paths = rows |"
        ]
        lines += ["| ---: | ---: | ---: | ---: | --- |"]
        lines += [
            f"| {bv} | {r['tree_ms']['rows']:.3f} / {r['tree_ms']['paths']:.3f} | "
            f"{r['chain_ms']['rows']:.3f} / {r['chain_ms']['paths']:.3f} | {r['ar_rows_ms']:.3f} | "
            f"{r['paths_equal']} |"
            for bv, r in doc["block_v"].items()
        ]
    if doc.get("paths_register_caps"):
        lines += ["", "The paths scan under register caps (model order; bits against the row scan):", ""]
        lines += ["| registers | tree ms | chain ms | row scan's bits |", "| ---: | ---: | ---: | --- |"]
        lines += [
            f"| {cap} | {r['tree_ms']:.3f} | {r['chain_ms']:.3f} | {r['equal_to_rows']} |"
            for cap, r in doc["paths_register_caps"].items()
        ]
    if doc.get("conv_ms"):
        lines += [
            "",
            "Every GDN layer's tree conv in model order (ms): the plain conv storing its output, and the "
            "conv that prepares the scans' operands, by warps a program:",
            "",
        ]
        lines += ["| conv | tree | chain | one row |", "| --- | ---: | ---: | ---: |"]
        lines += [
            f"| {name} | {r['tree']:.3f} | {r['chain']:.3f} | {r['one row']:.3f} |"
            for name, r in doc["conv_ms"].items()
        ]
    return "\n".join(lines) + "\n"


def block_v_row(model: HybridLM, tree: TreeDescriptor, chain: TreeDescriptor, timer: Timer, bv: int) -> dict:
    """The row and paths scans at value-tile height bv (model order: the paper tree, the chain, a
    one-row step) and whether the paths scan keeps the row scan's bits on the random trees."""
    saved = common.DEVICE_BLOCK_V
    common.DEVICE_BLOCK_V = bv
    try:
        forms = {f: device_ops.GdnConfig(form=f) for f in ("rows", "paths")}
        one_row = chain_tree([1], prefix_len=4096, max_depth=MAX_DEPTH)
        return {
            "tree_ms": {f: gdn_model_order(model, tree, timer, c) for f, c in forms.items()},
            "chain_ms": {f: gdn_model_order(model, chain, timer, c) for f, c in forms.items()},
            "ar_rows_ms": gdn_model_order(model, one_row, timer, forms["rows"]),
            "paths_equal": all(
                c["paths_equal"] for c in scans_match_rows(model.config, torch.bfloat16, model.device, 3)
            ),
        }
    finally:
        common.DEVICE_BLOCK_V = saved


def conv_model_order(model: HybridLM, tree: TreeDescriptor, timer: Timer, warps: int | None) -> float:
    """Median ms of every GDN layer's tree conv in model order in one graph, over `tree`'s rows: the
    conv with the scans' operands prepared in its epilogue at `warps` warps a program
    (`conv_operands_`, the engine's), or (None) the plain conv storing its output (`tree_conv_`)."""
    cfg, dev = model.config, model.device
    gather = DeviceTree(tree.rows, MAX_DEPTH, dev).load_(tree).conv_gather
    h, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    rows, channels = tree.rows, 2 * h * dk + hv * dv
    gen = torch.Generator(device=dev).manual_seed(2)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=dev).to(model.dtype)

    layers = []
    for g in (layer.linear_attn for layer in model.model.layers if layer.is_linear):
        weight = g.conv1d.weight[:, 0].contiguous()
        x, ab = randn(rows, channels), randn(rows, 2 * hv)
        gates = GateInputs(ab[:, :hv], ab[:, hv:], g.A_log, g.dt_bias)
        ops = common.empty_operands(rows, h, hv, dk, dv, dev)
        layers.append((x, randn(channels, weight.shape[1] - 1), weight, gates, ops))

    def all_layers() -> None:
        for x, state, weight, gates, ops in layers:
            if warps is None:
                tree_conv_(x, state, weight, None, gather, torch.empty_like(x))
            else:
                conv_operands_(x, state, weight, gather, gates, torch.empty_like(x), ops, num_warps=warps)

    return timer(CapturedStage(all_layers).replay).median_ms


def gdn_forms_command(
    out: Annotated[Path, typer.Option(help="Output path without suffix: writes .json and .md.")] = Path(
        "results/h200/gdn-forms"
    ),
    preset: Annotated[
        str, typer.Option(help="Random-weights shape preset, or `shipped` for the shipped model.")
    ] = "qwen3.5-27b",
    iters: Annotated[int, typer.Option(min=1, help="Timed graph replays per form.")] = 50,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up replays.")] = 10,
    block_v: Annotated[
        str,
        typer.Option(
            help="Also time the row and paths scans (tree, chain, one-row step) at these value-tile "
            "heights (comma-separated; the replay takes the same), with the paths scan's bits checked."
        ),
    ] = "",
    paths_registers: Annotated[
        str,
        typer.Option(
            help="Also time the paths scan under these register caps a thread (comma-separated), "
            "with its bits checked against the row scan's."
        ),
    ] = "",
    conv_warps: Annotated[
        str,
        typer.Option(
            help="Also time every GDN layer's tree conv (model order; the tree, the chain, one row): "
            "the plain conv, and the conv that prepares the scans' operands at these warps a program "
            "(comma-separated)."
        ),
    ] = "",
) -> None:
    """Time the GDN verification forms in model order and check the scans' bits against the row scan."""
    try:
        caps = [int(c) for c in paths_registers.split(",") if c.strip()]
        heights = [int(c) for c in block_v.split(",") if c.strip()]
        warps = [int(c) for c in conv_warps.split(",") if c.strip()]
    except ValueError:
        typer.echo(
            "error: --paths-registers, --block-v and --conv-warps take comma-separated integers", err=True
        )
        raise typer.Exit(2) from None
    device = require_cuda("the GDN forms bench")
    try:
        if preset == "shipped":
            model = load_checkpoint(default_model_path(), dtype=torch.bfloat16, device=device)
        else:
            model = random_model(preset_config(preset), device, torch.bfloat16, seed=0)
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    tree = paper_tree(random.Random(0), model.config.vocab_size, 4096, GeometryConfig(rows=32))
    timer = Timer(device, iters, warmup)
    with torch.inference_mode():
        scans = scans_match_rows(model.config, torch.bfloat16, device, seed=3)
        timed = {
            form: gdn_model_order(model, tree, timer, device_ops.GdnConfig(form=form))
            for form in device_ops.GDN_FORMS
        }
        chain = chain_tree(list(range(1, CHAIN_ROWS + 1)), prefix_len=4096, max_depth=MAX_DEPTH)
        chain_timed = {
            form: gdn_model_order(model, chain, timer, device_ops.GdnConfig(form=form))
            for form in ("rows", *SCANS)
        }
        capped = {}
        for cap in caps:
            cfg = device_ops.GdnConfig(form="paths", max_registers=cap)
            capped[str(cap)] = {
                "tree_ms": gdn_model_order(model, tree, timer, cfg),
                "chain_ms": gdn_model_order(model, chain, timer, cfg),
                "equal_to_rows": all(
                    c["paths_equal"] for c in scans_match_rows(model.config, torch.bfloat16, device, 3, cfg)
                ),
            }
        by_height = {str(bv): block_v_row(model, tree, chain, timer, bv) for bv in heights}
        one_row = chain_tree([1], prefix_len=4096, max_depth=MAX_DEPTH)
        convs = {
            "plain" if w is None else f"{w} warps": {
                name: conv_model_order(model, t, timer, w)
                for name, t in (("tree", tree), ("chain", chain), ("one row", one_row))
            }
            for w in ([None, *warps] if warps else [])
        }
    doc = {
        "preset": preset,
        "device": torch.cuda.get_device_name(),
        "layers": sum(1 for layer in model.model.layers if layer.is_linear),
        "tree_rows": tree.n_active,
        "tree_depth": int(tree.depth.max()),
        "iters": iters,
        "model_order_ms": timed,
        "chain_rows": CHAIN_ROWS,
        "chain_model_order_ms": chain_timed,
        "scans_vs_rows": scans,
        "paths_register_caps": capped,
        "block_v": by_height,
        "conv_ms": convs,
        "command": command_line("gdn-forms"),
        "commit": current_commit(),
    }
    write_tables(out, doc, markdown)


if __name__ == "__main__":
    typer.run(gdn_forms_command)
