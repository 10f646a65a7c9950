"""Where a verified row departs from the one-row step: per op family of the device verification,
whether a chain row's result equals, bit for bit, what the autoregressive step computes for the same
token at the same position (CUDA only; the shipped model's shapes, bfloat16 by default).

    python -m lumobench.bench.row_invariance --out results/h200/row-invariance

The speculative arms give the AR arm's tokens only if every op gives a row the same bits whatever
the other rows of its tree (DESIGN §3.4: the walk accepts the target's own choice per row). Each
family is checked in the form the engine runs and, where one exists, in a row-invariant form:
- GEMMs: `ops.linear` (the engine's: the skinny kernel on every shape up to 32 rows) vs cuBLAS; the
  vocabulary projection with fp32 output (the engine's skinny kernel vs cuBLAS);
- tree attention: the engine's (a query tile and split count fixed per model and cache, each row's
  last keys walked in logical order) vs a query tile sized to the rows (the choice before
  2026-12-03), on a chain and on every row of a paper-shaped tree (off the spine too);
- GDN: the row scan (the engine's) vs the tree WY kernel and the path scan, chain rows against
  one-row steps of the same form, each published by the replay kernel before the next.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Annotated

import torch
import torch.nn.functional as F
import triton
import typer
from torch import Tensor

from lumobench.bench.output import command_line, current_commit, write_tables
from lumobench.bench.timing import require_cuda
from lumobench.checks.random_trees import random_tree
from lumotree.model import default_model_path, load_checkpoint
from lumotree.model.fused import ops
from lumotree.model.fused.skinny_gemm import skinny_linear
from lumotree.tree import MAX_DEPTH as TREE_MAX_DEPTH
from lumotree.tree import chain_tree
from lumotree.verify import device_ops
from lumotree.verify.attention.decode import (
    AttentionConfig,
    cache_partitions,
    partial_buffers,
    partial_dtype,
    short_partitions,
    tree_attention_,
)
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.gdn import scan
from lumotree.verify.gdn.reference import GdnInputs

CHAIN = 6  # rows of an MTP-5 cycle
TREE_ROWS = 32  # rows of the paper tree's verification (the chain padded into them)
MAX_DEPTH = 8
# Qwen3.5-27B projections (N, K): QKV + gate of attention and GDN, the MLP's gate-up, the output
# projections of GDN and the MLP (results/h200/skinny_gemm.md); and its vocabulary
QWEN_27B_SHAPES = [(16480, 5120), (14336, 5120), (34816, 5120), (5120, 6144), (5120, 17408)]
QWEN_27B_VOCAB = 248320


def compare(rows: Tensor, steps: Tensor) -> dict:
    """How far `rows` (the chain's) are from `steps` (the one-row results), bitwise and in value."""
    diff = (rows.float() - steps.float()).abs()
    return {
        "equal_fraction": float((rows == steps).float().mean()),
        "max_abs_diff": float(diff.max()),
        "rows_equal": int(sum(bool(torch.equal(a, b)) for a, b in zip(rows, steps, strict=True))),
        "rows": rows.shape[0],
    }


def gemm_cases(model: torch.nn.Module, dtype: torch.dtype, gen: torch.Generator) -> list[dict]:
    """Every distinct projection shape of the model, and the 27B's: rows of M-row calls against
    one-row calls."""
    own = {tuple(p.shape) for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name}
    shapes = sorted(own) + QWEN_27B_SHAPES
    cases = []
    for n, k in shapes:
        w = torch.randn(n, k, generator=gen, device="cuda").to(dtype) / math.sqrt(k)
        x = torch.randn(TREE_ROWS, k, generator=gen, device="cuda").to(dtype)
        forms = {"ops.linear (engine)": ops.linear, "cuBLAS": F.linear}
        for form, gemm in forms.items():
            fn = lambda a, gemm=gemm, w=w: gemm(a, w)  # noqa: E731
            one = torch.cat([fn(x[i : i + 1]) for i in range(TREE_ROWS)])
            for m in (CHAIN, TREE_ROWS):
                cases.append({"op": f"gemm {n}x{k}", "form": form, "m": m} | compare(fn(x[:m]), one[:m]))
    return cases


def logits_cases(model: torch.nn.Module, gen: torch.Generator) -> list[dict]:
    """The vocabulary projection with fp32 output, bf16 operands: the model's and the 27B's."""
    cases = []
    own = model.lm_head.weight.detach().to(torch.bfloat16).contiguous()
    big = (0.02 * torch.randn(QWEN_27B_VOCAB, 5120, generator=gen, device="cuda")).to(torch.bfloat16)
    for w in (own, big):
        cases += vocab_cases(w, gen)
    return cases


def vocab_cases(w: Tensor, gen: torch.Generator) -> list[dict]:
    """One vocabulary weight [V, H]: rows of M-row projections against one-row ones."""
    x = torch.randn(TREE_ROWS, w.shape[1], generator=gen, device="cuda").to(torch.bfloat16)
    forms = {
        "skinny fp32 out (engine)": lambda a: skinny_linear(a, w, out_dtype=torch.float32),
        "cuBLAS fp32 out": lambda a: torch.mm(a, w.t(), out_dtype=torch.float32),
    }
    cases = []
    for form, fn in forms.items():
        one = torch.cat([fn(x[i : i + 1]) for i in range(TREE_ROWS)])
        for m in (CHAIN, TREE_ROWS):
            cases.append(
                {"op": f"logits {w.shape[0]}x{w.shape[1]}", "form": form, "m": m}
                | compare(fn(x[:m]), one[:m])
            )
    return cases


def attention_once(q: Tensor, k_cache: Tensor, v_cache: Tensor, tree: DeviceTree, engine: bool) -> Tensor:
    """The engine's entry point, or the kernel with a query tile no taller than the rows need."""
    if engine:
        return device_ops.tree_attention(q, k_cache, v_cache, tree)[0]
    rows, hq, dim = q.shape
    hkv = k_cache.shape[1]
    config = AttentionConfig(
        block_m=min(AttentionConfig().block_m, max(16, triton.next_power_of_2(rows * hq // hkv)))
    )
    splits = cache_partitions(k_cache.shape[0])
    o = torch.empty_like(q)
    lse = torch.empty((rows, hq), dtype=torch.float32, device=q.device)
    o_part, lse_part = partial_buffers(
        rows, hq, hkv, dim, splits, config.block_m, q.device, partial_dtype(q.dtype)
    )
    tree_attention_(
        q, k_cache, v_cache, tree.bits, tree.prefix_len, o, lse, o_part, lse_part, splits,
        1.0 / math.sqrt(dim), config, short=short_partitions(k_cache.shape[0]),
    )  # fmt: skip
    return o


def attention_cases(model: torch.nn.Module, dtype: torch.dtype, gen: torch.Generator) -> list[dict]:
    """A chain verified at prefix p (6 rows, and the same chain in a 32-row tree) against the
    one-row steps at p .. p + 5, over caches of 2K and 32K rows."""
    cfg = model.config
    hq, hkv, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    cases = []
    for capacity, prefix in ((2048, 700), (32768, 21000)):
        k_cache, v_cache = (
            torch.randn(capacity, hkv, dim, generator=gen, device="cuda").to(dtype) for _ in range(2)
        )
        q = torch.randn(TREE_ROWS, hq, dim, generator=gen, device="cuda").to(dtype)
        for engine in (True, False):
            steps = []
            for d in range(CHAIN):
                one = DeviceTree(1, MAX_DEPTH, "cuda").load_(chain_tree([d], prefix_len=prefix + d))
                steps.append(attention_once(q[d : d + 1], k_cache, v_cache, one, engine))
            steps_t = torch.cat(steps)
            for rows in (CHAIN, TREE_ROWS):
                tree = DeviceTree(rows, MAX_DEPTH, "cuda").load_(
                    chain_tree(list(range(CHAIN)), prefix_len=prefix, rows=rows)
                )
                got = attention_once(q[:rows].contiguous(), k_cache, v_cache, tree, engine)[:CHAIN]
                form = "fixed tile and splits (engine)" if engine else "tile sized to the rows"
                case = {"op": f"attention {capacity} cache", "form": form, "m": rows}
                cases.append(case | compare(got, steps_t))
        cases.append(tree_rows_case(q, k_cache, v_cache, prefix))
    return cases


def tree_rows_case(q: Tensor, k_cache: Tensor, v_cache: Tensor, prefix: int) -> dict:
    """Every row of a paper-shaped tree, on the spine or off it, against the one-row step at its
    position with its ancestors committed at contiguous positions before it (the AR arm's cache)."""
    tree = random_tree("paper", random.Random(prefix), prefix_len=prefix)
    device_tree = DeviceTree(tree.rows, TREE_MAX_DEPTH, "cuda").load_(tree)
    got = attention_once(q[: tree.rows].contiguous(), k_cache, v_cache, device_tree, True)
    rows, steps = [], []
    for node in range(tree.n_active):
        path = tree.path_to(node)
        k_ar, v_ar = k_cache.clone(), v_cache.clone()
        slots = prefix + tree.slot_map[torch.as_tensor(path)].to(k_cache.device)
        k_ar[prefix : prefix + len(path)], v_ar[prefix : prefix + len(path)] = k_cache[slots], v_cache[slots]
        one = DeviceTree(1, TREE_MAX_DEPTH, "cuda").load_(chain_tree([0], prefix_len=prefix + len(path) - 1))
        steps.append(attention_once(q[node : node + 1], k_ar, v_ar, one, True))
        rows.append(got[node : node + 1])
    case = {"op": f"attention {k_cache.shape[0]} cache, paper tree rows", "form": "tail walk (engine)"}
    return case | {"m": tree.rows} | compare(torch.cat(rows), torch.cat(steps))


def gdn_cases(model: torch.nn.Module, dtype: torch.dtype, gen: torch.Generator) -> list[dict]:
    """A chain's GDN outputs from one verification against one-row steps, each published by the
    replay kernel before the next (as the AR arm does)."""
    cfg = model.config
    h, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, device="cuda")

    x = GdnInputs(
        rand(TREE_ROWS, h, dk).to(dtype), rand(TREE_ROWS, h, dk).to(dtype), rand(TREE_ROWS, hv, dv).to(dtype),
        rand(TREE_ROWS, hv).to(dtype), rand(TREE_ROWS, hv).to(dtype), rand(hv).abs().log(), rand(hv),
    )  # fmt: skip
    state0 = rand(hv, dv, dk) * 0.1
    accepted = torch.zeros(MAX_DEPTH + 1, dtype=torch.int64, device="cuda")
    cases = []
    forms = {
        "row scan (engine)": device_ops.GdnConfig(form="rows"),
        "paths scan (engine)": device_ops.GdnConfig(form="paths"),
        "tree WY": device_ops.GdnConfig(form="wy"),
        "path scan": None,
    }
    for form, config in forms.items():
        state = state0.clone()
        steps = []
        for d in range(CHAIN):
            row = x.map(lambda t, d=d: t[d : d + 1] if t.dim() > 1 else t)
            if config is None:
                result = scan.gdn_verify(row, state, chain_tree([d], prefix_len=100 + d))
            else:
                one = DeviceTree(1, MAX_DEPTH, "cuda").load_(chain_tree([d], prefix_len=100 + d))
                result = device_ops.gdn_verify(row, state, one, config)
            steps.append(result.o)
            device_ops.replay([state], [result.operands], accepted, 1)
        steps_t = torch.cat(steps)
        for rows in (CHAIN, TREE_ROWS):
            chain = chain_tree(list(range(CHAIN)), prefix_len=100, rows=rows)
            sub = x.map(lambda t, rows=rows: t[:rows].contiguous() if t.dim() > 1 else t)
            if config is None:
                got = scan.gdn_verify(sub, state0.clone(), chain).o
            else:
                tables = DeviceTree(rows, MAX_DEPTH, "cuda").load_(chain)
                got = device_ops.gdn_verify(sub, state0.clone(), tables, config).o
            cases.append({"op": "GDN", "form": form, "m": rows} | compare(got[:CHAIN], steps_t))
    return cases


def markdown(doc: dict) -> str:
    lines = [
        f"# Row invariance of the device verification ({doc['dtype']}, {doc['device']})",
        "",
        f"Command: `{doc['command']}` at commit {doc['commit']}.",
        "Each case: the chain's rows verified together (m rows) against the one-row step of each.",
        "",
        "| op | form | m | rows equal | equal elements | max abs diff |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for c in doc["cases"]:
        lines.append(
            f"| {c['op']} | {c['form']} | {c['m']} | {c['rows_equal']}/{c['rows']} | "
            f"{c['equal_fraction']:.4f} | {c['max_abs_diff']:.3g} |"
        )
    return "\n".join(lines) + "\n"


def row_invariance_command(
    out: Annotated[Path, typer.Option(help="Output path without suffix: writes .json and .md.")] = Path(
        "results/h200/row-invariance"
    ),
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "bfloat16",
) -> None:
    """Check, per op family, whether a verified chain row equals the one-row step bit for bit."""
    require_cuda("the row-invariance check")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        typer.echo(f"error: --dtype takes float32 or bfloat16, got {dtype!r}", err=True)
        raise typer.Exit(2)
    model = load_checkpoint(default_model_path(), dtype=dtypes[dtype], device=torch.device("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases: list[dict] = []
    with torch.inference_mode():
        for part in (
            lambda: gemm_cases(model, dtypes[dtype], gen),
            lambda: logits_cases(model, gen),
            lambda: attention_cases(model, dtypes[dtype], gen),
            lambda: gdn_cases(model, dtypes[dtype], gen),
        ):
            try:
                cases += part()
            except Exception as error:  # a diagnostic reports every family it can
                cases.append({"op": "error", "form": repr(error)[:200], "m": 0, "rows_equal": 0, "rows": 0,
                              "equal_fraction": float("nan"), "max_abs_diff": float("nan")})  # fmt: skip
    doc = {
        "dtype": dtype,
        "device": torch.cuda.get_device_name(),
        "cases": cases,
        "command": command_line("row-invariance"),
        "commit": current_commit(),
    }
    write_tables(out, doc, markdown)


if __name__ == "__main__":
    typer.run(row_invariance_command)
