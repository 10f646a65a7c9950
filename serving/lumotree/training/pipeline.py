"""The whole small-model recipe: collect code -> tokenizer -> token streams + chat data -> train -> evaluate
-> write an HF checkpoint folder. Imports only lumotree.model and this package (no lumobench)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from lumotree.model import FULL, LINEAR, HybridConfig, HybridLM, load_checkpoint, save_checkpoint
from lumotree.training import chat_data, corpus
from lumotree.training.tokenizer import EOS, PAD, save_hf_tokenizer, token_id, train_tokenizer
from lumotree.training.train import TokenStreams, TrainSettings, evaluate, train


@dataclass(frozen=True)
class Recipe:
    """Data, tokenizer and model sizes of one training run (defaults: the shipped model)."""

    vocab_size: int = 8192
    hidden_size: int = 256
    intermediate_size: int = 448
    blocks: int = 2  # [GDN x3, attention] blocks
    attention_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64  # vLLM-CPU attention head sizes: 32, 64, 80, 96, 112, 128, ...
    gdn_key_heads: int = 2
    gdn_value_heads: int = 4
    gdn_head_dim: int = 64  # vLLM-CPU GDN kernel: 64 or 128
    max_position_embeddings: int = 32_768
    include_distributions: bool = True
    max_corpus_bytes: int = 200_000_000
    tokenizer_bytes: int = 24_000_000
    heldout_pct: int = 2
    heldout_bytes: int = 4_000_000
    chat_conversations: int = 16_000
    chat_source_files: int = 3_000
    eval_windows: int = 64
    seed: int = 0

    def model_config(self, tok: Tokenizer) -> HybridConfig:
        layer_types = ([LINEAR] * 3 + [FULL]) * self.blocks
        return HybridConfig(
            vocab_size=tok.get_vocab_size(),
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=len(layer_types),
            layer_types=tuple(layer_types),
            num_attention_heads=self.attention_heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            linear_num_key_heads=self.gdn_key_heads,
            linear_num_value_heads=self.gdn_value_heads,
            linear_key_head_dim=self.gdn_head_dim,
            linear_value_head_dim=self.gdn_head_dim,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=True,
            mtp_num_hidden_layers=1,
            bos_token_id=None,
            eos_token_id=token_id(tok, EOS),
            pad_token_id=token_id(tok, PAD),
        )


TOY_RECIPE = Recipe(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    blocks=1,
    attention_heads=2,
    kv_heads=1,
    head_dim=32,
    gdn_key_heads=1,
    gdn_value_heads=2,
    gdn_head_dim=32,
    include_distributions=False,
    max_corpus_bytes=1_500_000,
    tokenizer_bytes=400_000,
    heldout_pct=5,
    heldout_bytes=100_000,
    chat_conversations=200,
    chat_source_files=300,
    eval_windows=4,
)
TOY_SETTINGS = TrainSettings(
    seq_len=128, batch_size=4, lr=3e-3, warmup_steps=5, train_seconds=4.0, log_every=5
)


def encode_files(tok: Tokenizer, files: list[corpus.SourceFile]) -> np.ndarray:
    """int32 token stream: each file's tokens followed by <|endoftext|>."""
    pad = token_id(tok, PAD)
    encoded = tok.encode_batch([f.text for f in files])
    return np.concatenate([np.array([*e.ids, pad], dtype=np.int32) for e in encoded])


def run(
    out: Path, recipe: Recipe, settings: TrainSettings, device: torch.device, echo: Callable[[str], None]
) -> dict:
    """Run the recipe and write the checkpoint folder `out`; returns the metrics dict (also metrics.json)."""
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = last = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        timings[name] = round(now - last, 1)
        last = now
        echo(f"[{now - t0:7.1f}s] {name} done ({timings[name]}s)")

    files, report = corpus.collect_sources(recipe.include_distributions)
    train_files, heldout_files = corpus.split_heldout(files, recipe.heldout_pct)
    train_files = corpus.take_bytes(train_files, recipe.max_corpus_bytes)
    heldout_files = corpus.take_bytes(heldout_files, recipe.heldout_bytes)
    phase("collect")

    tok = train_tokenizer(
        (f.text for f in corpus.take_bytes(train_files, recipe.tokenizer_bytes)), recipe.vocab_size
    )
    save_hf_tokenizer(tok, out, recipe.max_position_embeddings)
    phase("tokenizer")

    code = encode_files(tok, train_files)
    heldout = encode_files(tok, heldout_files)
    conversations = chat_data.build_conversations(
        train_files[: recipe.chat_source_files], recipe.chat_conversations, recipe.seed
    )
    chat, chat_mask = chat_data.encode_conversations(tok, conversations)
    phase("encode")
    echo(
        f"code {len(code):,} tokens from {len(train_files):,} files; "
        f"held-out {len(heldout):,} tokens; chat {len(conversations):,} conversations, {len(chat):,} tokens"
    )

    config = recipe.model_config(tok)
    model = HybridLM.random(config, seed=recipe.seed)
    echo(f"model: {model.num_parameters():,} parameters, layers {list(config.layer_types)}")
    log_path = out / "train_log.jsonl"
    with log_path.open("w") as log_file:

        def log(row: dict) -> None:
            log_file.write(json.dumps(row) + "\n")
            log_file.flush()
            echo(json.dumps(row))

        streams = TokenStreams(code, chat, chat_mask, settings.seq_len, settings.seed)
        summary = train(model, streams, settings, device, log)
    phase("train")

    save_checkpoint(model.cpu(), out, fmt="qwen3_5_text", dtype=torch.bfloat16)
    _write_generation_config(out, tok)
    shipped = load_checkpoint(out, dtype=torch.float32, device=device)  # evaluate the bf16 weights we ship
    held = evaluate(shipped, heldout, settings.seq_len, recipe.eval_windows, device)
    echo(f"held-out: {json.dumps(held)}")
    phase("evaluate")

    metrics = {
        "parameters": model.num_parameters(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "timings_s": timings,
        "wall_s": round(time.perf_counter() - t0, 1),
        "train": summary,
        "heldout": held,
        "data": {
            "train_files": len(train_files),
            "train_bytes": sum(len(f.text) for f in train_files),
            "train_tokens": len(code),
            "heldout_files": len(heldout_files),
            "heldout_tokens": len(heldout),
            "chat_conversations": len(conversations),
            "chat_tokens": len(chat),
        },
        "recipe": asdict(recipe),
        "settings": asdict(settings),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    manifest = {"origins": report, "heldout_files": [f.name for f in heldout_files]}
    (out / "data_manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return metrics


def _write_generation_config(out: Path, tok: Tokenizer) -> None:
    config = {
        "eos_token_id": [token_id(tok, EOS), token_id(tok, PAD)],
        "pad_token_id": token_id(tok, PAD),
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }
    (out / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")
