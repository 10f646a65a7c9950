"""The asyncio face of the engine: each `generate()` call receives its request's TokenEvents through an
asyncio queue, while `LLMEngine.step` runs elsewhere, in one of two places:

- `EngineProcess` (what the server runs): the engine loop in its own process, as vLLM V1 keeps its
  engine core apart from the API server. Requests, aborts and metrics queries go to it over a pipe
  and events come back; the server's event loop, HTTP parsing, detokenization and SSE writing hold
  no lock the engine loop needs, so they never stall a decode cycle (and on a CPU run on the other
  core).
- `AsyncEngine`: a background thread of this process (embedding in a program, tests). Every call
  into the engine (add_request, step, metrics) happens under one lock, which a step holds for one
  prefill chunk or one decode cycle; callers take it from a worker thread, never on the event loop.

Both share `EngineClient`: a request is submitted from a worker thread (a bad request's ValueError
reaches the caller before the first event), closing the iterator early aborts it, and aborts are
applied before the engine's next step, so cancelling a stream never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import signal
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from lumotree.drafting.geometry import GeometryConfig
from lumotree.engine.config import EngineConfig
from lumotree.engine.llm_engine import LLMEngine
from lumotree.engine.metrics import EngineMetrics
from lumotree.engine.sequence import GenerationRequest, TokenEvent
from lumotree.model.native.build import isa as native_isa

log = logging.getLogger(__name__)
_Target = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[TokenEvent | BaseException]"]


class EngineDeadError(RuntimeError):
    """The engine loop failed or its process ended; no request can make progress."""


@dataclass(frozen=True)
class EngineInfo:
    """What the server reads of the engine (it never changes while the engine runs)."""

    tokenizer_path: Path  # the model folder (tokenizer.json, tokenizer_config.json with the chat template)
    model_name: str
    max_model_len: int
    device: str
    kernels: str
    geometry: GeometryConfig  # the draft tree's counts after the tree shape was chosen for the kernels
    eos_token_ids: tuple[int, ...]
    drafter: str
    tree_shape: str | None  # the tree drafter's shape (None for AR and chain MTP)
    native_isa: str | None  # the native CPU forward's ISA path (None with other kernels)

    @classmethod
    def of(cls, engine: LLMEngine) -> EngineInfo:
        cfg = engine.config
        return cls(
            engine.tokenizer_path, engine.model_name, engine.max_model_len, str(engine.device),
            cfg.kernels, engine.geometry, engine.eos_token_ids, cfg.drafter,
            cfg.tree_shape if cfg.drafter == "tree" else None,
            native_isa() if cfg.kernels == "cpu-native" else None,
        )  # fmt: skip


class EngineClient(ABC):
    """Streams of events for requests run by an engine loop elsewhere (see the module docstring)."""

    def __init__(self, info: EngineInfo) -> None:
        self.info_ = info
        self._targets: dict[str, _Target] = {}
        self._dead: BaseException | None = None

    @property
    def tokenizer_path(self) -> Path:
        return self.info_.tokenizer_path

    @property
    def model_name(self) -> str:
        return self.info_.model_name

    @property
    def max_model_len(self) -> int:
        return self.info_.max_model_len

    @property
    def device(self) -> torch.device:
        return torch.device(self.info_.device)

    @property
    def kernels(self) -> str:
        return self.info_.kernels

    @property
    def geometry(self) -> GeometryConfig:
        return self.info_.geometry

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.info_.eos_token_ids

    @property
    def dead(self) -> str | None:
        """Why no request can run any more (None while the engine loop lives)."""
        return None if self._dead is None else f"the engine failed: {self._dead!r}"

    def info(self) -> dict[str, object]:
        """How the engine runs here: drafter, kernels, the native forward's ISA path, the tree shape
        (chosen for this machine unless one was asked for) and verification rows."""
        i = self.info_
        return {
            "drafter": i.drafter,
            "kernels": i.kernels,
            "native_isa": i.native_isa,
            "tree_shape": i.tree_shape,
            "rows": i.geometry.rows,
            "device": i.device,
        }

    async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Submit `req` and yield its events until the finished one. Raises ValueError (bad
        request) before the first event; closing the iterator early aborts the request."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine failed: {self._dead!r}")
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
                    raise EngineDeadError(f"the engine failed: {item!r}") from item
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

    def _deliver_events(self, events: list[TokenEvent]) -> None:
        for event in events:
            target = self._targets.get(event.request_id)
            if target is not None:
                _deliver(*target, event)

    def _fail_all(self, exc: BaseException) -> None:
        """The engine loop is gone: every waiting caller gets the failure."""
        self._dead = exc
        for loop, queue in list(self._targets.values()):
            _deliver(loop, queue, exc)

    @abstractmethod
    def _submit(self, req: GenerationRequest, target: _Target) -> None:
        """Add `req` to the engine (ValueError for a bad one) with `target` receiving its events
        (registered before the engine can emit any). Runs in a worker thread."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Abort a request (applied before the engine's next step; never blocks)."""

    @abstractmethod
    def stop(self, request_id: str, returned: int) -> None:
        """Finish a request as "stop" at `returned` output tokens, where the server matched a stop
        string (`LLMEngine.stop_request`; applied before the engine's next step, never blocks)."""

    @abstractmethod
    def metrics(self) -> EngineMetrics:
        """Engine counters (waits for the current step to end: call it from a worker thread)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the engine loop (requests still running are left unfinished)."""


def _deliver(
    loop: asyncio.AbstractEventLoop,
    queue: asyncio.Queue[TokenEvent | BaseException],
    item: TokenEvent | BaseException,
) -> None:
    # RuntimeError: the caller's event loop is closed, nobody is listening
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(queue.put_nowait, item)


class AsyncEngine(EngineClient):
    """Runs an LLMEngine in a daemon thread of this process."""

    def __init__(self, engine: LLMEngine) -> None:
        super().__init__(EngineInfo.of(engine))
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        # aborts (returned None) and stop strings (returned: output tokens the client got), in the order
        # callers made them; appended by callers, drained by the engine thread
        self._aborts: deque[tuple[str, int | None]] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="lumotree-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        return cls(LLMEngine(config))

    def _submit(self, req: GenerationRequest, target: _Target) -> None:
        with self._lock:
            self.engine.add_request(req)  # ValueError for a bad request reaches the caller
            self._targets[req.request_id] = target
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._aborts.append((request_id, None))
        self._wake.set()

    def stop(self, request_id: str, returned: int) -> None:
        self._aborts.append((request_id, returned))
        self._wake.set()

    def metrics(self) -> EngineMetrics:
        with self._lock:
            return self.engine.metrics()

    def shutdown(self) -> None:
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
            except BaseException as exc:  # an engine bug: fail every waiting caller, then stop
                log.exception("engine thread failed")
                with self._lock:
                    self._fail_all(exc)
                return
            self._deliver_events(events)
            if not busy:
                self._wake.wait()


class EngineProcess(EngineClient):
    """Runs an LLMEngine in a child process (spawned: CUDA-safe) that logs at `log_level` to this
    process's stderr; `start_timeout_s` bounds the wait for it to build the model. A configuration
    the engine refuses raises ValueError here, with the engine's message."""

    def __init__(
        self, config: EngineConfig, log_level: int = logging.INFO, start_timeout_s: float | None = None
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_engine_main, args=(config, child, log_level), name="lumotree-engine", daemon=True
        )
        self._process.start()
        child.close()
        if start_timeout_s is not None and not self._conn.poll(start_timeout_s):
            self._process.kill()
            raise TimeoutError(f"the engine process did not start within {start_timeout_s:.0f} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            self._process.join()
            raise RuntimeError(f"the engine process exited with code {self._process.exitcode}") from None
        if kind == "error":
            self._process.join()
            raise ValueError(payload)
        super().__init__(payload)
        self._closing = False
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._replies: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._reader = threading.Thread(target=self._read, name="lumotree-engine-events", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        """The engine process's id."""
        return self._process.pid

    def _send(self, *message: object) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _call(self, kind: str, *args: object) -> Any:
        """One request-reply exchange with the engine process (from a worker thread)."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine failed: {self._dead!r}")
        call, done, box = next(self._ids), threading.Event(), []
        self._replies[call] = (done, box)
        try:
            self._send(kind, call, *args)
            done.wait()
        finally:
            self._replies.pop(call, None)
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _submit(self, req: GenerationRequest, target: _Target) -> None:
        self._targets[req.request_id] = target  # events may come before the reply
        try:
            self._call("add", req)
        except BaseException:
            self._targets.pop(req.request_id, None)
            raise

    def abort(self, request_id: str) -> None:
        if self._dead is None:
            with contextlib.suppress(OSError):
                self._send("abort", request_id)

    def stop(self, request_id: str, returned: int) -> None:
        if self._dead is None:
            with contextlib.suppress(OSError):
                self._send("stop", request_id, returned)

    def metrics(self) -> EngineMetrics:
        return self._call("metrics")

    def shutdown(self) -> None:
        self._closing = True
        if self._process.is_alive():
            with contextlib.suppress(OSError):
                self._send("shutdown")
            self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()

    def _read(self) -> None:
        """Events and replies from the engine process, until it ends."""
        try:
            while True:
                kind, *payload = self._conn.recv()
                if kind == "events":
                    self._deliver_events(payload[0])
                elif kind == "reply":
                    call, ok, value = payload
                    waiting = self._replies.get(call)
                    if waiting is not None:
                        waiting[1].append((ok, value))
                        waiting[0].set()
                elif kind == "dead":
                    raise EngineDeadError(payload[0])
        except (EOFError, OSError, EngineDeadError) as exc:
            if self._closing:
                return
            if not isinstance(exc, EngineDeadError):
                self._process.join(5)
                exc = EngineDeadError(f"the engine process ended (exit code {self._process.exitcode})")
            log.error("%s", exc)
            self._fail_all(exc)
            for done, box in list(self._replies.values()):
                box.append((False, exc))
                done.set()


def _engine_main(config: EngineConfig, conn: Connection, log_level: int) -> None:
    """The engine process: build the engine, then step it while requests are unfinished, taking
    messages between steps (waiting for one when idle); events go back after every step. Ctrl-C
    is the server's to handle: it shuts the engine down (or its end closes the pipe)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        engine = LLMEngine(config)
    except (FileNotFoundError, ValueError) as exc:
        conn.send(("error", str(exc)))
        return
    except BaseException as exc:
        log.exception("the engine could not start")
        conn.send(("error", f"the engine could not start: {type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", EngineInfo.of(engine)))
    try:
        while True:
            while not engine.has_unfinished() or conn.poll():
                kind, *args = conn.recv()  # waits when idle; EOFError: the server is gone
                if kind == "shutdown":
                    return
                _handle(engine, conn, kind, args)
            events = engine.step()
            if events:
                conn.send(("events", events))
    except EOFError:
        return
    except BaseException as exc:  # an engine bug: the server fails every waiting request
        log.exception("engine loop failed")
        with contextlib.suppress(OSError):
            conn.send(("dead", f"{type(exc).__name__}: {exc}"))


def _handle(engine: LLMEngine, conn: Connection, kind: str, args: list[Any]) -> None:
    if kind == "abort":
        engine.abort(args[0])
        return
    if kind == "stop":
        engine.stop_request(args[0], args[1])
        return
    call = args[0]
    try:
        value = engine.metrics() if kind == "metrics" else engine.add_request(args[1])
        conn.send(("reply", call, True, value))
    except ValueError as exc:  # a bad request: the caller's error
        conn.send(("reply", call, False, ValueError(str(exc))))
