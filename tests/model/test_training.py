"""The training recipe: its data filters, chat loss mask, and a seconds-long end-to-end toy run."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import torch

from lumotree.model import load_checkpoint
from lumotree.training import chat_data, corpus
from lumotree.training.pipeline import TOY_RECIPE, TOY_SETTINGS, run
from lumotree.training.tokenizer import train_tokenizer

GOOD = "def f(x):\n    return x + 1\n" * 40


def test_corpus_filter_rejects_generated_minified_and_copyleft() -> None:
    assert corpus.accept_text(GOOD.encode()) == GOOD
    assert corpus.accept_text(b"x = 1\n") is None  # too small
    assert corpus.accept_text(("# Auto-generated file\n" + GOOD).encode()) is None
    assert corpus.accept_text(("x = [" + "1, " * 300 + "]\n" + GOOD).encode()) is None  # 900-char line
    assert corpus.accept_text(b"\xff\xfe" + GOOD.encode()) is None  # not UTF-8
    assert corpus.is_permissive("BSD-3-Clause") and corpus.is_permissive("Apache Software License")
    assert not corpus.is_permissive("GPL-3.0-or-later") and not corpus.is_permissive("MPL-2.0 AND MIT")
    assert not corpus.is_permissive("")


def test_chat_loss_mask_covers_exactly_the_assistant_turns() -> None:
    conversations = [
        {
            "messages": [
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "general kenobi", "reasoning_content": "a greeting"},
            ],
            "tools": chat_data.TOOLS,
        }
    ]
    text = chat_data.render(conversations[0]["messages"], chat_data.TOOLS, add_generation_prompt=False)
    tok = train_tokenizer([text, GOOD], vocab_size=300)
    ids, mask = chat_data.encode_conversations(tok, conversations)
    assert ids.dtype == np.int32 and mask.shape == ids.shape
    assert tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False) == (
        "<think>\na greeting\n</think>\n\ngeneral kenobi<|im_end|>"
    )


def test_toy_training_run_writes_a_checkpoint_that_learned(tmp_path) -> None:
    settings = dataclasses.replace(TOY_SETTINGS, train_seconds=600.0, max_steps=30, log_every=10)
    metrics = run(tmp_path, TOY_RECIPE, settings, torch.device("cpu"), lambda _: None)
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "metrics.json",
    ):
        assert (tmp_path / name).is_file(), name
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["step"] == 1 and log[-1]["step"] == 30
    assert log[-1]["loss"] < log[0]["loss"] - 0.5 and log[-1]["mtp1_loss"] < log[0]["mtp1_loss"] - 0.5
    model = load_checkpoint(tmp_path)
    assert model.mtp is not None and model.num_parameters() == metrics["parameters"]
    held = metrics["heldout"]
    assert held["tokens"] > 0 and 0.0 <= held["mtp1_agree"] <= 1.0 and np.isfinite(held["loss"])
