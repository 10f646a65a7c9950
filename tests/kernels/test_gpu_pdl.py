"""Programmatic dependent launch (`lumotree/model/fused/launch.py`) on a CUDA GPU: the H200 and
its Triton support it, and a decode-like chain of the fused kernels (norm, split and unsplit skinny
GEMMs, residual add + norm, SwiGLU) captured in a CUDA graph gives, with PDL, exactly the values
it gives launched one kernel after another without it. A kernel that read its predecessor's output
before waiting for it would read stale rows (each step's output buffer holds the previous
replay's values) and fail the comparison.

Run on the device machine with: TRITON_INTERPRET=0 pytest -m gpu tests/kernels/test_gpu_pdl.py
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from lumotree.model.fused import elementwise as kernels
from lumotree.model.fused.launch import launch_options, pdl_mode, pdl_supported
from lumotree.model.fused.skinny_gemm import skinny_linear

from .helpers import GPU_ONLY

pytestmark = GPU_ONLY
CUDA = torch.device("cuda")
HIDDEN, INTER, LAYERS = 5120, 17408, 6


def test_the_device_supports_pdl() -> None:
    assert pdl_supported(CUDA)
    x = torch.zeros(1, device=CUDA)
    assert launch_options(x) == {"PDL": True, "launch_pdl": True}
    with pdl_mode(False):
        assert launch_options(x) == {"PDL": False}


Layers = list[tuple[Tensor, Tensor, Tensor]]


def _weights(gen: torch.Generator) -> Layers:
    """Per layer: gate/up [2I, H], down [H, I] and the next norm's weight [H], bf16."""

    def randn(*shape: int, scale: float) -> Tensor:
        return (torch.randn(*shape, generator=gen, device=CUDA) * scale).to(torch.bfloat16)

    return [
        (randn(2 * INTER, HIDDEN, scale=0.02), randn(HIDDEN, INTER, scale=0.01), randn(HIDDEN, scale=0.1))
        for _ in range(LAYERS)
    ]


def _chain(h: Tensor, layers: Layers) -> Tensor:
    """A norm, then per layer: gate/up GEMM (unsplit), SwiGLU, down GEMM (split K), residual add +
    norm. Returns the last residual and normed rows."""
    x = kernels.rms_norm(h, layers[-1][2], 1e-6)
    for gate_up, down, norm_w in layers:
        y = kernels.silu_mul(skinny_linear(x, gate_up))
        h, x = kernels.add_rms_norm(h, skinny_linear(y, down), norm_w, 1e-6)
    return torch.cat([h, x])


@pytest.mark.parametrize("rows", [1, 6])
def test_a_pdl_chain_in_a_graph_equals_the_plain_launches(rows: int) -> None:
    gen = torch.Generator(device=CUDA).manual_seed(rows)
    layers = _weights(gen)
    h = torch.randn(rows, HIDDEN, generator=gen, device=CUDA).to(torch.bfloat16)
    with pdl_mode(False):
        want = _chain(h, layers)
    static = h.clone()
    graph = torch.cuda.CUDAGraph()
    with pdl_mode(True):
        _chain(static, layers)  # compile the PDL variants outside the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            out = _chain(static, layers)
    for trial in range(5):
        static.copy_(h if trial % 2 == 0 else -h)  # every replay must see this replay's input
        graph.replay()
        torch.cuda.synchronize()
        expected = want if trial % 2 == 0 else _plain(-h, layers)
        assert torch.equal(out, expected), f"replay {trial}"


def _plain(h: Tensor, layers: Layers) -> Tensor:
    with pdl_mode(False):
        return _chain(h, layers)
