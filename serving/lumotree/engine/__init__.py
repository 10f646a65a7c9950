"""The LumoTree engine: request queue, prefill, draft -> verify -> accept -> publish cycles.

from lumotree.engine import EngineConfig, EngineProcess, GenerationRequest
engine = EngineProcess(EngineConfig(drafter="tree"))   # or "mtp" (chain), "ar"; AsyncEngine: a thread
async for event in engine.generate(GenerationRequest("r1", prompt_ids, SamplingParams(0.0), 64)):
    ...  # event.token_ids, event.finished, event.finish_reason, event.spec
"""

from lumotree.engine.async_engine import AsyncEngine, EngineClient, EngineDeadError, EngineProcess
from lumotree.engine.config import DRAFTER_KINDS, EngineConfig
from lumotree.engine.llm_engine import LLMEngine
from lumotree.engine.metrics import EngineMetrics, PhaseSpan
from lumotree.engine.sequence import GenerationRequest, SpecStats, TokenEvent, TokenLogprob

__all__ = [
    "DRAFTER_KINDS",
    "AsyncEngine",
    "EngineClient",
    "EngineConfig",
    "EngineDeadError",
    "EngineMetrics",
    "EngineProcess",
    "GenerationRequest",
    "LLMEngine",
    "PhaseSpan",
    "SpecStats",
    "TokenEvent",
    "TokenLogprob",
]
