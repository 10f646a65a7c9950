"""What every endpoint shares: the engine, the tokenizer, the served name and the request limits."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from lumotree import __version__
from lumotree.engine.sequence import GenerationRequest
from lumotree.server.errors import APIError
from lumotree.server.generation import EngineClient, EngineFailure, OutputDelta, TextOptions, stream_output
from lumotree.server.params import RequestLimits, context_error, load_sampling_defaults
from lumotree.server.tokenizer import ModelTokenizer

log = logging.getLogger("lumotree.server")


@dataclass
class ServingContext:
    engine: EngineClient
    tokenizer: ModelTokenizer
    model_name: str  # what requests name as "model"
    model_path: str
    limits: RequestLimits
    api_key: str | None = None
    #: vLLM's `system_fingerprint`: lumotree-<version>-<8 hex digits of the serving configuration>
    system_fingerprint: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    #: why the engine can take no more requests (its thread died); /health then answers 503
    engine_dead: str | None = None
    #: what /version reports beside the version: how the engine runs on this machine
    engine_info: dict[str, object] = field(default_factory=dict)

    @classmethod
    def for_model(
        cls,
        engine: EngineClient,
        model_dir: Path,
        max_model_len: int,
        model_name: str | None = None,
        api_key: str | None = None,
        config: object = None,
    ) -> ServingContext:
        """Context for the checkpoint folder `model_dir` (tokenizer, chat template, sampling defaults);
        `config` (e.g. the engine's configuration) enters the system fingerprint."""
        tokenizer = ModelTokenizer(model_dir)
        defaults = load_sampling_defaults(model_dir)
        limits = RequestLimits(max_model_len, tokenizer.vocab_size, defaults, tokenizer.max_token_bytes)
        name = model_name or Path(model_dir).resolve().name
        fingerprint = system_fingerprint(Path(model_dir).resolve(), max_model_len, name, config)
        return cls(engine, tokenizer, name, str(model_dir), limits, api_key, fingerprint)

    async def output(self, req: GenerationRequest, opts: TextOptions) -> AsyncIterator[OutputDelta]:
        """The request's text deltas (`stream_output`), logged, noting a dead engine for /health."""
        log.info(
            "%s: submitted, %d prompt tokens, max_tokens %d",
            req.request_id,
            len(req.prompt_token_ids),
            req.max_tokens,
        )
        last: OutputDelta | None = None
        try:
            async with contextlib.aclosing(stream_output(self.engine, self.tokenizer, req, opts)) as deltas:
                async for last in deltas:
                    yield last
        except EngineFailure as exc:
            log.warning("%s: failed: %s", req.request_id, exc)
            if exc.dead:
                self.engine_dead = str(exc)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            log.info(
                "%s: client gone after %d tokens: aborted",
                req.request_id,
                last.num_output_tokens if last else 0,
            )
            raise
        if last is not None:
            spec = last.spec
            log.info(
                "%s: %s after %d tokens (%d prompt, %d cached); %d drafts, %d accepted",
                req.request_id, last.finish_reason, last.num_output_tokens, last.num_prompt_tokens,
                last.cached_prompt_tokens, spec.num_drafts, spec.num_accepted_tokens,
            )  # fmt: skip

    def prompt_ids(self, text: str, field: str) -> list[int]:
        """Token ids of a prompt text; a text too long for the context is refused before it is tokenized
        (tokenizing costs memory per token: a 10 MB prompt took 1.7 GB to be refused after it)."""
        at_least = -(-len(text) // self.limits.max_token_bytes)
        if at_least >= self.limits.max_model_len:
            raise context_error(self.limits, at_least, field, at_least=True)
        return self.tokenizer.encode(text)

    def check_model(self, name: str | None) -> None:
        """404 unless `name` is the served model (or omitted)."""
        if name is not None and name != self.model_name:
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )


def system_fingerprint(*config: object) -> str:
    """`lumotree-<version>-<hash8>`, the hash over the serving configuration (vLLM's "hash" form)."""
    digest = hashlib.sha256(json.dumps(config, default=str, sort_keys=True).encode()).hexdigest()
    return f"lumotree-{__version__}-{digest[:8]}"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
