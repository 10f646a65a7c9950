"""The MTP head equals a direct computation of its definition, and its cached step equals its full form."""

from __future__ import annotations

import torch
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5TextRotaryEmbedding


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def test_mtp_matches_direct_computation_with_transformers_decoder_layer(tiny_model) -> None:
    """transformers has no MTP module: build it from its formula around transformers' own decoder layer."""
    cfg = tiny_model.config
    mtp = tiny_model.mtp
    ref_cfg = Qwen3_5TextConfig(
        **{
            k: v
            for k, v in cfg.to_hf_dict().items()
            if k not in ("architectures", "model_type", "layer_types", "num_hidden_layers")
        },
        num_hidden_layers=1,
        layer_types=["full_attention"],
    )
    ref_cfg._attn_implementation = "eager"
    layer = Qwen3_5DecoderLayer(ref_cfg, 0).eval()
    layer.load_state_dict(mtp.layers[0].state_dict())
    rope = Qwen3_5TextRotaryEmbedding(ref_cfg)

    seq = 33
    ids = torch.randint(0, cfg.vocab_size, (1, seq + 1), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        hidden = tiny_model(ids[:, :-1])  # main model rows h_t
        ours = tiny_model.compute_logits(tiny_model.mtp_forward(hidden, ids[:, 1:]))

        x = (
            torch.cat(
                [
                    _rms(tiny_model.embed(ids[:, 1:]), mtp.pre_fc_norm_embedding.weight),
                    _rms(hidden, mtp.pre_fc_norm_hidden.weight),
                ],
                dim=-1,
            )
            @ mtp.fc.weight.T
        )
        positions = torch.arange(seq)[None]
        causal = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
        x = layer(x, position_embeddings=rope(x, positions), attention_mask=causal, position_ids=positions)
        expected = _rms(x, mtp.norm.weight) @ tiny_model.lm_head.weight.T
    torch.testing.assert_close(ours, expected, atol=2e-5, rtol=1e-4)


def test_mtp_cached_steps_match_full_sequence_form(tiny_model) -> None:
    ids = torch.randint(0, 128, (1, 41), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hidden = tiny_model(ids[:, :-1])[0]
        full_hidden = tiny_model.mtp_forward(hidden[None], ids[:, 1:])[0]
        state = tiny_model.new_mtp_state(64)
        _, first = tiny_model.mtp_step(hidden[:25], ids[0, 1:26], state)  # a prefill of MTP rows
        rows = [first] + [
            tiny_model.mtp_step(hidden[t : t + 1], ids[0, t + 1 : t + 2], state)[1] for t in range(25, 40)
        ]
        logits, _ = tiny_model.mtp_step(hidden[39:40], ids[0, 40:41], tiny_model.new_mtp_state(64))
    assert state.length == 40
    torch.testing.assert_close(torch.cat(rows), full_hidden, atol=2e-5, rtol=1e-4)
    assert logits.shape == (1, 128)


def test_mtp_rollback_overwrites_speculative_rows(tiny_model) -> None:
    """A drafter resets mtp_state.length after speculative steps; later rows then match a clean run."""
    ids = torch.randint(0, 128, (1, 21), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        hidden = tiny_model(ids[:, :-1])[0]
        clean = tiny_model.new_mtp_state(32)
        tiny_model.mtp_step(hidden[:19], ids[0, 1:20], clean)
        _, want = tiny_model.mtp_step(hidden[19:20], ids[0, 20:21], clean)
        state = tiny_model.new_mtp_state(32)
        tiny_model.mtp_step(hidden[:19], ids[0, 1:20], state)
        for _ in range(3):  # speculative chain on garbage inputs
            tiny_model.mtp_step(torch.randn(1, 64), torch.tensor([7]), state)
        state.length = 19
        _, got = tiny_model.mtp_step(hidden[19:20], ids[0, 20:21], state)
    torch.testing.assert_close(got, want)


def test_a_load_without_layers_drafts_as_the_full_model() -> None:
    """What a drafter beside another engine's target loads: embedding, norm, lm_head and MTP only."""
    from lumotree.model import default_model_path, load_checkpoint

    full = load_checkpoint(default_model_path())
    head = load_checkpoint(default_model_path(), without_layers=True)
    assert len(head.model.layers) == 0 and head.mtp is not None
    hidden, tokens = torch.randn(3, full.config.hidden_size), torch.tensor([5, 6, 7])
    with torch.no_grad():
        a = full.mtp_step(hidden, tokens, full.new_mtp_state(8))
        b = head.mtp_step(hidden, tokens, head.new_mtp_state(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
