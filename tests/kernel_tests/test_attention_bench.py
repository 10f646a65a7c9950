"""`lumobench bench attention` off the GPU: its workloads on the CPU under TRITON_INTERPRET=1 (float32,
small shapes; the timing itself needs CUDA graphs) and its ranking of settings."""

from __future__ import annotations

import pytest
import torch

from lumobench.bench.attention import (
    ROW_SETS,
    Setting,
    Workload,
    parse_tiles,
    rank,
    render,
    render_drafter,
    row_set,
)
from lumobench.bench.kernels.decode import AttentionShape
from lumotree.verify.attention.decode import AttentionConfig

SHAPE = AttentionShape(q_heads=4, kv_heads=2, dim=16)
SETTING = Setting(AttentionConfig(block_m=16, block_n=16, num_warps=1), keys=16)


@pytest.mark.parametrize("kind", ROW_SETS)
def test_each_row_set_runs_every_layer_and_matches_the_reference(kind: str) -> None:
    work = Workload(
        row_set(kind, 40), SHAPE, torch.device("cpu"), 1, capacity=100, layers=2, dtype=torch.float32
    )
    assert work.splits(SETTING) == 7  # 100 cache rows in partitions of 16, whatever the context
    assert work.max_error(SETTING) < 1e-5
    work.run(SETTING)
    assert all(torch.isfinite(o).all() for o in work.o)  # the last layer written too
    work.tables.prefix_len.fill_(39)  # tables that disagree with the tree: the check must see it
    assert work.max_error(SETTING) > 1e-3


def _row(setting: str, ctx: int, kind: str, ms: float | None) -> dict:
    measured = {} if ms is None else {"layer_ms": ms, "over_floor": ms / 0.01}
    return {
        "setting": setting,
        "context": ctx,
        "rows": kind,
        **measured,
        **({} if measured else {"error": "x"}),
    }


def test_settings_rank_by_the_trees_summed_time_and_incomplete_ones_drop_out() -> None:
    rows = [
        _row("slow", 4096, "tree", 0.03),
        _row("slow", 32768, "tree", 0.10),
        _row("fast", 4096, "tree", 0.04),
        _row("fast", 32768, "tree", 0.05),
        _row("fast", 4096, "ar", 0.50),  # AR's time does not rank
        _row("broken", 4096, "tree", 0.01),
        _row("broken", 32768, "tree", None),
    ]
    order = rank(rows, [4096, 32768])
    assert order == ["fast", "slow"]
    table = render(rows, [], order, [4096, 32768])
    assert table.index("| fast |") < table.index("| slow |")
    assert "| broken |" not in table and "Settings that failed: broken" in table


def test_parse_tiles_reads_configs_and_names_a_bad_entry():
    configs = parse_tiles("128/64/8/2, 64/32/4/3")
    tiles = [(c.block_m, c.block_n, c.num_warps, c.num_stages) for c in configs]
    assert tiles == [(128, 64, 8, 2), (64, 32, 4, 3)]
    assert parse_tiles("") == []
    with pytest.raises(ValueError, match="'128/64/8'"):
        parse_tiles("128/64/8")


def test_a_128_row_query_tile_matches_the_reference() -> None:
    """The tiles --tiles adds: a query tile taller than every grouped row of the tree (padding)."""
    work = Workload(
        row_set("tree", 40), SHAPE, torch.device("cpu"), 2, capacity=100, layers=1, dtype=torch.float32
    )
    assert work.max_error(Setting(AttentionConfig(block_m=128, block_n=16, num_warps=8), keys=16)) < 1e-5


@pytest.mark.parametrize("kind", ["ar", "chain"])
def test_the_drafters_form_spreads_the_prefix_and_matches_the_reference(kind: str) -> None:
    """The MTP drafter's form: the committed prefix over a partition count, whatever the cache."""
    work = Workload(
        row_set(kind, 40), SHAPE, torch.device("cpu"), 3, capacity=100, layers=1, dtype=torch.float32
    )
    setting = Setting(AttentionConfig(block_m=16, block_n=16, num_warps=1), prefix_partitions=3)
    assert work.splits(setting) == 3 and setting.short(100) == 0
    assert work.max_error(setting) < 1e-5
    work.tables.prefix_len.fill_(30)  # tables that disagree with the row set: the check must see it
    assert work.max_error(setting) > 1e-3


def test_the_drafter_table_shows_each_setting_once_with_its_error() -> None:
    rows = [
        _row("BM16 prefix over 32", ctx, kind, 0.004) | {"max_error": 1e-6}
        for ctx in (4096, 32768)
        for kind in ("ar", "chain")
    ]
    rows.append(_row("BM64 prefix over 32", 4096, "ar", None) | {"max_error": 2e-6})
    table = render_drafter(rows, [4096, 32768])
    assert table.count("| BM16 prefix over 32 |") == 1
    assert "4.0 (0.40x)" in table and "| BM64 prefix over 32 | error |" in table
