"""What every endpoint shares: the engine, the tokenizer, the served name and the request limits."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from lumotree.server.errors import APIError
from lumotree.server.generation import EngineClient
from lumotree.server.params import RequestLimits, load_sampling_defaults
from lumotree.server.tokenizer import ModelTokenizer


@dataclass
class ServingContext:
    engine: EngineClient
    tokenizer: ModelTokenizer
    model_name: str  # what requests name as "model"
    model_path: str
    limits: RequestLimits
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def for_model(
        cls,
        engine: EngineClient,
        model_dir: Path,
        max_model_len: int,
        model_name: str | None = None,
        api_key: str | None = None,
    ) -> ServingContext:
        """Context for the checkpoint folder `model_dir` (tokenizer, chat template, sampling defaults)."""
        tokenizer = ModelTokenizer(model_dir)
        limits = RequestLimits(max_model_len, tokenizer.vocab_size, load_sampling_defaults(model_dir))
        name = model_name or Path(model_dir).resolve().name
        return cls(engine, tokenizer, name, str(model_dir), limits, api_key)

    def check_model(self, name: str | None) -> None:
        """404 unless `name` is the served model (or omitted)."""
        if name is not None and name != self.model_name:
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
