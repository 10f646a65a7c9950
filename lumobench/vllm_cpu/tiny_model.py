"""A tiny random-weight Qwen3-Next-format checkpoint with a locally trained tokenizer and chat template.

It exists so a real serving engine (vLLM on CPU) can be driven end to end without downloading weights:
the shapes respect what vLLM's CPU kernels accept (attention head_dim 64, Gated-DeltaNet key/value
head dim 64, bf16). vLLM's Qwen3-Next requires sparse-MoE layers, so every layer keeps a small MoE
(4 experts, top-2, plus the shared expert) as in the real architecture.
The weights are random, so generated text is gibberish; lengths are governed by `max_tokens`.
Needs `transformers` (a test/dev dependency), imported lazily.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from lumobench.arms import REPO_ROOT
from lumobench.corpus import load_corpus
from lumobench.errors import LumobenchError

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added as normal (non-special) tokens so they survive detokenization, as in Qwen's tokenizers;
# vLLM's hermes tool parser looks <tool_call> up in the vocabulary.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Qwen-style ChatML template with tools (written for this project).
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions. Available functions:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

To call a function, answer with JSON inside tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content or '' }}
{%- for tc in m.tool_calls or [] %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": \
{{ tc.function.arguments | tojson if tc.function.arguments is mapping else tc.function.arguments }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

#: Model geometry; part of the cache key so a change rebuilds the checkpoint.
TINY_GEOMETRY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "num_hidden_layers": 4,  # [GDN x3, attention]
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 16384,
}
TOKENIZER_VOCAB = 2048
COMPLETE_MARKER = ".complete"


def recipe_hash(training_texts: list[str], seed: int) -> str:
    """Identifies one checkpoint build: geometry, template, tokenizer size, seed and training text."""
    digest = hashlib.sha256()
    for part in (json.dumps(TINY_GEOMETRY, sort_keys=True), CHAT_TEMPLATE, str(TOKENIZER_VOCAB), str(seed)):
        digest.update(part.encode())
    for text in training_texts:
        digest.update(text.encode())
    return digest.hexdigest()[:16]


def train_tokenizer(training_texts: Iterable[str]) -> Tokenizer:
    """Byte-level BPE with ChatML specials, trained on the given texts (deterministic for fixed input)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


def demo_training_texts() -> list[str]:
    """Message texts of the demo corpus: what the tiny tokenizer is trained on."""
    records = load_corpus(REPO_ROOT / "corpora" / "demo.jsonl")
    return [m.content for r in records for m in r.messages if isinstance(m.content, str)]


def is_complete(dest: Path, training_texts: list[str], seed: int = 0) -> bool:
    marker = dest / COMPLETE_MARKER
    return marker.is_file() and marker.read_text().strip() == recipe_hash(training_texts, seed)


def write_tiny_checkpoint(dest: Path, training_texts: list[str], seed: int = 0) -> Path:
    """Write config.json, bf16 safetensors, tokenizer and chat template into `dest`; reuse a complete one.

    `training_texts`: strings the tokenizer is trained on (e.g. the demo corpus's messages).
    """
    if is_complete(dest, training_texts, seed):
        return dest
    try:
        import torch
        from transformers import PreTrainedTokenizerFast, Qwen3NextConfig, Qwen3NextForCausalLM
    except ImportError as exc:
        raise LumobenchError(
            f"building the tiny checkpoint needs the dev extras ({exc}); run ./install.sh"
        ) from None

    dest.mkdir(parents=True, exist_ok=True)
    (dest / COMPLETE_MARKER).unlink(missing_ok=True)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(training_texts),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=TINY_GEOMETRY["max_position_embeddings"],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(dest)

    vocab = -(-len(tok) // 64) * 64  # pad the embedding to a multiple of 64 rows
    config = Qwen3NextConfig(
        vocab_size=vocab,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        tie_word_embeddings=False,
        **TINY_GEOMETRY,
    )
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(dest, safe_serialization=True)
    (dest / COMPLETE_MARKER).write_text(recipe_hash(training_texts, seed) + "\n")
    return dest
