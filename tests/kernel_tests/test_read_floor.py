"""The read-floor benchmark's read kernel sums what its reference sums (interpreter, small shapes)."""

from __future__ import annotations

import pytest
import torch

from lumobench.bench.read_floor import read_chunk, render, stream_read, stream_read_reference

BLOCK = 64


@pytest.mark.parametrize("programs", [1, 3, 5])
def test_stream_read_sums_each_programs_chunk(programs):
    torch.manual_seed(programs)
    src = torch.randn(7 * BLOCK + 5, dtype=torch.bfloat16)
    out = torch.full((programs, BLOCK), float("nan"))  # poisoned: an unwritten lane fails
    stream_read(src, programs, out, num_warps=1, block=BLOCK)
    want = stream_read_reference(src, programs, BLOCK)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_read_chunk_is_whole_blocks_and_fits():
    assert read_chunk(10 * BLOCK + 3, 3, BLOCK) == 3 * BLOCK
    assert read_chunk(BLOCK // 2, 4, BLOCK) == BLOCK  # at least one block


def test_stream_read_refuses_a_read_past_the_end():
    with pytest.raises(ValueError, match="pass the end"):
        stream_read(torch.zeros(BLOCK, dtype=torch.bfloat16), 2, block=BLOCK)


def test_render_puts_the_best_warp_count_and_each_row_count_in_their_cells():
    read = dict(kind="read", n=5120, k=6144, programs=264, us=20.0)
    gemm = dict(kind="gemm", n=5120, k=6144, splits=3, programs=240)
    results = [
        read | dict(warps=4, fraction_of_copy_bw=0.61),
        read | dict(warps=8, fraction_of_copy_bw=0.72),
        gemm | dict(rows=1, us=17.4, fraction_of_copy_bw=0.849),
        gemm | dict(rows=32, us=19.7, fraction_of_copy_bw=0.753),
    ]
    table = render(results, "Command: x")
    assert table.startswith("Command: x\n")
    assert "| 5120 x 6144 | 63 |  | 72% |" in table  # 2 programs an SM, the better of 4 and 8 warps
    assert "| 5120 x 6144 | 3 | 240 | 17.4 (85%) |  | 19.7 (75%) |" in table
