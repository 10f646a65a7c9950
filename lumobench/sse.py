"""Server-sent events parsed per the WHATWG HTML specification, at the byte level.

Raw network reads are fed as they arrive; they may split a line, a `data:` field, a CRLF pair or a
multi-byte UTF-8 character anywhere. Lines end in LF, CR or CRLF; `:` lines are comments; several
`data:` lines join with LF; an event is dispatched at a blank line; an unterminated event at the end
of the stream is discarded. Reads are never stripped or re-joined as text before line splitting.
"""

from __future__ import annotations

from typing import NamedTuple

_BOM = b"\xef\xbb\xbf"


class SSEEvent(NamedTuple):
    event: str  # "message" unless an `event:` field said otherwise
    data: str
    id: str | None


class SSEParser:
    """Incremental parser: `feed(read)` returns the events completed by that read."""

    __slots__ = ("_buf", "_data", "_event", "_id", "_skip_lf", "_started", "comments")

    def __init__(self) -> None:
        self._buf = b""  # the unfinished last line (never contains CR)
        self._data: list[bytes] = []
        self._event = ""
        self._id: str | None = None
        self._skip_lf = False  # previous read ended in CR: an LF starting this read belongs to it
        self._started = False
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        if not self._started:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._buf = buf
                return []
            self._started = True
            if buf.startswith(_BOM):
                buf = buf[len(_BOM) :]
        if b"\r" in buf:
            self._skip_lf = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        events: list[SSEEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    data = b"\n".join(self._data).decode("utf-8", errors="replace")
                    events.append(SSEEvent(self._event or "message", data, self._id))
                    self._data = []
                self._event = ""
            elif line[0] == 0x3A:  # ":" comment
                self.comments += 1
            else:
                name, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    self._data.append(value)
                elif name == b"event":
                    self._event = value.decode("utf-8", errors="replace")
                elif name == b"id" and b"\0" not in value:
                    self._id = value.decode("utf-8", errors="replace")
                # "retry" and unknown fields are ignored, as the spec says
        return events
