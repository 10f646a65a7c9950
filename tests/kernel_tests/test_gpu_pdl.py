"""Programmatic dependent launch (model/fused/launch.py) on a CUDA GPU: it engages on the H200, and a
CUDA graph of dependent kernels launched with it computes the bits of the plain launches (a kernel
reading its predecessor's output before that kernel finished would part from them).

Run on the device machine with: TRITON_INTERPRET=0 pytest -m gpu tests/kernel_tests/test_gpu_pdl.py
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from lumotree.model.fused.launch import launch_options, pdl_mode
from lumotree.model.fused.weights import fuse_projections_
from lumotree.model.random_weights import preset_config, random_model

from .helpers import GPU_ONLY

pytestmark = GPU_ONLY
CUDA = torch.device("cuda")
REPLAYS = 20


def test_pdl_engages_on_this_gpu() -> None:
    if torch.cuda.get_device_capability(CUDA)[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9")
    assert launch_options(CUDA) == {"GDC": True, "launch_pdl": True}
    with pdl_mode(False):
        assert launch_options(CUDA) == {"GDC": False}


@pytest.mark.parametrize("rows", [1, 32])
def test_a_graph_of_pdl_launches_has_the_bits_of_plain_launches(rows: int) -> None:
    """Eight 27B-shaped decoder layers with the identity as their mixer, in a chain (a norm, the add
    and the MLP's norm, the gate-up GEMM with SwiGLU, the down GEMM with the residual: each kernel
    reads the one before), captured with PDL and replayed on fresh inputs."""
    full = preset_config("qwen3.5-27b")
    config = full.replace(num_hidden_layers=8, layer_types=full.layer_types[:8], vocab_size=1024)
    model = random_model(config, CUDA, torch.bfloat16, seed=5)
    fuse_projections_(model)
    gen = torch.Generator(device=CUDA).manual_seed(rows)
    h_in = torch.empty(1, rows, config.hidden_size, device=CUDA, dtype=torch.bfloat16)

    def chain() -> Tensor:
        h = h_in
        for layer in model.model.layers:
            h = layer.with_mixer(h, lambda y: y)
        return h

    with torch.inference_mode():
        h_in.copy_(torch.randn(h_in.shape, generator=gen, device=CUDA))
        with pdl_mode(True):
            chain()  # compile both builds outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = chain()
        with pdl_mode(False):
            chain()
        for _ in range(REPLAYS):
            h_in.copy_(torch.randn(h_in.shape, generator=gen, device=CUDA))
            with pdl_mode(False):
                want = chain()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want)
