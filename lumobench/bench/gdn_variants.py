"""The GDN scans of several git revisions side by side in one process (CUDA only for the timing).

`stage` copies the step-loop GDN modules (scan, row scan, paths scan, replay, and the operand
preparation where a revision has it) of each named git revision into `.stage/gdn_variants/NAME/`
with their imports of each other pointed at the copy, so one process can load every revision's
kernels (the device machine's staged tree has no repository, so this runs here). `time` (on the GPU)
swaps each revision's row and paths scans into the engine's GDN verification in turn and times, in
model order at the random-weight 27B's shapes: the paper tree (the paths scan under the register
caps asked for, and the row scan), MTP-5's chain, the one-row step and a 6-node publication of 48
layers, and for revisions whose scans read prepared records (session 18 on) the tree and one row as
the engine runs them (the scans alone); two rounds, revisions interleaved; each revision's paths
scan checked against its row scan's bits on random trees.

    lumobench bench gdn-variants stage before=HEAD~1 after=HEAD
    lumobench bench gdn-variants time before,after --out $OUT/gdn-variants   (device; carry .stage)

`launch` runs each revision's scans once, for a profiler (`lumobench/bench/device/ncu_gdn.sh`).
"""

from __future__ import annotations

import importlib
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import torch
import typer

from lumobench.bench.cycle import gdn_model_order
from lumobench.bench.gdn_forms import scans_match_rows
from lumobench.bench.output import command_line, current_commit, write_tables
from lumobench.bench.timing import Timer, require_cuda
from lumobench.checks.random_trees import paper_tree
from lumotree.drafting.geometry import GeometryConfig
from lumotree.model.config import LINEAR, HybridConfig
from lumotree.model.model import HybridLM
from lumotree.model.random_weights import preset_config, random_model
from lumotree.tree import MAX_DEPTH, TreeDescriptor, chain_tree
from lumotree.verify import device_ops
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn.common import empty_operands
from lumotree.verify.gdn.plan import count_paths
from lumotree.verify.gdn.reference import GdnInputs, GdnOperands
from lumotree.verify.graphs import CapturedStage

STAGE = Path(".stage")
PACKAGE = "gdn_variants"
MODULES = ("scan", "row_scan", "paths_scan", "replay", "prepare")
OPTIONAL = {"prepare"}  # revisions before the operands were prepared once a node have none
SOURCE = "serving/lumotree/verify/gdn"
NAME = re.compile(r"[a-z][a-z0-9_]*")
ROUNDS = 2
PUBLISHED = 6  # nodes of the timed publication: MTP-5's root and five drafts

gdn_variants_app = typer.Typer(
    help="The GDN scans of several git revisions side by side in one process.", no_args_is_help=True
)


def stage_variant(name: str, revision: str, source: dict[str, str], stage: Path = STAGE) -> Path:
    """Write the modules `source` ({module: its text}) of `revision` as package `gdn_variants.NAME`
    under `stage`, their imports of one another pointed at the copies, the revision in its REVISION
    file; returns the package folder."""
    folder = stage / PACKAGE / name
    folder.mkdir(parents=True, exist_ok=True)
    (stage / PACKAGE / "__init__.py").touch()
    (folder / "__init__.py").touch()
    (folder / "REVISION").write_text(revision + "\n")
    own = "|".join(MODULES)
    for module, text in source.items():
        text = re.sub(rf"lumotree\.verify\.gdn\.({own})\b", rf"{PACKAGE}.{name}.\1", text)
        (folder / f"{module}.py").write_text(text)
    return folder


def resolve(revision: str) -> str:
    """A git revision of this checkout as its short commit hash (ValueError if git knows none)."""
    parsed = subprocess.run(
        ["git", "rev-parse", "--short", f"{revision}^{{commit}}"], capture_output=True, text=True
    )
    if parsed.returncode:
        raise ValueError(f"git knows no commit {revision!r}")
    return parsed.stdout.strip()


def revision_source(revision: str) -> dict[str, str]:
    """The modules' text at a git revision of this checkout (ValueError if git cannot show one)."""
    source = {}
    for module in MODULES:
        shown = subprocess.run(
            ["git", "show", f"{revision}:{SOURCE}/{module}.py"], capture_output=True, text=True
        )
        if shown.returncode and module in OPTIONAL:
            continue
        if shown.returncode:
            raise ValueError(f"git cannot show {SOURCE}/{module}.py at {revision!r}: {shown.stderr.strip()}")
        source[module] = shown.stdout
    return source


@gdn_variants_app.command("stage")
def stage_command(
    variants: Annotated[list[str], typer.Argument(help="NAME=REVISION pairs (NAME: lower-case, digits, _).")],
) -> None:
    """Copy each revision's GDN scan modules into .stage/gdn_variants/NAME (carry .stage to the device)."""
    pairs = [pair.partition("=") for pair in variants]
    for pair, (name, _, revision) in zip(variants, pairs, strict=True):
        if not NAME.fullmatch(name) or not revision:
            typer.echo(f"error: {pair!r} is not NAME=REVISION with a lower-case NAME", err=True)
            raise typer.Exit(2)
    try:
        commits = [(name, resolve(revision)) for name, _, revision in pairs]
        for name, commit in commits:
            typer.echo(f"{name}: {commit} -> {stage_variant(name, commit, revision_source(commit))}")
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


def load_variant(name: str, stage: Path = STAGE) -> dict[str, object]:
    """The staged revision `name`'s row_scan, paths_scan and replay modules."""
    if not (stage / PACKAGE / name).is_dir():
        raise ValueError(f"no staged variant {name!r} under {stage / PACKAGE} (run `stage` first)")
    if str(stage.resolve()) not in sys.path:
        sys.path.insert(0, str(stage.resolve()))
    return {m: importlib.import_module(f"{PACKAGE}.{name}.{m}") for m in ("row_scan", "paths_scan", "replay")}


def gdn_shape(cfg: HybridConfig) -> tuple[int, int, int, int]:
    """(GDN layers, key heads, value heads, head dim) of a config whose key and value heads are as
    wide (Qwen3.5's)."""
    if cfg.linear_key_head_dim != cfg.linear_value_head_dim:
        raise ValueError("the GDN variants bench takes key and value heads of one width")
    layers = sum(1 for kind in cfg.layer_types if kind == LINEAR)
    return layers, cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim


def staged_on_cuda(variants: str) -> dict[str, dict[str, object]]:
    """The staged revisions named in `variants` (comma-separated) by name, on a CUDA machine; else a
    one-line error and exit 2."""
    try:
        modules = {name: load_variant(name) for name in variants.split(",") if name}
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    require_cuda("the GDN variants bench")
    return modules


def publication_ms(replay_module: object, cfg: HybridConfig, timer: Timer, device: torch.device) -> float:
    """Median ms of one replay launch publishing PUBLISHED nodes into every GDN layer's state of `cfg`."""
    (layers, heads, v_heads, dim), rows = gdn_shape(cfg), 32
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, device=device, generator=gen)

    states = randn(layers, v_heads, dim, dim) * 0.1
    keys = randn(layers, rows, heads, dim)
    ops = GdnOperands(keys, keys, randn(layers, rows, v_heads, dim), -randn(layers, rows, v_heads).abs(),
                      randn(layers, rows, v_heads).sigmoid())  # fmt: skip
    accepted = torch.full((MAX_DEPTH + 1,), -1, dtype=torch.int64, device=device)
    accepted[:PUBLISHED] = torch.arange(PUBLISHED, device=device)
    length = torch.tensor([PUBLISHED], device=device)
    publish = replay_module.replay_layers_  # type: ignore[attr-defined]
    return timer(CapturedStage(lambda: publish(states, ops, accepted, length)).replay).median_ms


def markdown(doc: dict) -> str:
    caps = doc["register_caps"]
    cap_cols = [f"paths, {c or 'no'} cap" for c in caps]
    lines = [
        f"# The GDN scans of {len(doc['variants'])} revisions side by side ({doc['device']})",
        "",
        f"Command: `{doc['command']}` at commit {doc['commit']}; revisions: "
        + ", ".join(f"{n} = {r}" for n, r in doc["variants"].items())
        + ".",
        f"Every GDN layer ({doc['layers']}) of the random-weight 27B in model order in one CUDA graph, "
        f"median of {doc['iters']} replays (ms); the paper tree ({doc['tree_rows']} rows), MTP-5's chain, "
        f"one row; publication: {PUBLISHED} nodes into every GDN layer in one launch. Rounds interleave "
        "the revisions.",
        "",
        "| revision | round | " + " | ".join(cap_cols) + " | tree, rows | chain, paths | one row | "
        "publication | paths = rows bits | tree, engine's path | one row, engine's path |",
        "| --- | ---: | "
        + " | ".join("---:" for _ in caps)
        + " | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in doc["runs"]:
        cells = [f"{r['tree_paths_ms'][str(c)]:.3f}" for c in caps]
        engine = [
            f"{r[k]:.3f}" if r.get(k) is not None else "–" for k in ("tree_engine_ms", "one_row_engine_ms")
        ]
        lines.append(
            f"| {r['variant']} | {r['round']} | " + " | ".join(cells) + f" | {r['tree_rows_ms']:.3f} | "
            f"{r['chain_paths_ms']:.3f} | {r['one_row_ms']:.3f} | {r['publication_ms']:.3f} | "
            f"{r.get('paths_equal_rows', '')} | " + " | ".join(engine) + " |"
        )
    notes = [
        "",
        "The columns before the last two time each scan from raw inputs (`gdn_verify`: a revision with "
        "prepared operands pays its preparation's launch there); the engine's path times the scans alone "
        "from records prepared beforehand (the engine's conv prepares them), for revisions that have it.",
    ]
    return "\n".join(lines + notes) + "\n"


def time_variant(
    name: str,
    round_: int,
    model: HybridLM,
    trees: tuple[TreeDescriptor, ...],
    timer: Timer,
    caps: list[int],
    prepared: bool,
) -> dict:
    """The engine's GDN verification as it stands (the variant swapped in) over the paper tree (the
    paths scan under each cap, then the row scan), MTP-5's chain and one row, in model order from raw
    inputs; and, for a revision whose scans read prepared records (`prepared`), the tree and one row
    as the engine runs them (the scans alone, records prepared beforehand)."""
    tree, chain, one_row = trees
    rows = device_ops.GdnConfig(form="rows")
    capped = {str(c): device_ops.GdnConfig("paths", max_registers=c or None) for c in caps}
    engine = {"tree_engine_ms": None, "one_row_engine_ms": None}
    if prepared:
        engine = {
            "tree_engine_ms": gdn_model_order(model, tree, timer, prepared=True),
            "one_row_engine_ms": gdn_model_order(model, one_row, timer, prepared=True),
        }
    return engine | {
        "variant": name,
        "round": round_,
        "tree_paths_ms": {c: gdn_model_order(model, tree, timer, cfg) for c, cfg in capped.items()},
        "tree_rows_ms": gdn_model_order(model, tree, timer, rows),
        "chain_paths_ms": gdn_model_order(model, chain, timer, device_ops.GdnConfig("paths")),
        "one_row_ms": gdn_model_order(model, one_row, timer, rows),
    }


# device_ops' scan entry points and the staged module each lives in (the prepared ones since session
# 18: a revision without them keeps the product's, and its engine's-path cells stay empty)
SCAN_ENTRY_POINTS = {
    "gdn_rows_": "row_scan",
    "gdn_paths_": "paths_scan",
    "gdn_rows_prepared_": "row_scan",
    "gdn_paths_prepared_": "paths_scan",
}


@contextmanager
def scans_of(modules: dict[str, object]) -> Iterator[bool]:
    """device_ops' scans taken from a staged revision's modules (`load_variant`) for the duration,
    the product's where the revision has none; yields whether it has the prepared scans."""
    saved = {f: getattr(device_ops, f) for f in SCAN_ENTRY_POINTS}
    scans = {f: getattr(modules[m], f, None) for f, m in SCAN_ENTRY_POINTS.items()}
    try:
        for f, scan in scans.items():
            setattr(device_ops, f, scan or saved[f])
        yield scans["gdn_paths_prepared_"] is not None
    finally:
        for f, scan in saved.items():
            setattr(device_ops, f, scan)


@gdn_variants_app.command("time")
def time_command(
    variants: Annotated[str, typer.Argument(help="Comma-separated names of staged variants.")],
    out: Annotated[Path, typer.Option(help="Output path without suffix: writes .json and .md.")],
    register_caps: Annotated[
        str, typer.Option(help="The paths scan's register caps to time (comma-separated; 0: none).")
    ] = "0,128",
    iters: Annotated[int, typer.Option(min=1, help="Timed graph replays per figure.")] = 50,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up replays.")] = 10,
) -> None:
    """Time the staged revisions' GDN scans and publication interleaved in one process (CUDA)."""
    try:
        caps = [int(c) for c in register_caps.split(",") if c.strip()]
    except ValueError:
        typer.echo("error: --register-caps takes comma-separated integers", err=True)
        raise typer.Exit(2) from None
    modules = staged_on_cuda(variants)
    names = list(modules)
    device = torch.device("cuda")
    model = random_model(preset_config("qwen3.5-27b"), device, torch.bfloat16, seed=0)
    tree = paper_tree(random.Random(0), model.config.vocab_size, 4096, GeometryConfig(rows=32))
    chain = chain_tree(list(range(1, PUBLISHED + 1)), prefix_len=4096, max_depth=MAX_DEPTH)
    one_row = chain_tree([1], prefix_len=4096, max_depth=MAX_DEPTH)
    timer = Timer(device, iters, warmup)
    runs = []
    with torch.inference_mode():
        for round_ in range(ROUNDS):
            for name in names:
                with scans_of(modules[name]) as prepared:
                    trees = (tree, chain, one_row)
                    runs.append(time_variant(name, round_, model, trees, timer, caps, prepared))
                    replay = modules[name]["replay"]
                    runs[-1]["publication_ms"] = publication_ms(replay, model.config, timer, device)
                    if round_ == 0:
                        checks = scans_match_rows(model.config, torch.bfloat16, device, seed=3)
                        runs[-1]["paths_equal_rows"] = all(c["paths_equal"] for c in checks)
                typer.echo(f"{name} round {round_}: {runs[-1]}")
    staged = {n: (STAGE / PACKAGE / n / "REVISION").read_text().strip() for n in names}
    doc = {
        "device": torch.cuda.get_device_name(),
        "variants": staged,
        "register_caps": caps,
        "layers": gdn_shape(model.config)[0],
        "tree_rows": tree.n_active,
        "iters": iters,
        "runs": runs,
        "command": command_line("gdn-variants"),
        "commit": current_commit(),
    }
    write_tables(out, doc, markdown)


@gdn_variants_app.command("launch")
def launch_command(
    variants: Annotated[str, typer.Argument(help="Comma-separated names of staged variants.")],
) -> None:
    """Launch each staged revision's row scan and paths scan once on one 27B layer, the paper tree
    (CUDA): the target of `lumobench/bench/device/ncu_gdn.sh`."""
    modules = staged_on_cuda(variants).values()
    device = torch.device("cuda")
    tree = paper_tree(random.Random(0), 1000, 4096, GeometryConfig(rows=32))
    tables = DeviceTree(tree.rows, MAX_DEPTH, device, paths=count_paths(tree)).load_(tree).gdn
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, device=device, generator=gen)

    _, heads, v_heads, dim = gdn_shape(preset_config("qwen3.5-27b"))
    rows = tree.rows
    raw = (randn(rows, heads, dim), randn(rows, heads, dim), randn(rows, v_heads, dim), randn(rows, v_heads),
           randn(rows, v_heads))  # fmt: skip
    x = GdnInputs(*(t.bfloat16() for t in raw), randn(v_heads).abs().log(), randn(v_heads))
    state = randn(v_heads, dim, dim) * 0.1
    for module in modules:
        for scan in (module["row_scan"].gdn_rows_, module["paths_scan"].gdn_paths_):  # type: ignore[attr-defined]
            records = empty_operands(rows, heads, v_heads, dim, dim, device)
            scan(x, state, tables, torch.empty_like(x.v), records)
    torch.cuda.synchronize()


if __name__ == "__main__":
    gdn_variants_app()
