"""The narrow-config sweep's table (`lumobench bench skinny-gemm --narrow`), from rows made up here:
the sweep itself needs a GPU, its ranking and table do not."""

from __future__ import annotations

from lumobench.bench.skinny_gemm import for_shape_fractions, narrow_grid, render_narrow_table
from lumotree.model.fused.skinny_gemm import SkinnyConfig


def _rows(method: str, us: dict[int, float]) -> list[dict]:
    return [
        dict(n=5120, k=6144, rows=m, method=method, median_ms=t / 1e3, fraction_of_copy_bw=0.5)
        for m, t in us.items()
    ]


def test_configs_rank_by_their_slowest_row_count_after_cublas_and_the_rule_is_marked() -> None:
    chosen = SkinnyConfig.for_shape(5120, 6144, "cpu").label()
    results = (
        _rows("cuBLAS F.linear", {1: 30.0, 32: 30.0})
        + _rows("fast at one row", {1: 20.0, 32: 29.0})  # slowest 29
        + _rows("even", {1: 24.0, 32: 25.0})  # slowest 25: ranks first
        + _rows(chosen, {1: 26.0, 32: 27.0})
    )
    lines = render_narrow_table(results, best=1).splitlines()
    body = [line for line in lines[2:] if line]
    assert [line.split(" | ")[2] for line in body] == ["cuBLAS F.linear", "even", f"{chosen} (for_shape)"]
    assert body[1].endswith("| 24.0 (50%) | 25.0 (50%) | 25.0 |")


def test_the_narrow_grid_keeps_eight_tiles_a_range() -> None:
    for k in (6144, 17408):
        grid = narrow_grid(k)
        assert grid and all(k // (c.block_k * c.splits) >= 8 for c in grid)
    assert any(c.splits == 3 and c.block_n == 64 for c in narrow_grid(17408))


def test_for_shape_fractions_keep_the_for_shape_config_by_shape_and_rows() -> None:
    timed = [
        dict(n=5120, k=6144, rows=m, method=method, fraction_of_copy_bw=f)
        for m, method, f in (
            (1, "cuBLAS F.linear", 0.1),
            (1, "skinny for_shape n64 k128 w4 s3 x3", 0.68564),
            (32, "skinny for_shape n64 k128 w4 s3 x3", 0.6365),
            (1, "skinny 4 stages n64 k128 w4 s4 x3", 0.9),
        )
    ]
    assert for_shape_fractions(timed) == {"5120x6144": {"1": 0.6856, "32": 0.6365}}
