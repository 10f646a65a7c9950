"""The asyncio face of the engine: `LLMEngine.step` runs in one background thread; each
`generate()` call receives its request's TokenEvents through an asyncio queue.

The engine is not thread-safe: every call into it (add_request, step, metrics) happens under one
lock, which a step holds for one prefill chunk or one decode cycle (milliseconds); callers take it
from a worker thread, never on the event loop. Aborts are queued and applied by the engine thread
before its next step, so cancelling a stream never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

import torch

from lumotree.drafting.geometry import GeometryConfig
from lumotree.engine.config import EngineConfig
from lumotree.engine.llm_engine import LLMEngine
from lumotree.engine.metrics import EngineMetrics
from lumotree.engine.sequence import GenerationRequest, TokenEvent

log = logging.getLogger(__name__)
_Target = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[TokenEvent | BaseException]"]


class EngineDeadError(RuntimeError):
    """The engine thread failed; no request can make progress."""


class AsyncEngine:
    """Runs an LLMEngine in a daemon thread; `generate` streams one request's events."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._targets: dict[str, _Target] = {}
        # aborts (returned None) and stop strings (returned: output tokens the client got), in the order
        # callers made them; appended by callers, drained by the engine thread
        self._aborts: deque[tuple[str, int | None]] = deque()
        self._stopping = False
        self._dead: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lumotree-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        return cls(LLMEngine(config))

    # the server reads these (they never change while the engine runs)
    @property
    def tokenizer_path(self) -> Path:
        return self.engine.tokenizer_path

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def kernels(self) -> str:
        return self.engine.config.kernels

    @property
    def geometry(self) -> GeometryConfig:
        """The draft tree's counts after the tree shape was chosen for the kernels."""
        return self.engine.geometry

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.engine.eos_token_ids

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Submit `req` and yield its events until the finished one. Raises ValueError (bad
        request) before the first event; closing the iterator early aborts the request."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine thread failed: {self._dead!r}")
        queue: asyncio.Queue[TokenEvent | BaseException] = asyncio.Queue()
        submit = asyncio.ensure_future(
            asyncio.to_thread(self._submit, req, (asyncio.get_running_loop(), queue))
        )
        try:
            await asyncio.shield(submit)
        except asyncio.CancelledError:
            # The worker thread completes the submit regardless; once the request is in, abort it.
            submit.add_done_callback(lambda f: self._forget(req.request_id, f))
            raise
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"the engine thread failed: {item!r}") from item
                finished = item.finished
                yield item
        finally:
            if finished:
                self._targets.pop(req.request_id, None)
            else:
                self._forget(req.request_id, submit)

    def _forget(self, request_id: str, submit: asyncio.Future[None]) -> None:
        """Nobody listens to `request_id` any more: drop its target and abort it if it was submitted."""
        self._targets.pop(request_id, None)
        if not submit.cancelled() and submit.exception() is None:
            self.abort(request_id)

    def _submit(self, req: GenerationRequest, target: _Target) -> None:
        with self._lock:
            self.engine.add_request(req)  # ValueError for a bad request reaches the caller
            self._targets[req.request_id] = target
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Abort a request (applied before the engine's next step; never blocks)."""
        self._aborts.append((request_id, None))
        self._wake.set()

    def stop(self, request_id: str, returned: int) -> None:
        """Finish a request as "stop" at `returned` output tokens, where the server matched a stop string
        (`LLMEngine.stop_request`; applied before the engine's next step, never blocks)."""
        self._aborts.append((request_id, returned))
        self._wake.set()

    def metrics(self) -> EngineMetrics:
        """Engine counters (waits for the current step to end: call it from a worker thread or
        accept a pause of one cycle)."""
        with self._lock:
            return self.engine.metrics()

    def shutdown(self) -> None:
        """Stop the engine thread (requests still running are left unfinished)."""
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                with self._lock:
                    while self._aborts:
                        request_id, returned = self._aborts.popleft()
                        if returned is None:
                            self.engine.abort(request_id)
                        else:
                            self.engine.stop_request(request_id, returned)
                    busy = self.engine.has_unfinished()
                    events = self.engine.step() if busy else []
                    deliveries = [(self._targets.get(e.request_id), e) for e in events]
            except BaseException as exc:  # an engine bug: fail every waiting caller, then stop
                log.exception("engine thread failed")
                self._dead = exc
                with self._lock:
                    for loop, queue in self._targets.values():
                        self._deliver(loop, queue, exc)
                return
            for target, event in deliveries:
                if target is not None:
                    self._deliver(*target, event)
            if not busy:
                self._wake.wait()

    @staticmethod
    def _deliver(
        loop: asyncio.AbstractEventLoop,
        queue: asyncio.Queue[TokenEvent | BaseException],
        item: TokenEvent | BaseException,
    ) -> None:
        # RuntimeError: the caller's event loop is closed, nobody is listening
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, item)
