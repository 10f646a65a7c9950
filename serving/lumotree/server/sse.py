"""Server-sent-event framing of streamed responses (`data: JSON` events, then `data: [DONE]`)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"


def sse_event(payload: BaseModel | dict[str, Any]) -> bytes:
    """One `data:` event. JSON never contains a raw newline, so one line per event suffices."""
    if isinstance(payload, BaseModel):
        data = payload.model_dump_json(exclude_none=True)
    else:
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


def stream_error(exc: Exception, status: int = 500) -> bytes:
    """An OpenAI-style error event for a failure after the stream started (the status is already 200)."""
    status = getattr(exc, "status", status)
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return sse_event({"error": {"message": str(exc), "type": kind, "code": status}})
