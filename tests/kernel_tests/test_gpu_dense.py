"""The fused dense path on a CUDA GPU at Qwen3.5-27B shapes (bf16 and fp32): every elementwise
kernel against its PyTorch reference on upcast inputs, outputs poisoned; and a 4-layer model of
that shape computing the same hidden rows with the fused path as without it.

Run on the device machine with: TRITON_INTERPRET=0 pytest -m gpu tests/kernel_tests/test_gpu_dense.py
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from lumotree.model.fused import elementwise as kernels
from lumotree.model.fused import reference as ref
from lumotree.model.fused.ops import kernel_mode
from lumotree.model.fused.weights import fuse_projections_
from lumotree.model.random_weights import preset_config, random_model
from lumotree.model.rope import RotaryEmbedding

from .helpers import GPU_ONLY, assert_written

pytestmark = [*GPU_ONLY, pytest.mark.usefixtures("poisoned_outputs")]
CUDA = torch.device("cuda")
EPS = 1e-6
DTYPES = [torch.float32, torch.bfloat16]


def _close(got: Tensor, want: Tensor, dtype: torch.dtype) -> None:
    """Relative Frobenius error against the fp32 reference of the same (rounded) inputs."""
    err = (got.double() - want.double()).norm() / want.double().norm()
    assert err < (2e-6 if dtype == torch.float32 else 8e-3), f"relative error {err:.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 32])
def test_dense_kernels_match_their_references_at_27b_shapes(
    dtype: torch.dtype, rows: int, poisoned_outputs: list[Tensor]
) -> None:
    gen = torch.Generator(device=CUDA).manual_seed(rows)

    def randn(*shape: int) -> Tensor:
        return torch.randn(shape, generator=gen, device=CUDA).to(dtype)

    h, delta, w = randn(1, rows, 5120), randn(1, rows, 5120), randn(5120) * 0.1
    total, y = kernels.add_rms_norm(h, delta, w, EPS)
    want_total, want_y = ref.add_rms_norm(h.float(), delta.float(), w.float(), EPS)
    _close(total, want_total, dtype)
    _close(y, want_y, dtype)
    _close(kernels.rms_norm(h, w, EPS), ref.rms_norm(h.float(), w.float(), EPS), dtype)
    proj = randn(1, rows, 16480)  # the fused GDN projection: [qkv 10240 | z 6144 | b 48 | a 48]
    o, z, gw = randn(1, rows, 48, 128), proj[..., 10240:16384].view(1, rows, 48, 128), randn(128)
    _close(
        kernels.gated_rms_norm(o, z, gw, EPS),
        ref.gated_rms_norm(o.float(), z.float(), gw.float(), EPS),
        dtype,
    )
    q_gate = randn(1, rows, 24, 512)  # attention [query | gate] per head, head_dim 256
    cos, sin = RotaryEmbedding(64, 1e7).to(CUDA)(torch.arange(4000, 4000 + rows, device=CUDA)[None])
    q, qw = q_gate[..., :256], randn(256) * 0.1
    _close(
        kernels.norm_rope(q, qw, EPS, cos, sin), ref.norm_rope(q.float(), qw.float(), EPS, cos, sin), dtype
    )
    k, kw = randn(1, rows, 4, 256), randn(256) * 0.1  # queries and keys in one launch: two launches' bits
    pair = kernels.norm_rope_pair(q, qw, k, kw, EPS, cos, sin)
    assert torch.equal(pair[0], kernels.norm_rope(q, qw, EPS, cos, sin))
    assert torch.equal(pair[1], kernels.norm_rope(k, kw, EPS, cos, sin))
    attn, gate = randn(1, rows, 24, 256), q_gate[..., 256:]
    _close(kernels.sigmoid_mul(attn, gate), ref.sigmoid_mul(attn.float(), gate.float()), dtype)
    gate_up = randn(1, rows, 2 * 17408)
    _close(kernels.silu_mul(gate_up), ref.silu_mul(gate_up.float()), dtype)
    # the MTP fc's input: embedding rows of a 248,320-token table and hidden rows, each half normed
    table, tokens = randn(248320, 5120), torch.randint(0, 248320, (1, rows), generator=gen, device=CUDA)
    got = kernels.mtp_inputs(table, tokens, h, w, w * 2, EPS)
    _close(got, ref.mtp_inputs(table.float(), tokens, h.float(), w.float(), 2 * w.float(), EPS), dtype)
    assert torch.equal(got[..., :5120], kernels.rms_norm(table[tokens], w, EPS))
    assert torch.equal(got[..., 5120:], kernels.rms_norm(h, w * 2, EPS))
    for out in poisoned_outputs:
        assert_written(out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_27b_shaped_model_gives_the_same_hidden_rows_with_the_fused_path(dtype: torch.dtype) -> None:
    full = preset_config("qwen3.5-27b")
    config = full.replace(num_hidden_layers=4, layer_types=full.layer_types[:4], vocab_size=1024)
    model = random_model(config, CUDA, dtype, seed=3)
    tokens = torch.randint(0, 1024, (40,), device=CUDA, generator=torch.Generator(device=CUDA).manual_seed(0))

    def hidden() -> Tensor:
        state = model.new_state(64)
        rows = model.prefill(tokens[:-1], state)
        return torch.cat([rows, model.decode(tokens[-1], state)]).double()

    with torch.inference_mode(), kernel_mode("off"):
        want = hidden()
    assert fuse_projections_(model) == 4 + 4 + 2  # 3 GDN + 1 attention, 4 MLPs, the MTP layer
    with torch.inference_mode():
        got = hidden()
    err = (got - want).norm() / want.norm()
    assert err < (1e-5 if dtype == torch.float32 else 2e-2), f"relative error {err:.2e}"
