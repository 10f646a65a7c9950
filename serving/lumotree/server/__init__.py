"""The LumoTree HTTP server: OpenAI-compatible chat/completions, SGLang-style /generate, Prometheus
metrics with vLLM's names, over `lumotree.engine.EngineProcess`, the engine in its own process
(DESIGN §5). It knows no tensors; the engine knows no text.

Modules: `protocol` (request/response models), `params` (API fields -> GenerationRequest), `generation`
(engine events -> detokenized, stop-trimmed deltas), `detokenizer`, `reasoning` (`<think>`),
`tool_calls` (`<tool_call>`), `chat` / `completions` / `sglang` (the endpoints), `outputs` (usage,
logprobs), `metrics`, `sse`, `errors`, `disconnect`, `tokenizer` (tokenizer + chat template), `context`,
`app` (routes) and `__main__` (`python -m lumotree.server`).
"""

from lumotree.server.app import create_app
from lumotree.server.context import ServingContext

__all__ = ["ServingContext", "create_app"]
