"""The agent driver (`lumobench agent`): for each task and run, prepare the repository at the base
commit, run Qwen Code against the arm through the counting (and optionally recording) proxy, collect
the patch, and write the row, the predictions and the task table as the task ends.

The arm is either launched from its TOML (and stopped at the end) or an already-running `--endpoint`.
A run directory can be resumed: attempts already recorded as the agent's work are kept, the rest run.

Before the run starts, every task's repository mirror is found (or cloned, `find_mirrors`) and its
base commit looked up there: a task without one is an "error" row naming why (the others run); when
no task can start the command stops with that one line. Once the arm answers, its context window is
read (`/v1/models` `max_model_len`): Qwen Code is told it (so it compresses its history in time)
and the proxy fits each request's `max_tokens` into it (`RecordingProxy(fit_context=True)`); an arm
that cannot hold Qwen Code's first prompt, or whose context `--max-tokens` cannot fit without
`/tokenize`, stops the run before the first attempt.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lumobench.agent.counters import counter_deltas, snapshot
from lumobench.agent.paths import CACHE_DIR
from lumobench.agent.process import ProcessOutcome
from lumobench.agent.qwen_code import (
    DEFAULT_VERSION,
    AgentEndpoint,
    AgentReport,
    ensure_qwen_code,
    run_qwen_code,
)
from lumobench.agent.repos import (
    collect_patch,
    ensure_mirror,
    missing_commits,
    prepare_workspace,
    uncommitted_changes,
)
from lumobench.agent.rundir import ATTEMPTED, REQUESTS_LOG, AgentRunDir, AgentRunMeta, TaskRow, TaskStatus
from lumobench.agent.table import write_task_table
from lumobench.agent.tasks import Task, resolve_tasks
from lumobench.arms import check_launchable, load_arm, resolve_arm
from lumobench.errors import LumobenchError
from lumobench.launch import ArmServer, log_tail, start_arm
from lumobench.probe import EndpointInfo, ProbeError, call_sync, probe_endpoint
from lumobench.record import BackgroundProxy, RecordingProxy
from lumobench.results import ArmInfo, host_info, new_run_id, now_iso

#: The paper's agent sampling (§VII-A: presence penalty 1.0 on every arm; §VI: temperature 0.6,
#: top-p 0.95, top-k 20); `--max-tokens` adds the response cap.
PAPER_SAMPLING: dict[str, float | int] = {
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "presence_penalty": 1.0,
}
#: Qwen Code 0.15.10's first request (system prompt + ~15 tool definitions + the task): 20,051 tokens
#: with lumo-tiny-coder's tokenizer (measured); other tokenizers land near it.
FIRST_PROMPT_TOKENS = 20_000
#: the context probe's /tokenize of a one-word chat (the arm tokenizes it in milliseconds)
TOKENIZE_DEADLINE_S = 30.0


@dataclass(frozen=True)
class AgentArgs:
    """`lumobench agent`'s options as given (None: not given), carried from the command line to the
    driver as one value (`prepare`). With `resume` the run's own tasks, arm and settings are used;
    `repos`, `clone` and `keep_workdirs` given again override the run's."""

    tasks: tuple[str, ...] = ()  # list names, task files, instance ids
    arm: str | None = None
    endpoint: str | None = None
    model: str | None = None
    runs: int = 1
    budget_s: float = 9000.0
    max_tokens: int = 24000
    sampling: tuple[str, ...] = ()  # KEY=VALUE overrides of `PAPER_SAMPLING`
    repos: Path | None = None
    clone: bool | None = None
    record: Path | None = None
    out: Path = Path("results")
    resume: Path | None = None
    qwen_code_version: str = DEFAULT_VERSION
    keep_workdirs: bool | None = None


def sampling_with(pairs: Sequence[str]) -> dict[str, float | int]:
    """The paper's agent sampling with the KEY=VALUE overrides of `--sampling`."""
    sampling: dict[str, float | int] = dict(PAPER_SAMPLING)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LumobenchError(f"--sampling wants KEY=VALUE, got {pair!r}")
        try:
            sampling[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise LumobenchError(f"--sampling {key}: {value!r} is not a number") from None
    return sampling


@dataclass
class AgentSettings:
    """What every attempt of a run shares."""

    runs: int = 1
    budget_s: float = 9000.0
    max_tokens: int = 24000
    sampling: dict[str, float | int] = field(default_factory=lambda: dict(PAPER_SAMPLING))
    qwen_code_version: str = "0.15.10"
    repos_dir: Path = CACHE_DIR / "repos"
    allow_clone: bool = True
    keep_workdirs: bool = False


def resume_settings(meta: AgentRunMeta, args: AgentArgs) -> AgentSettings:
    """The settings a run was started with (run.json); `--repos`, `--clone/--no-clone` and
    `--keep-workdirs` given again on `--resume` override theirs (None: not given)."""
    return AgentSettings(
        runs=meta.runs,
        budget_s=meta.budget_s,
        max_tokens=meta.max_tokens,
        sampling=dict(meta.sampling),
        qwen_code_version=meta.agent.split("@", 1)[1],
        repos_dir=args.repos.absolute() if args.repos is not None else Path(meta.repos_dir),
        allow_clone=meta.allow_clone if args.clone is None else args.clone,
        keep_workdirs=meta.keep_workdirs if args.keep_workdirs is None else args.keep_workdirs,
    )


def new_settings(args: AgentArgs) -> AgentSettings:
    """The settings of a new run, from its options."""
    return AgentSettings(
        runs=args.runs,
        budget_s=args.budget_s,
        max_tokens=args.max_tokens,
        sampling=sampling_with(args.sampling),
        qwen_code_version=args.qwen_code_version,
        repos_dir=(args.repos or CACHE_DIR / "repos").absolute(),
        allow_clone=True if args.clone is None else args.clone,
        keep_workdirs=bool(args.keep_workdirs),
    )


@dataclass(frozen=True)
class Serving:
    """Where the agent's requests go (`base_url` without /v1), what the server said about itself, and
    the launched arm (None for an existing endpoint)."""

    arm: ArmInfo
    base_url: str
    model: str
    info: EndpointInfo
    server: ArmServer | None
    extra_body: dict[str, Any]


@dataclass(frozen=True)
class ArmContext:
    """The arm's context window (`max_model_len` of /v1/models, as vLLM and LumoTree list it; None when
    it says nothing) and whether its /tokenize answers chat requests (then the proxy can fit each
    request's max_tokens into the context)."""

    max_model_len: int | None
    can_fit: bool


def probe_context(served: Serving) -> ArmContext:
    """The context window from the arm's models list, and whether its /tokenize answers (tried once)."""
    try:
        probe = {"model": served.model, "messages": [{"role": "user", "content": "hi"}]}
        answer = call_sync("POST", served.base_url + "/tokenize", TOKENIZE_DEADLINE_S, json=probe)
        can_fit = isinstance(answer.json().get("count"), int)
    except (ProbeError, ValueError, AttributeError):
        can_fit = False
    return ArmContext(served.info.max_model_len(served.model), can_fit)


def check_context(context: ArmContext, max_tokens: int, arm: str) -> None:
    """Fail fast, in one line, when no attempt could get an answer from the arm."""
    room = None if context.max_model_len is None else context.max_model_len - FIRST_PROMPT_TOKENS
    if room is None:
        return
    if room <= 0:
        raise LumobenchError(
            f"arm {arm} has a context of {context.max_model_len} tokens: Qwen Code's first prompt alone "
            f"is ~{FIRST_PROMPT_TOKENS:,} tokens; serve it with a longer context (e.g. --max-model-len 32768)"
        )
    if not context.can_fit and max_tokens > room:
        raise LumobenchError(
            f"--max-tokens {max_tokens} and Qwen Code's ~{FIRST_PROMPT_TOKENS:,}-token first prompt exceed "
            f"arm {arm}'s context of {context.max_model_len} tokens, and the arm has no /tokenize to fit "
            f"each request: pass --max-tokens {room} or less"
        )


def running_endpoint(endpoint: str, model: str | None) -> Serving:
    """An already-running server (its base URL without /v1) and the model to ask for: `model`, else
    the first one it lists."""
    root = endpoint.rstrip("/").removesuffix("/v1")  # /v1/... and /metrics both hang off the root
    try:
        info = probe_endpoint(root)
    except LumobenchError:
        info = EndpointInfo()
    if not (model := model or info.model):
        raise LumobenchError(
            f"cannot read the served model from {root}/v1/models (endpoint down? pass --model)"
        )
    return Serving(ArmInfo(name="endpoint"), root, model, info, None, {})


@dataclass(frozen=True)
class AgentJob:
    """An agent run ready to go: its directory, its tasks and settings, where its requests go (an arm
    to launch, or a running endpoint, and the model to ask for), and each pending task's mirror."""

    run: AgentRunDir
    tasks: list[Task]
    settings: AgentSettings
    arm: str | None
    endpoint: str | None
    model: str | None
    mirrors: dict[str, Path | str]


class AgentUI(Protocol):
    """What `execute` tells the person watching."""

    def note(self, text: str) -> None: ...
    def attempt(self, i: int, n: int, task: Task, run_index: int) -> Callable[[float, int], None]: ...
    def done(self, row: TaskRow) -> None: ...


@contextmanager
def serving(job: AgentJob) -> Iterator[Serving]:
    """Launch the job's arm (until the block ends) or use its running endpoint; resolve the model."""
    if job.endpoint is not None:
        yield running_endpoint(job.endpoint, job.model)
        return
    if job.arm is None:
        raise LumobenchError("give an arm (--arm NAME or FILE.toml) or a running --endpoint URL")
    config, source = load_arm(job.arm)
    resolved = resolve_arm(config, source)
    check_launchable(resolved)
    info = ArmInfo(
        name=resolved.name, config=config.model_dump(), config_sha256=resolved.source_sha256, launched=True
    )
    server, served = start_arm(resolved, job.run.path / "server.log")
    try:
        yield Serving(
            info,
            resolved.base_url,
            job.model or served.model or "",
            served,
            server,
            dict(config.request.extra_body),
        )
    finally:
        server.stop()


_ERROR_LINE = re.compile(r"\w*(Error|Exception)\b|\bE[A-Z]{3,}\b")


def agent_error_line(stderr: Path) -> str:
    """The line of the agent's stderr that says what went wrong: its last error message (Node's
    `Error: ENOENT: ...`), never a stack frame (`at ...`); '' for an empty stderr."""
    lines = [line.strip() for line in log_tail(stderr, lines=200).splitlines()]
    lines = [line for line in lines if line and not line.startswith("at ")]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    return (errors or lines or [""])[-1][:400]


def classify(
    outcome: ProcessOutcome, report: AgentReport, stderr: Path, requests: int
) -> tuple[TaskStatus, str | None]:
    """The attempt's status from how the process ended, what the agent reported and how many of its
    model requests the arm answered. An agent that dies before its first model request never
    worked on the task: that is an "error" (retried by --resume, not a prediction), not a crash."""
    if outcome.timed_out:
        return "timeout", f"wall budget reached after {outcome.wall_s:.0f} s"
    if report.api_errors:
        return "api-error", report.api_errors[-1][:500]
    if outcome.exit_code != 0 or report.result is None:
        why = agent_error_line(stderr)
        detail = f"exit code {outcome.exit_code}"
        if requests == 0 and report.requests == 0:
            detail += " before its first model request"
            return "error", f"Qwen Code {detail}" + (f": {why}" if why else "")
        return "agent-crash", detail + (f": {why}" if why else "")
    return "completed", None


def _fresh_log_dir(path: Path) -> Path:
    """An empty log folder; logs of an earlier attempt at the same key move to `<name>.attempt<k>`."""
    if path.exists():
        k = 1
        while path.with_name(f"{path.name}.attempt{k}").exists():
            k += 1
        path.rename(path.with_name(f"{path.name}.attempt{k}"))
    path.mkdir(parents=True)
    return path


@dataclass
class AgentRunner:
    """Runs the attempts of one agent run directory against one serving endpoint."""

    run: AgentRunDir
    meta: AgentRunMeta
    settings: AgentSettings
    cli: Path
    proxy: RecordingProxy
    proxy_url: str
    arm_url: str
    sampling: dict[str, Any]
    note: Callable[[str], None]
    mirrors: dict[str, Path | str]  # instance id -> its mirror, or why it has none
    context_window: int | None = None

    def _metrics(self, log_dir: Path, when: str) -> str | None:
        text = snapshot(self.arm_url)
        if text is not None:
            (log_dir / f"metrics.{when}.prom").write_text(text)
        return text

    def attempt(
        self, task: Task, run_index: int, tick: Callable[[float, int], None] | None = None
    ) -> TaskRow:
        """One attempt at `task`; never raises for task-level failures (they become the row's status).
        `tick(elapsed_s, requests_so_far)` is called about once a second while the agent runs."""
        log_dir = _fresh_log_dir(self.run.log_dir(run_index, task.instance_id))
        workdir = self.run.path / "work" / log_dir.name
        started = now_iso()

        def row(status: TaskStatus, error: str | None, **fields: Any) -> TaskRow:
            return TaskRow(
                run_index=run_index,
                instance_id=task.instance_id,
                status=status,
                error=error,
                log_dir=str(log_dir.relative_to(self.run.path)),
                started_at=started,
                finished_at=now_iso(),
                **fields,
            )

        notes: list[str] = []
        mirror = self.mirrors[task.instance_id]
        if isinstance(mirror, str):
            return row("error", mirror)
        try:
            if changed := uncommitted_changes(mirror):
                notes.append(
                    f"mirror {mirror} has uncommitted changes ({len(changed)} paths); the task ran on a "
                    f"clean clone at {task.base_commit[:12]} and left them untouched"
                )
                self.note(f"note: {notes[-1]}")
            prepare_workspace(mirror, task.base_commit, workdir)
        except LumobenchError as exc:
            return row("error", str(exc), notes=notes)
        self.proxy.task, self.proxy.run = task.instance_id, run_index + 1
        self.proxy.request_log = log_dir / REQUESTS_LOG
        self.proxy.take_counts()
        recorded_before = self.proxy.recorded
        metrics_before = self._metrics(log_dir, "before")
        on_tick = None if tick is None else (lambda elapsed: tick(elapsed, self.proxy.peek_counts().requests))
        try:
            outcome, report = run_qwen_code(
                self.cli,
                workdir,
                task.problem_statement,
                AgentEndpoint(self.proxy_url, self.meta.model),
                self.sampling,
                log_dir,
                self.settings.budget_s,
                on_tick=on_tick,
                context_window=self.context_window,
            )
            counts = self.proxy.take_counts()
            arm_counters = counter_deltas(metrics_before, self._metrics(log_dir, "after"))
            status, error = classify(outcome, report, log_dir / "agent.stderr", counts.requests)
            try:
                patch = collect_patch(workdir, task.base_commit)
            except LumobenchError as exc:
                patch, error = "", f"{error + '; ' if error else ''}patch collection failed: {exc}"
            (log_dir / "patch.diff").write_text(patch)
        finally:
            if not self.settings.keep_workdirs:
                shutil.rmtree(workdir, ignore_errors=True)
        return row(
            status,
            error,
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            agent_s=outcome.wall_s,
            requests=counts.requests,
            output_tokens=counts.completion_tokens,
            responses_without_usage=counts.without_usage,
            capped_requests=counts.capped,
            counter_requests=arm_counters.requests,
            counter_output_tokens=arm_counters.output_tokens,
            accepted_per_event=arm_counters.accepted_per_event,
            agent_requests=report.requests,
            agent_output_tokens=report.output_tokens,
            tool_calls=report.tool_calls,
            recorded=self.proxy.recorded - recorded_before if self.proxy.writer else None,
            leftover_processes=outcome.leftovers_killed,
            notes=notes,
            patch=patch,
        )


def pending(meta: AgentRunMeta, run: AgentRunDir, tasks: list[Task]) -> list[tuple[int, Task]]:
    """(run index, task) pairs without a recorded attempt of the agent's own (status in ATTEMPTED)."""
    rows = run.latest_rows()
    return [
        (r, t)
        for r in range(meta.runs)
        for t in tasks
        if (r, t.instance_id) not in rows or rows[(r, t.instance_id)].status not in ATTEMPTED
    ]


def new_run(
    args: AgentArgs, tasks: list[Task], task_specs: list[str], settings: AgentSettings
) -> AgentRunDir:
    """Create the run directory (`args.out/<run-id>`) with its run.json; serving fields are filled at
    start."""
    arm, endpoint, record = args.arm, args.endpoint, args.record
    label = Path(arm).stem if arm else "endpoint"
    run_id = new_run_id(f"agent-{label}")
    agent = f"qwen-code@{settings.qwen_code_version}"
    meta = AgentRunMeta(
        run_id=run_id,
        created=now_iso(),
        argv=sys.argv,
        arm=ArmInfo(name=label),
        arm_spec=str(Path(arm).resolve()) if arm and arm.endswith(".toml") else arm,
        endpoint=endpoint or "",
        model="",
        agent=agent,
        model_name_or_path=f"{agent.replace('@', '-')}__{label}",
        tasks=task_specs,
        task_ids=[t.instance_id for t in tasks],
        runs=settings.runs,
        budget_s=settings.budget_s,
        max_tokens=settings.max_tokens,
        sampling=settings.sampling,
        repos_dir=str(settings.repos_dir.absolute()),
        allow_clone=settings.allow_clone,
        keep_workdirs=settings.keep_workdirs,
        record=str(record.resolve()) if record else None,
        host=host_info(),
    )
    # absolute: Qwen Code runs inside the task's clone, where a relative HOME would point elsewhere
    return AgentRunDir.create(args.out.absolute() / run_id, meta)


def find_mirrors(todo: list[tuple[int, Task]], settings: AgentSettings) -> dict[str, Path | str]:
    """The mirror of every pending task, keyed by instance id (each repository found or cloned once, if
    allowed), or why there is none: no mirror of its repository, or its base commit not in the mirror.
    Raises the first reason when no attempt could start."""
    repos: dict[str, Path | str] = {}
    for _, task in todo:
        if task.repo not in repos:
            try:
                repos[task.repo] = ensure_mirror(task.repo, settings.repos_dir, settings.allow_clone)
            except LumobenchError as exc:
                repos[task.repo] = str(exc)
    tasks = {task.instance_id: task for _, task in todo}
    mirrors: dict[str, Path | str] = {i: repos[t.repo] for i, t in tasks.items()}
    for mirror in {m for m in repos.values() if isinstance(m, Path)}:
        ids = [i for i, m in mirrors.items() if m == mirror]
        for commit in missing_commits(mirror, sorted({tasks[i].base_commit for i in ids})):
            for i in ids:
                if tasks[i].base_commit == commit:
                    mirrors[i] = f"base commit {commit[:12]} of {i} is not in mirror {mirror}"
    reasons = [m for m in mirrors.values() if isinstance(m, str)]
    if mirrors and len(reasons) == len(mirrors):
        raise LumobenchError(reasons[0])
    return mirrors


def prepare(args: AgentArgs) -> AgentJob:
    """The agent run `args` ask for: a new run directory, or the one to resume with its own tasks, arm
    and settings; every pending task's mirror found (or cloned) first."""
    if args.resume is not None:
        run = AgentRunDir.open(args.resume)
        meta = run.read_meta()
        tasks = resolve_tasks(meta.tasks)
        if [t.instance_id for t in tasks] != meta.task_ids:
            raise LumobenchError(f"the tasks {meta.tasks} no longer resolve to the run's task ids")
        settings = resume_settings(meta, args)
        mirrors = find_mirrors(pending(meta, run, tasks), settings)
        arm, endpoint = args.arm, args.endpoint
        if arm is None and endpoint is None:
            arm, endpoint = (meta.arm_spec, None) if meta.arm_spec else (None, meta.endpoint)
        model = args.model or (meta.model if endpoint else None)
        return AgentJob(run, tasks, settings, arm, endpoint, model, mirrors)
    if not args.tasks:
        raise LumobenchError("give --tasks (a list name such as astropy, a task file, or instance ids)")
    if (args.arm is None) == (args.endpoint is None):
        raise LumobenchError("give exactly one of --arm and --endpoint")
    settings = new_settings(args)
    # task files are kept as absolute paths so --resume works from any folder
    specs = [str(Path(s).resolve()) if Path(s).is_file() else s for s in args.tasks]
    tasks = resolve_tasks(specs)
    mirrors = find_mirrors([(r, t) for r in range(args.runs) for t in tasks], settings)
    run = new_run(args, tasks, specs, settings)
    return AgentJob(run, tasks, settings, args.arm, args.endpoint, args.model, mirrors)


def execute(job: AgentJob, ui: AgentUI) -> AgentRunMeta:
    """Run every pending attempt of the job.

    `ui.attempt(i, n, task, run_index)` returns the tick callback (elapsed seconds, requests so far)
    of that attempt; `ui.done(row)` sees each row once written. Returns the final metadata; run.json
    says finished, interrupted (Ctrl-C, SIGTERM, SIGHUP; re-raised) or aborted (arm failure, re-raised
    as `LumobenchError`).
    """
    run, tasks, settings = job.run, job.tasks, job.settings
    meta = run.read_meta()
    todo = pending(meta, run, tasks)
    try:
        cli = ensure_qwen_code(settings.qwen_code_version)
        with serving(job) as served:
            context = probe_context(served)
            check_context(context, settings.max_tokens, served.arm.name)
            meta = meta.model_copy(
                update={
                    "arm": served.arm,
                    "endpoint": served.base_url,
                    "model": served.model,
                    "status": "running",
                    "error": None,
                }
            )
            run.write_meta(meta)
            sampling = {**served.extra_body, **settings.sampling, "max_tokens": settings.max_tokens}
            record = Path(meta.record) if meta.record else None
            proxy = RecordingProxy(served.base_url, record, fit_context=context.can_fit)
            with BackgroundProxy(proxy) as background:
                runner = AgentRunner(
                    run=run,
                    meta=meta,
                    settings=settings,
                    cli=cli,
                    proxy=proxy,
                    proxy_url=background.url,
                    arm_url=served.base_url,
                    sampling=sampling,
                    note=ui.note,
                    mirrors=job.mirrors,
                    context_window=context.max_model_len,
                )
                for i, (run_index, task) in enumerate(todo):
                    row = runner.attempt(task, run_index, ui.attempt(i, len(todo), task, run_index))
                    run.append_row(row)
                    run.write_predictions(meta)
                    write_task_table(run)
                    ui.done(row)
                    if served.server is not None and (code := served.server.exit_code()) is not None:
                        raise LumobenchError(
                            f"arm {served.arm.name} exited (code {code}) during the run; "
                            f"see {run.path / 'server.log'}"
                        )
        meta = meta.model_copy(update={"status": "finished"})
    except KeyboardInterrupt:
        meta = meta.model_copy(update={"status": "interrupted"})
        raise
    except LumobenchError as exc:
        meta = meta.model_copy(update={"status": "aborted", "error": str(exc)})
        raise
    finally:
        run.write_meta(meta)
        run.write_predictions(meta)
        write_task_table(run)
    return meta
