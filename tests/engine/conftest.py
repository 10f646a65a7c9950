"""Shared fixtures for the engine tests: the shipped model, demo-corpus prompts, a request runner.

The tests run single-threaded (the engine's default: the model's ops are too small for OpenMP
workers to pay off).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lumobench.bench.engine import load_requests
from lumotree.engine import GenerationRequest
from lumotree.model import HybridLM, default_model_path, load_checkpoint

DEMO = Path(__file__).resolve().parents[2] / "corpora" / "demo.jsonl"


@pytest.fixture(autouse=True, scope="package")
def _single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="package")
def model() -> HybridLM:
    return load_checkpoint(default_model_path())


@pytest.fixture(scope="package")
def demo_prompts() -> list[GenerationRequest]:
    """The demo corpus as the engine receives it (chat template applied, a seed per request)."""
    return load_requests(DEMO, default_model_path(), max_tokens=None, greedy=False)
