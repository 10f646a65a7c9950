"""Byte-level BPE tokenizer with ChatML special tokens, trained with `tokenizers`, saved in HF format."""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Single tokens but ordinary text (kept by skip_special_tokens), as in Qwen's tokenizers.
MARKUP_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
EOS, PAD = "<|im_end|>", "<|endoftext|>"
# Split before byte-level BPE: words with their leading punctuation, digits one at a time, symbol
# runs, newline runs, and whitespace runs that leave one space for the following word.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def chat_template() -> str:
    """The model's Jinja chat template (ChatML with tools, tool calls, tool responses, <think>)."""
    return resources.files("lumotree.training").joinpath("chat_template.jinja").read_text()


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train byte-level BPE on texts; ids 0..8 are the special and markup tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[*SPECIAL_TOKENS, *MARKUP_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


def save_hf_tokenizer(tok: Tokenizer, out: Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json (with the chat template) loadable by AutoTokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": chat_template(),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def token_id(tok: Tokenizer, token: str) -> int:
    """Id of a special/markup token (raises KeyError if the tokenizer lacks it)."""
    idx = tok.token_to_id(token)
    if idx is None:
        raise KeyError(token)
    return idx
