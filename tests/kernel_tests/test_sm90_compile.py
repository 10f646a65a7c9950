"""Ahead-of-time compiles for Hopper (sm_90) on this CPU machine (tests/kernel_tests/hopper_aot.py).

The interpreter runs the kernels' arithmetic but not the compiler, so code that only the compiler
rejects (a loop-carried variable changing type, a layout it cannot lower) would otherwise first fail
on the GPU. Also checks the value-major design's claim that its state products run on wgmma, and that
the skinny GEMM's configs compile without register spills (their weight tiles on wgmma from 64 rows).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "serving"), str(ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    script = Path(__file__).with_name("hopper_aot.py")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "kernel",
    [
        "value-major prepare", "value-major apply", "tree-parallel", "row scan", "paths scan",
        "paths scan, tree register cap", "tree drafter append",
        "tree drafter scan", "tree drafter pick", "tree drafter assemble", "tree attention partial",
        "tree attention partial, by prefix", "tree attention partial, 27B tiles",
        "tree attention merge", "kv write",
        "gdn prepare", "tree conv, operands prepared", "norm rope pair", "derive tables",
    ],
)  # fmt: skip
def test_kernel_compiles_for_hopper(compiled: dict, kernel: str) -> None:
    assert compiled[kernel]["ok"], compiled[kernel]["error"]


def test_the_tree_register_cap_holds_the_paths_scan_to_its_registers(compiled: dict) -> None:
    # (with the operands prepared outside the scan, this compiler fits the uncapped scan in 128 too;
    # on the H200 the capped scan still times faster: results/h200/gdn-forms-caps.md)
    capped, free = compiled["paths scan, tree register cap"], compiled["paths scan"]
    assert 0 < capped["registers"] <= 128, capped["registers"]
    assert capped["registers"] <= free["registers"] and capped["spill_bytes"] == 0, (capped, free)


@pytest.mark.parametrize(
    "kernel",
    ["tree attention partial", "tree attention partial, by prefix", "tree attention partial, 27B tiles"],
)
def test_tree_attention_reads_its_keys_by_tensor_memory_copies_into_wgmma(
    compiled: dict, kernel: str
) -> None:
    # K and V tiles come by descriptor (no per-element addresses or masks a key tile), both dots on wgmma
    result = compiled[kernel]
    assert result["ok"], result["error"]
    assert result["tma"] and result["wgmma"], result
    assert 0 < result["registers"] <= 255
    # no spill in a loop (the masked tiles' loop as a pipelined loop: with one stage the 27B tiles
    # spilled 48-80 bytes there, and without the partials' alignment 768); Triton 3.6 spills 8 bytes
    # once a program around the bf16 partials' store
    assert result["loop_spills"] == 0 and result["spill_bytes"] <= 16, result


def test_float32_tree_attention_loads_its_keys_without_descriptors(compiled: dict) -> None:
    # exact fp32 dots from descriptor tiles compiled to 32 registers and 35-78 KB of spills under
    # Triton 3.6; masked loads keep 255 registers (3.8 KB of spills under 3.6, 9.5 KB under 3.9)
    result = compiled["tree attention partial, fp32"]
    assert result["ok"], result["error"]
    assert not result["tma"] and result["registers"] > 128 and result["spill_bytes"] <= 16384, result


def test_tree_attention_fits_the_h200s_shared_memory(compiled: dict) -> None:
    # 227 KiB a block (sm_90's opt-in maximum): past it the launch fails on the GPU, not here;
    # float32 64-key tiles by descriptor needed 262 KB
    for name, result in compiled.items():
        if name.startswith("tree attention partial"):
            assert result["ok"], result["error"]
            assert 0 < result["shared_bytes"] <= 227 * 1024, (name, result["shared_bytes"])


def test_value_major_state_products_run_on_wgmma(compiled: dict) -> None:
    assert compiled["value-major apply"]["wgmma"]


SKINNY = [
    "skinny n128 k64 t1",
    "skinny n128 k64 t2",
    "skinny n64 k128 t1",
    "skinny n64 k128 t2",
    "skinny n64 k128 t1 split",
    "skinny n64 k128 t2 split",
    "skinny n64 k128 t1 split m1",
    "skinny swiglu n64 k64 t1",
    "skinny swiglu n64 k64 t2",
    *(f"skinny n64 k128 t{t} split norm out" for t in (1, 2)),
    *(f"skinny n64 k128 t{t} norm out" for t in (1, 2)),
    *(f"skinny n128 k64 t{t} norm in" for t in (1, 2)),
    *(f"skinny swiglu n64 k64 t{t} norm in" for t in (1, 2)),
]


@pytest.mark.parametrize("kernel", SKINNY)
def test_skinny_gemm_configs_compile_without_spills(compiled: dict, kernel: str) -> None:
    result = compiled[kernel]
    assert result["ok"], result["error"]
    assert result["spill_bytes"] == 0, (
        f"{result['spill_bytes']} bytes of spills, {result['registers']} registers"
    )
    assert 0 < result["registers"] <= 255


@pytest.mark.parametrize("kernel", ["skinny n128 k64 t1", "skinny n128 k64 t2", "skinny n64 k128 t1"])
def test_skinny_gemm_wide_tiles_run_on_wgmma(compiled: dict, kernel: str) -> None:
    assert compiled[kernel]["wgmma"]


@pytest.mark.parametrize(
    "entry",
    [
        "skinny n64 k128 t{} split norm out",
        "skinny n64 k128 t{} norm out",
        "skinny n128 k64 t{} norm in",
        "skinny swiglu n64 k64 t{} norm in",
    ],
)
def test_a_pending_norms_sums_run_alike_for_16_and_32_row_tiles(compiled: dict, entry: str) -> None:
    # A row's bits must not depend on the row count (AR's one row in a 16-row tile, the tree's 32 in
    # a 32-row one): the block sums of h squared (producer) and of the blocks (consumer) reduce in
    # the same blocked layout whatever the tile's height. (With the blocks along the tile's other
    # axis, the consumer's lanes split them 8 x 4 at 16 rows and 4 x 8 at 32.)
    sixteen, thirty_two = compiled[entry.format(1)], compiled[entry.format(2)]
    assert sixteen["reductions"] and sixteen["reductions"] == thirty_two["reductions"], (sixteen, thirty_two)


def test_the_ar_steps_state_update_reduces_as_the_replay_does(compiled: dict) -> None:
    # The AR step's row scan writes the state publication's replay used to: the same bits only if
    # its prediction S k sums in the replay's layout (the [value, key] tile's reduction over keys)
    advancing, published = compiled["row scan, advancing"], compiled["replay"]
    assert advancing["ok"] and published["ok"], (advancing["error"], published["error"])
    tiles = [r for r in advancing["reductions"] if r.startswith("axis 1")]
    assert tiles and set(tiles) == set(published["reductions"]), (advancing, published)
