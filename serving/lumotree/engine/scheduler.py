"""What runs next: a FIFO queue of waiting requests and one active sequence (the paper's setting).

A request leaves the queue when the active one finishes; aborting a waiting request removes it,
aborting the active one frees the engine at once.
"""

from __future__ import annotations

from collections import deque

from lumotree.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    """First come, first served; one sequence runs (prefill chunks, then decode cycles) at a time."""

    def __init__(self) -> None:
        self.waiting: deque[Sequence] = deque()
        self.running: Sequence | None = None
        self._unfinished: dict[str, Sequence] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._unfinished

    def __len__(self) -> int:
        return len(self._unfinished)

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self._unfinished:
            raise ValueError(f"request id {seq.request_id!r} is already in use by an unfinished request")
        self._unfinished[seq.request_id] = seq
        self.waiting.append(seq)

    def next(self) -> Sequence | None:
        """The sequence to work on now: the active one, else the oldest waiting one (made active)."""
        if self.running is None and self.waiting:
            self.running = self.waiting.popleft()
        return self.running

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark `seq` finished and drop it from the queue / the active slot."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self._unfinished.pop(seq.request_id, None)
        if self.running is seq:
            self.running = None
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def get(self, request_id: str) -> Sequence | None:
        return self._unfinished.get(request_id)
