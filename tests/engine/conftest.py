"""Shared fixtures for the engine tests: the shipped model, demo-corpus prompts, a request runner.

The tests run single-threaded (the engine's default: the model's ops are too small for OpenMP
workers to pay off).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from lumotree.model import HybridLM, default_model_path, load_checkpoint
from lumotree.sampling import SamplingParams
from lumotree.training.chat_data import render

DEMO = Path(__file__).resolve().parents[2] / "corpora" / "demo.jsonl"
_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


@pytest.fixture(autouse=True, scope="package")
def _single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="package")
def model() -> HybridLM:
    return load_checkpoint(default_model_path())


@dataclass(frozen=True)
class DemoPrompt:
    """A demo-corpus record rendered with the model's chat template."""

    id: str
    token_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    seed: int | None


@pytest.fixture(scope="package")
def demo_prompts() -> list[DemoPrompt]:
    tok = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    out = []
    for line in DEMO.read_text().splitlines():
        rec = json.loads(line)
        text = render(rec["messages"], rec.get("tools"), add_generation_prompt=True)
        params = SamplingParams(**{k: rec[k] for k in _SAMPLING_KEYS if k in rec})
        out.append(DemoPrompt(rec["id"], tok.encode(text).ids, params, rec["max_tokens"], rec.get("seed")))
    return out
