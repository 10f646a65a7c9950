"""Forward modes agree: whole-sequence, chunked prefill and one-token decode; state layouts are as pinned."""

from __future__ import annotations

import pytest
import torch

from lumotree.model import GDNState, KVCache, gdn_ops


def test_prefill_chunks_and_stepwise_decode_match_full_forward(tiny_model) -> None:
    ids = torch.randint(0, 128, (150,), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = tiny_model(ids[None])[0]
        state = tiny_model.new_state(256)
        rows = [tiny_model.prefill(ids[:70], state), tiny_model.prefill(ids[70:100], state)]
        rows += [tiny_model.decode(int(t), state) for t in ids[100:]]
    assert state.length == 150
    torch.testing.assert_close(torch.cat(rows), full, atol=2e-5, rtol=1e-4)


def test_state_layouts_hold_what_the_contract_says(tiny_model) -> None:
    cfg = tiny_model.config
    ids = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(8))
    state = tiny_model.new_state(32)
    with torch.no_grad():
        tiny_model.prefill(ids[0], state)
        h = tiny_model.embed(ids)
        cos, sin = tiny_model.rotary(torch.arange(20)[None])
        for layer, layer_state in zip(tiny_model.model.layers, state.layers, strict=True):
            x = layer.input_layernorm(h)
            if layer.is_linear:
                assert isinstance(layer_state, GDNState)
                mixer = layer.linear_attn
                mixed, _, a, b = mixer.project(x)
                # conv state: the last W-1 pre-conv inputs, oldest first, [C, W-1]
                torch.testing.assert_close(layer_state.conv, mixed[0, -3:].T)
                q, k, v = mixer.split_qkv(mixer.conv(mixed, None)[0])
                g, beta = mixer.gates(a, b)
                qn, kn = gdn_ops.prepare_qk(q, k, cfg.linear_num_value_heads)
                _, want = gdn_ops.recurrent_gated_delta_rule(qn, kn, v, g, beta)
                assert layer_state.recurrent.dtype == torch.float32
                assert layer_state.recurrent.shape == (4, 16, 16)  # [HV, V, K]
                torch.testing.assert_close(layer_state.recurrent, want[0], atol=1e-5, rtol=1e-4)
            else:
                assert isinstance(layer_state, KVCache)
                _, k, v, _ = layer.self_attn.project(x, cos, sin)
                assert layer_state.key.shape == (32, 2, 32)  # [T_max, Hkv, D]
                torch.testing.assert_close(layer_state.key[:20], k[0])
                torch.testing.assert_close(layer_state.value[:20], v[0])
            h = layer(h, cos, sin)


@pytest.mark.parametrize("seq,chunk", [(1, 64), (50, 16), (130, 64)])
def test_chunked_gdn_matches_the_recurrence_from_a_nonzero_state(seq: int, chunk: int) -> None:
    gen = torch.Generator().manual_seed(seq)
    q, k = (torch.randn(2, seq, 2, 16, generator=gen) for _ in range(2))
    v = torch.randn(2, seq, 4, 8, generator=gen)
    g = -torch.rand(2, seq, 4, generator=gen) * 3
    beta = torch.rand(2, seq, 4, generator=gen)
    s0 = torch.randn(2, 4, 8, 16, generator=gen)
    qn, kn = gdn_ops.prepare_qk(q, k, 4)
    o_ref, s_ref = gdn_ops.recurrent_gated_delta_rule(qn, kn, v, g, beta, s0)
    o, s = gdn_ops.chunk_gated_delta_rule(qn, kn, v, g, beta, s0, chunk_size=chunk)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-4)


def test_prefill_beyond_kv_capacity_is_refused(tiny_model) -> None:
    state = tiny_model.new_state(8)
    with pytest.raises(ValueError, match="context limit"):
        tiny_model.prefill(torch.arange(9), state)
    assert state.length == 0
