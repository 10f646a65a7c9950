"""The shipped small model: fits its size and vLLM-CPU shape limits, loads in transformers with equal
logits, and its tokenizer + chat template render tool-call conversations."""

from __future__ import annotations

import json

import torch
from transformers import AutoTokenizer, Qwen3_5ForCausalLM

from lumotree.model import default_model_path, load_checkpoint
from lumotree.training.chat_data import render

CODE = '''def moving_average(values, window):
    """Mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = sum(values[:window])
'''

CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "What is in setup.py?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I need to read the file.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "setup.py"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "from setuptools import setup\nsetup()"},
    {"role": "assistant", "content": "It calls `setup()` with no arguments."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def test_shipped_model_fits_size_and_vllm_cpu_shape_limits() -> None:
    path = default_model_path()
    model = load_checkpoint(path)
    cfg = model.config
    assert model.num_parameters() <= 8_000_000
    assert (path / "model.safetensors").stat().st_size <= 16 * 2**20
    assert cfg.linear_key_head_dim in (64, 128) and cfg.linear_value_head_dim in (64, 128)
    assert cfg.head_dim in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
    assert model.mtp is not None and cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) + (
        "linear_attention",
    ) * 3 + ("full_attention",)
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"


def test_shipped_checkpoint_gives_transformers_logits() -> None:
    path = default_model_path()
    ours = load_checkpoint(path)
    ref = Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(AutoTokenizer.from_pretrained(path)(CODE)["input_ids"])[None]
    with torch.no_grad():
        expected = ref(ids).logits
        got = ours.compute_logits(ours(ids))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    # and the model predicts code: most next tokens of this snippet are in its top 5
    hits = (expected[0, :-1].topk(5).indices == ids[0, 1:, None]).any(-1).float().mean()
    assert hits > 0.5


def test_chat_template_renders_a_tool_call_conversation_like_ours() -> None:
    tok = AutoTokenizer.from_pretrained(default_model_path())
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text == render(CONVERSATION, TOOLS, add_generation_prompt=True)
    assert '<tools>\n{"type": "function", "function": {"name": "read_file"' in text
    assert (
        "<|im_start|>assistant\n<think>\nI need to read the file.\n</think>\n\n<tool_call>\n"
        '{"name": "read_file", "arguments": {"path": "setup.py"}}\n</tool_call><|im_end|>\n' in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\nfrom setuptools import setup\nsetup()\n</tool_response><|im_end|>"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok(text)["input_ids"]
    for marker in ("<tool_call>", "</tool_call>", "<think>", "<tool_response>", "<|im_start|>", "<|im_end|>"):
        assert tok.convert_tokens_to_ids(marker) in ids, marker
    assert tok.decode(ids) == text
