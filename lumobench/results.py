"""Run directories: `run.json` metadata, `requests.jsonl` rows flushed one by one, metric snapshots, logs.

Layout of `results/<run-id>/` (DESIGN §6):

    run.json                  RunMeta (schema_version, arm, endpoint, corpus/manifest hashes, host, ...)
    requests.jsonl            one RequestRow per (repetition, request), appended and flushed as it completes
                              (an interleaved replay writes one directory per arm, `interleaved_with`
                              in run.json naming the group's sibling directories)
    failed-attempts.jsonl     rows of failed attempts that `--resume` retried (kept for the record)
    metrics/run{R}.seg{S}.{before,after}.prom   raw /metrics text around each run segment
    server.log                output of the launched arm (when lumobench started the server)
    lumobench.lock            held (flock) by the one lumobench process writing the run; names it
    run.json.reserve          room for run.json's last update should the disk fill (until the run finished)

A run segment is one uninterrupted stretch of a repetition; resuming a repetition opens a new segment,
so counter deltas never straddle a server restart. Everything written passes through the run's
`Redactor`, so no secret of the arm (keys in its environment or command line) reaches the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import platform
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, model_validator

from lumobench import __version__
from lumobench.corpus import MAX_TOKENS
from lumobench.errors import LumobenchError
from lumobench.redact import Redactor
from lumobench.stream import MAX_TOKEN_COUNT

RUN_SCHEMA_VERSION = 1
#: most repetitions of one run (a report walks every (repetition, request) key)
MAX_RUNS = 1000
#: the label part of a run id: with the time stamp and a `-NN` suffix it fits a 255-byte file name
MAX_LABEL = 200
MAX_CLAIMS = 100
ROWS_FILE = "requests.jsonl"
FAILED_ATTEMPTS_FILE = "failed-attempts.jsonl"
RUN_FILE = "run.json"
SERVER_LOG = "server.log"
METRICS_DIR = "metrics"
LOCK_FILE = "lumobench.lock"
#: room kept for the last run.json update of a run whose disk fills up (removed once it finished)
RESERVE_FILE = "run.json.reserve"
RESERVE_BYTES = 8 * 1024


class RequestRow(BaseModel):
    """One request of one repetition. Times are `time.monotonic_ns()` of the replaying process (ns).

    `completion_tokens` (n in Eq. 5) is the server's usage count; `chunk_tokens` holds the cumulative
    completion-token count after each output chunk where the server reports it (vLLM's
    `continuous_usage_stats`, SGLang's `meta_info`), which shows servers that hold output back;
    `chunk_ns` the arrival time of each output chunk (rows written before it existed have None).
    """

    run_index: int = Field(ge=0, lt=MAX_RUNS)
    seq: int = Field(ge=0)  # position of the request within the replay order
    request_id: str
    status: Literal["completed", "failed"]
    error: str | None = None
    http_status: int | None = None
    prompt_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKEN_COUNT)
    completion_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKEN_COUNT)
    t_send_ns: int
    t_first_ns: int | None = None
    t_end_ns: int | None = None
    chunks: int = 0  # SSE data events received, excluding [DONE]
    output_chunks: int = 0  # events that carried content, reasoning, tool calls or new tokens
    chunk_tokens: list[int] | None = None
    chunk_ns: list[int] | None = None
    finish_reason: str | None = None
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    started_at: str  # wall-clock ISO time of t_send, for humans
    # interleaved replays only: this arm's place in the request's rotation (0 = sent first) and the CPU
    # seconds the other arms' servers used while this request was in flight (they should idle)
    slot: int | None = None
    others_cpu_s: float | None = None

    @model_validator(mode="after")
    def _times_in_order(self) -> RequestRow:
        # one monotonic clock: a row whose times go backwards was not written by a replay
        times = [t for t in (self.t_send_ns, self.t_first_ns, self.t_end_ns) if t is not None]
        if times != sorted(times):
            raise ValueError("its times go backwards (t_send_ns <= t_first_ns <= t_end_ns)")
        return self

    @property
    def decode_s(self) -> float | None:
        """t_end − t_first in seconds, or None if the stream never produced output."""
        if self.t_first_ns is None or self.t_end_ns is None:
            return None
        return (self.t_end_ns - self.t_first_ns) / 1e9

    @property
    def key(self) -> tuple[int, str]:
        return (self.run_index, self.request_id)


class ArmInfo(BaseModel):
    """The arm a run measured: its name, the resolved config and where it came from."""

    name: str
    config: dict[str, Any] = Field(default_factory=dict)
    config_sha256: str | None = None
    launched: bool = False  # lumobench started the server (vs. an existing --endpoint)


class Segment(BaseModel):
    run_index: int
    segment: int
    started_at: str
    finished_at: str | None = None
    outcome: Literal["running", "finished", "interrupted", "aborted"] = "running"


class RunMeta(BaseModel):
    """`run.json`: everything needed to interpret and resume a run (schema versioned)."""

    schema_version: int = RUN_SCHEMA_VERSION
    run_id: str
    created: str
    lumobench_version: str = __version__
    argv: list[str] = Field(default_factory=list)
    arm: ArmInfo
    endpoint: str
    api: Literal["chat", "generate"] = "chat"
    model: str | None = None  # served model name sent in requests
    engine_version: str | None = None
    # what the engine reports at /version beside its version (LumoTree: drafter, kernels, the native
    # forward's ISA path, the tree shape it chose for this machine, rows)
    engine_config: dict[str, Any] = Field(default_factory=dict)
    corpus: str
    corpus_sha256: str
    manifest: str | None = None
    manifest_sha256: str | None = None
    request_ids: list[str]  # replay order
    record_sha256: dict[str, str] = Field(default_factory=dict)  # id -> canonical-JSON sha256
    deterministic_ids: list[str] = Field(default_factory=list)  # greedy or seeded: outputs must repeat
    runs: int = Field(ge=1, le=MAX_RUNS)
    concurrency: int = Field(ge=1, default=1)
    boot_per_run: bool = False  # a launched arm was started afresh for every repetition
    # interleaved replay: run ids of every arm of the group (sibling directories), in rotation order;
    # empty for a run measured on its own
    interleaved_with: list[str] = Field(default_factory=list)
    api_key_env: str | None = None  # the environment variable holding the API key (never the key)
    stream_options: dict[str, Any] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    max_tokens_cap: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS
    )  # --max-tokens-cap (kept for --resume)
    greedy: bool = False  # --greedy: every request was sent as greedy decoding (kept for --resume)
    host: dict[str, Any] = Field(default_factory=dict)
    segments: list[Segment] = Field(default_factory=list)
    status: Literal["running", "finished", "interrupted", "aborted"] = "running"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


def new_run_id(label: str) -> str:
    """`YYYYmmdd-HHMMSS-<label>` in UTC; sortable and readable. The label keeps ASCII letters, digits and
    `-_.`; a long one is cut to fit a file name, with a digest of the whole so long labels stay apart."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in label)
    if len(safe) > MAX_LABEL:
        safe = safe[: MAX_LABEL - 9] + "-" + hashlib.sha256(label.encode(errors="replace")).hexdigest()[:8]
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{safe}"


def claim_run_path(path: Path) -> Path:
    """Create a new, empty run directory at `path`, or at `path-2`, `path-3`, ... when that name is
    taken (two runs started in the same second): never an existing directory, and never through a
    symlink planted at the name (mkdir does not follow one: the name counts as taken)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or exc
        raise LumobenchError(f"cannot create the results folder {path.parent}: {why}") from None
    for k in range(1, MAX_CLAIMS + 1):
        candidate = path if k == 1 else path.with_name(f"{path.name}-{k}")
        try:
            os.mkdir(candidate)  # atomic: of two processes claiming one name, one gets it
        except FileExistsError:
            continue
        except OSError as exc:
            raise LumobenchError(f"cannot create run directory {candidate}: {exc.strerror or exc}") from None
        return candidate
    raise LumobenchError(f"cannot create run directory {path}: {MAX_CLAIMS} runs of that name exist")


RowT = TypeVar("RowT", bound=BaseModel)
ModelT = TypeVar("ModelT", bound=BaseModel)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteFailed(LumobenchError):
    """A results file could not be written (a full disk, a read-only folder); what was written before
    stays readable."""


def _write_failed(path: Path, exc: OSError) -> WriteFailed:
    return WriteFailed(f"cannot write {path}: {exc.strerror or exc}")


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` by atomic replace, durably: the file is fsync'd before the rename and the directory
    after it, so a crash or power loss leaves the old file or the new one, never a torn or empty one.
    Raises `WriteFailed` (the old file kept) when it cannot be written."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _write_failed(path, exc) from None
        raise


def write_json_atomic(path: Path, model: BaseModel) -> None:
    """Write `model` as indented JSON with `write_text_atomic`."""
    write_text_atomic(path, model.model_dump_json(indent=2) + "\n")


def append_jsonl(path: Path, row: BaseModel) -> None:
    """Append one JSON line with fsync, so a crash loses nothing already written (the first line also
    fsyncs the directory, which holds the new file's name). A write that fails part-way (a full disk)
    is cut back off, so no torn line is left for later lines to follow; raises `WriteFailed`."""
    data = (row.model_dump_json() + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _write_failed(path, exc) from None
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        if start == 0:
            _fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise _write_failed(path, exc) from None
    finally:
        os.close(fd)


def read_jsonl(path: Path, model: type[RowT]) -> list[RowT]:
    """All rows of a JSONL file ([] if absent); a torn last line (crash mid-write) is ignored, a corrupt
    earlier line (bad JSON, wrong fields, invalid UTF-8) is an error."""
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LumobenchError(f"cannot read {path}: {exc.strerror or exc}") from None
    rows: list[RowT] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(model.model_validate_json(line))
        except ValidationError as exc:
            if i == len(lines) - 1:
                break
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            why = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
            raise LumobenchError(
                f"{path}: line {i + 1} is not a valid {model.__name__} ({where + ': ' if where else ''}{why})"
            ) from None
    return rows


class RunDir:
    """A run directory on disk; rows are appended with flush + fsync so a crash loses nothing.

    `redactor` masks the secrets of the run's arm in everything written here; `lock` makes this process
    the run's only writer.
    """

    def __init__(self, path: Path, redactor: Redactor | None = None) -> None:
        self.path = path
        self.redactor = redactor or Redactor()
        self._lock_fd: int | None = None

    @classmethod
    def create(cls, path: Path, meta: RunMeta, redactor: Redactor | None = None) -> RunDir:
        """A new run directory at `path` (or beside it, `claim_run_path`); `meta.run_id` becomes its name."""
        path = claim_run_path(path)
        meta.run_id = path.name
        run = cls(path, redactor)
        run.lock()
        run.write_meta(meta)
        return run

    @classmethod
    def open(cls, path: Path) -> RunDir:
        run = cls(path)
        if not (path / RUN_FILE).is_file():
            raise LumobenchError(f"{path} is not a lumobench run directory (no {RUN_FILE})")
        return run

    def lock(self) -> None:
        """Hold an exclusive lock on the run until this process exits (kill -9 included); refuse when
        another process holds it, naming that process."""
        if self._lock_fd is not None:
            return
        try:  # O_NOFOLLOW: a symlink planted at the lock's name is refused, not written through
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise LumobenchError(
                f"cannot write to run directory {self.path}: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "a process that did not say"
            os.close(fd)
            raise LumobenchError(
                f"run directory {self.path} is in use by another lumobench process ({holder}); "
                "wait for it to finish or stop it"
            ) from None
        command = " ".join(["lumobench", *self.redactor.argv(sys.argv[1:])])
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}: {command[:300]}\n".encode(errors="replace"))
        except OSError as exc:
            os.close(fd)
            raise _write_failed(self.path / LOCK_FILE, exc) from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- metadata ---------------------------------------------------------------------------------
    def read_meta(self) -> RunMeta:
        try:
            meta = RunMeta.model_validate_json((self.path / RUN_FILE).read_bytes())
        except OSError as exc:
            raise LumobenchError(f"cannot read {self.path / RUN_FILE}: {exc.strerror or exc}") from None
        except ValidationError as exc:
            raise LumobenchError(
                f"{self.path / RUN_FILE} is not valid run metadata: {exc.errors()[0]['msg']}"
            ) from None
        if meta.schema_version != RUN_SCHEMA_VERSION:
            raise LumobenchError(
                f"{self.path} has run schema {meta.schema_version}; this lumobench reads {RUN_SCHEMA_VERSION}"
            )
        return meta

    def write_meta(self, meta: RunMeta) -> None:
        """Atomic replace, so a crash never leaves a half-written run.json; secrets masked. A run keeps a
        reserve file beside it while it is not finished: when the disk is full, the reserve is given up
        so that run.json can still say how the run ended."""
        reserve = self.path / RESERVE_FILE
        try:
            write_json_atomic(self.path / RUN_FILE, self._redacted(meta))
        except WriteFailed:
            if not reserve.exists():
                raise
            reserve.unlink()
            write_json_atomic(self.path / RUN_FILE, self._redacted(meta))
            return
        if meta.status == "finished":
            reserve.unlink(missing_ok=True)
        elif not reserve.exists():
            try:
                reserve.write_bytes(bytes(max(RESERVE_BYTES, 2 * (self.path / RUN_FILE).stat().st_size)))
            except OSError:  # no room for it: nothing to give up later
                reserve.unlink(missing_ok=True)

    def _redacted(self, model: ModelT) -> ModelT:
        if not self.redactor.secrets:
            return model
        return type(model).model_validate(self.redactor.value(model.model_dump(mode="json")))

    # -- segments -------------------------------------------------------------------------------------
    @asynccontextmanager
    async def segment(
        self, meta: RunMeta, run_index: int, scrape: Callable[[], Awaitable[str | None]]
    ) -> AsyncIterator[Segment]:
        """One run segment of repetition `run_index`: opened in run.json (the run "running") with a
        /metrics snapshot before (`scrape`: the server's /metrics text, None for none). On exit: the
        snapshot after and "finished"; "interrupted" when cancelled (Ctrl-C); "aborted" on an error or
        when the caller already closed it so (`close_segment`, a server gone mid-repetition)."""
        segment = Segment(
            run_index=run_index,
            segment=1 + max((s.segment for s in meta.segments if s.run_index == run_index), default=-1),
            started_at=now_iso(),
        )
        meta.segments.append(segment)
        meta.status = "running"
        self.write_meta(meta)
        if (text := await scrape()) is not None:
            self.write_metrics(run_index, segment.segment, "before", text)
        try:
            yield segment
        except (asyncio.CancelledError, KeyboardInterrupt):
            self.close_segment(meta, segment, "interrupted")
            raise
        except BaseException:  # a full disk, a bug: still leave a run that --resume can continue
            with contextlib.suppress(WriteFailed):
                self.close_segment(meta, segment, "aborted")
            raise
        if segment.outcome == "running":
            if (text := await scrape()) is not None:
                self.write_metrics(run_index, segment.segment, "after", text)
            self.close_segment(meta, segment, "finished")

    def close_segment(
        self, meta: RunMeta, segment: Segment, outcome: Literal["finished", "interrupted", "aborted"]
    ) -> None:
        """End `segment` with `outcome` in run.json (an interrupted or aborted segment marks the run so)."""
        segment.outcome, segment.finished_at = outcome, now_iso()
        if outcome != "finished":
            meta.status = outcome
        self.write_meta(meta)

    # -- rows -------------------------------------------------------------------------------------
    @property
    def rows_path(self) -> Path:
        return self.path / ROWS_FILE

    def append_row(self, row: RequestRow) -> None:
        append_jsonl(self.rows_path, self._redacted(row))

    def read_rows(self) -> list[RequestRow]:
        """All rows; a torn last line (crash mid-write) is ignored, a corrupt earlier line is an error."""
        return read_jsonl(self.rows_path, RequestRow)

    def prepare_resume(self) -> list[RequestRow]:
        """Keep one completed row per key; move failed rows to failed-attempts.jsonl so they are retried.

        Rewrites requests.jsonl atomically; returns the rows kept.
        """
        kept: dict[tuple[int, str], RequestRow] = {}
        failed: list[RequestRow] = []
        for row in self.read_rows():
            if row.status == "completed" and row.key not in kept:
                kept[row.key] = row
            elif row.status == "failed":
                failed.append(row)
        for row in failed:
            append_jsonl(self.path / FAILED_ATTEMPTS_FILE, row)
        write_text_atomic(self.rows_path, "".join(r.model_dump_json() + "\n" for r in kept.values()))
        return list(kept.values())

    # -- metrics and logs -------------------------------------------------------------------------
    def metrics_path(self, run_index: int, segment: int, when: Literal["before", "after"]) -> Path:
        return self.path / METRICS_DIR / f"run{run_index}.seg{segment}.{when}.prom"

    def write_metrics(
        self, run_index: int, segment: int, when: Literal["before", "after"], text: str
    ) -> None:
        path = self.metrics_path(run_index, segment, when)
        try:
            path.parent.mkdir(exist_ok=True)
        except OSError as exc:
            raise _write_failed(path.parent, exc) from None
        write_text_atomic(path, self.redactor.text(text))

    def metric_segments(self) -> list[tuple[int, int, str, str]]:
        """(run_index, segment, before_text, after_text) for every segment with both snapshots."""
        out = []
        for before in sorted((self.path / METRICS_DIR).glob("run*.seg*.before.prom")):
            after = before.with_name(before.name.replace(".before.", ".after."))
            if after.exists():
                run_part, seg_part = before.name.split(".")[:2]
                texts = [p.read_bytes().decode(errors="replace") for p in (before, after)]
                out.append((int(run_part[3:]), int(seg_part[3:]), *texts))
        return out

    @property
    def server_log(self) -> Path:
        return self.path / SERVER_LOG


def create_run_dirs(out: Path, runs: Sequence[tuple[RunMeta, Redactor]]) -> list[RunDir]:
    """Create (and lock) the run directories `out/<run id>` of new runs, last of all: every check that
    can refuse the runs is done."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise LumobenchError(f"--out {out} is not a directory") from None
    except OSError as exc:  # e.g. a component longer than the file system allows
        raise LumobenchError(f"cannot create the results folder {out}: {exc.strerror or exc}") from None
    return [RunDir.create(out / meta.run_id, meta, redactor) for meta, redactor in runs]


def missing_keys(meta: RunMeta, rows: Iterable[RequestRow]) -> list[tuple[int, str]]:
    """Keys of the run (repetition, request) that have no row yet, in replay order."""
    have = {r.key for r in rows}
    return [(r, rid) for r in range(meta.runs) for rid in meta.request_ids if (r, rid) not in have]
