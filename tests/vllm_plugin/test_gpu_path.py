"""The plugin's CUDA path without vLLM (issue 25 item 4), on a CUDA GPU: the Triton set behind the
plugin's signatures (`lumotree.vllm.gpu.triton_kernels`) in the plugin's GDN core over vLLM's mamba
cache layout (a state slot among others, the conv buffer widened for speculation), and in its tree
attention over FlashAttention's paged KV layout ("flash"), against the plugin's CPU op set on the
same inputs. What this does not run is vLLM's own CUDA runner around them (no vLLM on the H200).

    pytest -m gpu tests/vllm_plugin/test_gpu_path.py
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import Tensor

from lumotree.model import default_model_path, load_checkpoint
from lumotree.verify.kernel_sets import CPU_FAST
from lumotree.vllm.gdn_core import TorchGdnCore, conv_state_view
from lumotree.vllm.publish import LayerIndex, publish_accepted
from lumotree.vllm.steps import RequestStep
from lumotree.vllm.tree_attention import tree_attention_rows

from .fake_vllm import gdn_layer, plan
from .trees import tree_from_paths

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="the plugin's CUDA path needs a CUDA GPU"),
]

DEVICE = "cuda"
SLOT, PREFIX = 2, 7
PATHS = [[1, 2, 3, 4], [1, 5], [6, 7, 8], [6, 9], [10]]


def _on(layer: SimpleNamespace, device: torch.device) -> SimpleNamespace:
    """A copy of the fake layer with its weights and mamba cache on `device`."""
    moved = SimpleNamespace(**vars(layer))
    moved.conv1d = SimpleNamespace(weight=layer.conv1d.weight.to(device))
    moved.A_log, moved.dt_bias = layer.A_log.to(device), layer.dt_bias.to(device)
    moved.kv_cache = [t.clone().to(device) for t in layer.kv_cache]
    return moved


def _gdn_steps(layer: SimpleNamespace, core: TorchGdnCore, inputs: list[Tensor], device: torch.device):
    """The prefix's chunk, one tree step (rows 3.. of a batch whose first 3 rows are another
    request's) and the publication of an off-spine path: (tree rows' outputs, state, conv state)."""
    px, pb, pa, tx, tb, ta = (t.to(device) for t in inputs)
    heads, dim = layer.kv_cache[1].shape[1], layer.kv_cache[1].shape[2]  # slots, HV, V, K
    chunk = RequestStep("r", 0, 0, PREFIX, [0] * PREFIX, 0, prompt_len=100)
    out = torch.zeros(PREFIX, heads, dim, device=device)
    core.forward(layer, plan([chunk], [[[SLOT]]], [1]), 0, False, px, pb, pa, out)
    tree = tree_from_paths(0, PATHS, prefix_len=PREFIX)
    req = RequestStep("r", 0, 3, tree.rows, [0] * tree.rows, PREFIX, prompt_len=PREFIX, tree=tree)
    req.rows = 3 + tree.slot_map
    flat = 3 + tree.rows
    x, b, a = (torch.zeros(flat, t.shape[1], device=device) for t in (tx, tb, ta))
    x[req.rows], b[req.rows], a[req.rows] = tx, tb, ta
    rows_out = torch.zeros(flat, heads, dim, device=device)
    step = plan([req], [[[SLOT]]], [1])
    core.forward(layer, step, 0, False, x, b, a, rows_out)
    accepted = tree.path_to(int((tree.tokens == 8).nonzero()))  # root, 6, 7, 8: off the spine
    publish_accepted(step, req, accepted, LayerIndex({layer.prefix: (layer, 0)}, {}, False), core)
    conv = conv_state_view(layer.kv_cache[0], SLOT, layer.conv_kernel_size, False)
    return rows_out[req.rows].cpu(), layer.kv_cache[1][SLOT].cpu(), conv.cpu()


def test_the_triton_gdn_core_and_publication_on_cuda_equal_the_cpu_core() -> None:
    from lumotree.vllm.gpu import triton_kernels

    mixer = load_checkpoint(default_model_path()).model.layers[0].linear_attn
    layer = gdn_layer(mixer, slots=4, spec_width=27)  # vLLM's buffer, widened for 27 drafts
    gen = torch.Generator().manual_seed(3)
    rows = len({n for p in PATHS for n in p}) + 1
    with torch.no_grad():
        inputs = []
        for n in (PREFIX, rows):
            h = torch.randn(1, n, mixer.in_proj_qkv.in_features, generator=gen)
            mixed, _, a, b = mixer.project(h)
            inputs += [mixed[0], b[0], a[0]]
    cuda = torch.device(DEVICE)
    gpu_layer = _on(layer, cuda)
    untouched = [t[[0, 1, 3]].clone() for t in gpu_layer.kv_cache]
    got = _gdn_steps(gpu_layer, TorchGdnCore(triton_kernels()), inputs, cuda)
    want = _gdn_steps(layer, TorchGdnCore(CPU_FAST), inputs, torch.device("cpu"))
    for name, g, w in zip(("tree rows", "recurrent state", "conv state"), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    for before, t in zip(untouched, gpu_layer.kv_cache, strict=True):  # other requests' slots
        assert torch.equal(before, t[[0, 1, 3]])


def test_tree_attention_rows_over_flash_attentions_paged_cache_on_cuda() -> None:
    from lumotree.vllm.gpu import triton_kernels

    heads, kv_heads, dim, block_size, prefix = 8, 2, 128, 16, 37
    tree = tree_from_paths(3, PATHS, prefix_len=prefix)
    n = tree.rows
    req = RequestStep("r", 0, 2, n, [0] * n, prefix, prefix, tree=tree)
    req.rows = 2 + tree.slot_map
    step = plan([req], [[[5, 0, 3, 1]]], [block_size])  # the request's blocks, out of order
    gen = torch.Generator().manual_seed(4)
    cache = torch.zeros(6, kv_heads, block_size, 2 * dim)
    key_view, value_view = cache.transpose(1, 2).split(dim, dim=-1)  # FlashAttention's writer's view
    slots = step.kv_slots(req, 0, torch.arange(prefix))
    key_view[slots // block_size, slots % block_size] = torch.randn(prefix, kv_heads, dim, generator=gen)
    value_view[slots // block_size, slots % block_size] = torch.randn(prefix, kv_heads, dim, generator=gen)
    flat = 2 + n
    query = torch.randn(flat, heads, dim, generator=gen)
    key, value = (torch.randn(flat, kv_heads, dim, generator=gen) for _ in range(2))
    want = torch.zeros(flat, heads, dim)
    tree_attention_rows(step, 0, CPU_FAST, query, key, value, cache, want, "flash")
    cuda = torch.device(DEVICE)
    got = torch.full((flat, heads, dim), float("nan"), device=cuda)
    got[:2] = 0.0  # another request's rows: must stay as they are
    tree_attention_rows(
        step, 0, triton_kernels(), query.to(cuda), key.to(cuda), value.to(cuda), cache.to(cuda), got, "flash"
    )
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
