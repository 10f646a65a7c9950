"""The fused dense path (model/fused/): projections fused into one weight per block, the
elementwise ops as Triton kernels (interpreter here). The model computes the same function with
it as without it, and fusing keeps the checkpoint view of the model intact."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lumotree.model import HybridLM
from lumotree.model.fused import elementwise
from lumotree.model.fused.ops import GemmBackend, NormPlacement, kernel_mode
from lumotree.model.fused.weights import fuse_projections_
from lumotree.model.tree_mode import verify_tree
from lumotree.tree import chain_tree


def _prefill_and_decode(model: HybridLM, tokens: torch.Tensor) -> torch.Tensor:
    state = model.new_state(32)
    hidden = model.prefill(tokens[:-1], state)
    return torch.cat([hidden, model.decode(tokens[-1], state)])


def test_fusing_keeps_every_checkpoint_tensor_and_the_parameter_count(tiny_model: HybridLM) -> None:
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    count = tiny_model.num_parameters()
    fused = fuse_projections_(tiny_model)
    assert fused == 3 + 1 + 4 + 2  # 3 GDN blocks, 1 attention block, 4 MLPs, the MTP layer's two
    after = tiny_model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert tiny_model.num_parameters() == count
    assert fuse_projections_(tiny_model) == 0  # idempotent


def test_loading_a_checkpoint_after_fusing_writes_through_to_the_fused_weight(tiny_model: HybridLM) -> None:
    fuse_projections_(tiny_model)
    mlp = tiny_model.model.layers[0].mlp
    state = {k: torch.randn_like(v) for k, v in tiny_model.state_dict().items()}
    tiny_model.load_state_dict(state)
    assert mlp.fused is not None and mlp.fused.current()
    assert torch.equal(
        mlp.fused.weight[: mlp.gate_proj.out_features], state["model.layers.0.mlp.gate_proj.weight"]
    )


@pytest.mark.parametrize("gemm", ["exact", "skinny", "cublas"])
def test_the_fused_path_computes_the_same_hidden_rows(tiny_model: HybridLM, gemm: GemmBackend) -> None:
    tokens = torch.randint(0, tiny_model.config.vocab_size, (9,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), kernel_mode("off"):
        want = _prefill_and_decode(tiny_model, tokens)
    fuse_projections_(tiny_model)
    with torch.inference_mode(), kernel_mode("always", gemm):
        got = _prefill_and_decode(tiny_model, tokens)
        state = tiny_model.new_state(32)
        tiny_model.prefill(tokens[:4], state)
        tree = verify_tree(tiny_model, state, chain_tree(tokens[4:7].tolist(), prefix_len=4))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tree.hidden, want[4:7], rtol=1e-4, atol=1e-4)


def _mtp_pass(model: HybridLM, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return model.mtp_hidden(hidden, tokens, model.new_mtp_state(16))


def test_the_fused_path_computes_the_same_mtp_rows(tiny_model: HybridLM) -> None:
    """The MTP pass (its fc input in one kernel: `ops.mtp_inputs`) on both paths."""
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, tiny_model.config.hidden_size, generator=gen)
    tokens = torch.randint(0, tiny_model.config.vocab_size, (5,), generator=gen)
    with torch.inference_mode(), kernel_mode("off"):
        want = _mtp_pass(tiny_model, hidden, tokens)
    fuse_projections_(tiny_model)
    with torch.inference_mode(), kernel_mode("always"):
        got = _mtp_pass(tiny_model, hidden, tokens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_moved_model_leaves_the_stale_fusion_unused(tiny_model: HybridLM) -> None:
    fuse_projections_(tiny_model)
    tokens = torch.arange(6)
    with torch.inference_mode(), kernel_mode("off"):
        want = _prefill_and_decode(tiny_model.double(), tokens)
    assert not tiny_model.model.layers[0].linear_attn.fused.current()
    with torch.inference_mode(), kernel_mode("auto"):  # CPU: references, separate GEMMs
        got = _prefill_and_decode(tiny_model, tokens)
    assert torch.equal(got, want)


@pytest.mark.parametrize("norms", ["pending", "launched"])
def test_the_verification_forward_launches_no_norm_between_its_layers(
    tiny_model: HybridLM, monkeypatch: pytest.MonkeyPatch, norms: NormPlacement
) -> None:
    """On the fused path each layer's output projection and down projection leave the next pre-norm
    pending: the forward runs the first layer's input norm and the final norm, nothing between
    (with norms="launched", the benchmarks' baseline, a norm launch each as before: each layer's
    residual add and post-mixer norm, and layers 2-4's residual add and input norm, in one
    add-and-norm launch each); the hidden rows stay those of the reference forward either way."""
    tokens = torch.randint(0, tiny_model.config.vocab_size, (8,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode(), kernel_mode("off"):
        state = tiny_model.new_state(32)
        tiny_model.prefill(tokens[:4], state)
        want = verify_tree(tiny_model, state, chain_tree(tokens[4:7].tolist(), prefix_len=4)).hidden
    fuse_projections_(tiny_model)
    launched: list[str] = []
    for name in ("rms_norm", "add_rms_norm"):
        original = getattr(elementwise, name)

        def counted(*args: object, _name: str = name, _original: object = original) -> object:
            launched.append(_name)
            return _original(*args)  # type: ignore[operator]

        monkeypatch.setattr(elementwise, name, counted)
    with torch.inference_mode(), kernel_mode("always", norms=norms):
        state = tiny_model.new_state(32)
        tiny_model.prefill(tokens[:4], state)
        launched.clear()
        got = verify_tree(tiny_model, state, chain_tree(tokens[4:7].tolist(), prefix_len=4)).hidden
    layers = tiny_model.config.num_hidden_layers
    if norms == "pending":
        assert launched == ["rms_norm", "rms_norm"]
    else:
        assert (launched.count("rms_norm"), launched.count("add_rms_norm")) == (2, 2 * layers - 1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_bad_norm_placement_raises_value_error() -> None:
    placement: Any = "before"
    with (
        pytest.raises(ValueError, match="norms must be one of pending, launched"),
        kernel_mode("auto", norms=placement),
    ):
        pass


def test_a_moe_model_verifies_the_same_rows_on_the_fused_path(tiny_config, perturbed_model) -> None:
    """Layers with routed experts keep the launched norms (the experts read a plain tensor) between
    dense layers that leave theirs pending: the tree forward's rows equal the reference's."""
    config = tiny_config(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, mlp_only_layers=(1, 2),
    )  # fmt: skip
    model = perturbed_model(config, seed=3)
    tokens = torch.randint(0, config.vocab_size, (8,), generator=torch.Generator().manual_seed(4))
    tree = chain_tree(tokens[4:7].tolist(), prefix_len=4)
    hidden = []
    for mode in ("off", "always"):
        if mode == "always":
            fuse_projections_(model)
        with torch.inference_mode(), kernel_mode(mode):
            state = model.new_state(32)
            model.prefill(tokens[:4], state)
            hidden.append(verify_tree(model, state, tree).hidden)
    torch.testing.assert_close(hidden[1], hidden[0], rtol=1e-4, atol=1e-4)
