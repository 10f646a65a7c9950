"""Server-sent events parsed per the WHATWG HTML specification, at the byte level.

Raw network reads are fed as they arrive; they may split a line, a `data:` field, a CRLF pair or a
multi-byte UTF-8 character anywhere. Lines end in LF, CR or CRLF; `:` lines are comments; several
`data:` lines join with LF; an event is dispatched at a blank line; an unterminated event at the end
of the stream is discarded. Reads are never stripped or re-joined as text before line splitting.

An unfinished line is kept in a growing buffer (each byte is copied a bounded number of times, so a
long line costs linear time) and may hold at most `max_line_bytes`; an event's data lines together
at most the same. A stream that exceeds either raises `SSELineTooLong`.
"""

from __future__ import annotations

from typing import NamedTuple

_BOM = b"\xef\xbb\xbf"
#: longest SSE line (and event) accepted; a streamed chat chunk is a few KB, the first chunk with the
#: prompt's token ids of a long context under 1 MB
MAX_LINE_BYTES = 16 * 1024 * 1024


class SSELineTooLong(ValueError):
    """A line or an event of the stream is longer than the parser's limit."""


class SSEEvent(NamedTuple):
    event: str  # "message" unless an `event:` field said otherwise
    data: str
    id: str | None


class SSEParser:
    """Incremental parser: `feed(read)` returns the events completed by that read."""

    __slots__ = (
        "_buf",
        "_data",
        "_data_bytes",
        "_event",
        "_id",
        "_skip_lf",
        "_started",
        "comments",
        "max_line_bytes",
    )

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()  # the unfinished last line (never contains CR)
        self._data: list[bytes] = []
        self._data_bytes = 0
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
        if not self._started:
            head = bytes(self._buf) + chunk
            if len(head) < len(_BOM) and _BOM.startswith(head):
                self._buf = bytearray(head)
                return []
            self._started = True
            self._buf.clear()
            chunk = head[len(_BOM) :] if head.startswith(_BOM) else head
        if b"\n" not in chunk and b"\r" not in chunk:
            # no line ends here: append in place (amortised linear), never re-copy the whole line
            self._buf += chunk
            if len(self._buf) > self.max_line_bytes:
                raise SSELineTooLong(f"an SSE line is longer than {self.max_line_bytes} bytes")
            return []
        buf = bytes(self._buf) + chunk if self._buf else chunk
        if b"\r" in buf:
            self._skip_lf = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        rest = lines.pop()
        if len(rest) > self.max_line_bytes:
            raise SSELineTooLong(f"an SSE line is longer than {self.max_line_bytes} bytes")
        if rest:
            self._buf = bytearray(rest)
        else:
            self._buf.clear()
        events: list[SSEEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    data = b"\n".join(self._data).decode("utf-8", errors="replace")
                    events.append(SSEEvent(self._event or "message", data, self._id))
                    self._data = []
                    self._data_bytes = 0
                self._event = ""
            elif line[0] == 0x3A:  # ":" comment
                self.comments += 1
            else:
                name, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    self._data.append(value)
                    self._data_bytes += len(value) + 1
                    if self._data_bytes > self.max_line_bytes:
                        raise SSELineTooLong(f"an SSE event is longer than {self.max_line_bytes} bytes")
                elif name == b"event":
                    self._event = value.decode("utf-8", errors="replace")
                elif name == b"id" and b"\0" not in value:
                    self._id = value.decode("utf-8", errors="replace")
                # "retry" and unknown fields are ignored, as the spec says
        return events
