"""Helpers shared by the engine tests (fixtures live in conftest.py)."""

from __future__ import annotations

from lumotree.engine import GenerationRequest, LLMEngine, TokenEvent


def run_requests(engine: LLMEngine, requests: list[GenerationRequest]) -> dict[str, list[TokenEvent]]:
    """Submit every request, step until all finish; the events of each request, in order."""
    events: dict[str, list[TokenEvent]] = {r.request_id: [] for r in requests}
    for req in requests:
        engine.add_request(req)
    while engine.has_unfinished():
        for event in engine.step():
            events[event.request_id].append(event)
    return events


def output_tokens(events: list[TokenEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]
