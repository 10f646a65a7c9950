"""Fixtures of the server tests: the shipped model's tokenizer (the shared real server, `live_url`, is
in tests/conftest.py)."""

from __future__ import annotations

import pytest

from lumotree.model import default_model_path
from lumotree.server.tokenizer import ModelTokenizer


@pytest.fixture(scope="session")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer(default_model_path())
