"""Typer commands of the agent workflow: `agent`, `evaluate`, `record` and `corpus select`."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from aiohttp import web
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lumobench.agent import evaluate as ev
from lumobench.agent.driver import AgentArgs, AgentJob, execute, prepare
from lumobench.agent.local_eval import evaluate_locally
from lumobench.agent.paths import CACHE_DIR
from lumobench.agent.qwen_code import DEFAULT_VERSION
from lumobench.agent.rundir import ATTEMPTED, RUN_FILE, AgentRunDir, AgentRunMeta, TaskRow, evaluation_path
from lumobench.agent.table import TABLE_MD, table_rows, write_task_table
from lumobench.agent.tasks import Task, resolve_tasks
from lumobench.corpus import load_corpus
from lumobench.corpus_select import freeze_selection
from lumobench.errors import LumobenchError, interrupt_on_signals, user_errors
from lumobench.manifest import write_manifest
from lumobench.record import RecordingProxy

err = Console(stderr=True, soft_wrap=True)  # never break paths and messages across lines
out = Console()


def _split(values: list[str]) -> list[str]:
    return [v for value in values for v in value.split(",") if v]


def _print_row(row: TaskRow) -> None:
    color = {"completed": "green", "timeout": "yellow"}.get(row.status, "red")
    minutes = f"{row.agent_s / 60:.1f} min" if row.agent_s is not None else "not started"
    patch = "empty patch" if row.patch_empty else "non-empty patch"
    detail = f" ({row.error})" if row.error else ""
    err.print(
        f"[{color}]{row.status}[/] {row.instance_id} run {row.run_index + 1}: {minutes}, "
        f"{row.requests or 0} requests, {row.output_tokens or 0:,} output tokens, {patch}{detail}",
        highlight=False,
    )


def agent_command(
    tasks: Annotated[
        list[str] | None,
        typer.Option(
            "--tasks",
            help="Task list name (e.g. astropy), SWE-bench JSONL/JSON/parquet file, or instance ids; "
            "repeat or comma-separate. Ids are looked up in the lists/files given, else the shipped lists.",
        ),
    ] = None,
    arm: Annotated[
        str | None, typer.Option(help="Arm to launch: a name in serving/arms or a .toml file.")
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="Use an already-running OpenAI-compatible server instead of --arm.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Served model name (default: asked from /v1/models).")
    ] = None,
    runs: Annotated[int, typer.Option(min=1, help="Attempts per task.")] = 1,
    budget_s: Annotated[
        float, typer.Option("--budget-s", min=1, help="Wall budget per attempt in seconds (paper: 9000).")
    ] = 9000.0,
    max_tokens: Annotated[
        int, typer.Option(min=1, help="Response cap per model request (paper: 24000).")
    ] = 24000,
    sampling: Annotated[
        list[str] | None,
        typer.Option(help="Sampling override KEY=VALUE (repeatable); default: the paper's agent sampling."),
    ] = None,
    repos: Annotated[
        Path | None,
        typer.Option(
            help="Folder of repository mirrors (owner__name, owner/name or name; bare or not) "
            f"[default: {CACHE_DIR / 'repos'}; --resume: the run's]."
        ),
    ] = None,
    clone: Annotated[
        bool | None,
        typer.Option(
            "--clone/--no-clone",
            help="Clone a missing repository from GitHub into --repos (needs network) [default: clone; "
            "--resume: the run's].",
        ),
    ] = None,
    record: Annotated[
        Path | None, typer.Option(help="Record every model request into this corpus (JSONL) while running.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Results folder; the run goes to OUT/<run-id>/.")] = Path(
        "results"
    ),
    resume: Annotated[
        Path | None, typer.Option(help="Continue this agent run directory (its tasks and settings).")
    ] = None,
    qwen_code_version: Annotated[
        str, typer.Option(help="Qwen Code npm release (installed once into .cache/qwen-code/).")
    ] = DEFAULT_VERSION,
    keep_workdirs: Annotated[
        bool | None,
        typer.Option(
            "--keep-workdirs/--no-keep-workdirs",
            help="Keep each attempt's working copy under the run's work/ folder [default: no; --resume: "
            "the run's].",
        ),
    ] = None,
) -> None:
    """Run Qwen Code on SWE-bench tasks against an arm; write rows, predictions and the task table."""
    interrupt_on_signals()  # SIGTERM and SIGHUP end the run as Ctrl-C does: agent, arm and run.json
    args = AgentArgs(
        tasks=tuple(_split(tasks or [])),
        arm=arm,
        endpoint=endpoint,
        model=model,
        runs=runs,
        budget_s=budget_s,
        max_tokens=max_tokens,
        sampling=tuple(sampling or ()),
        repos=repos,
        clone=clone,
        record=record,
        out=out,
        resume=resume,
        qwen_code_version=qwen_code_version,
        keep_workdirs=keep_workdirs,
    )
    with user_errors():
        job = prepare(args)
        err.print(f"agent run: {job.run.path}", highlight=False)
        _run_with_progress(job)


class RichAgentUI:
    """`execute`'s events on the terminal: one transient bar over the attempts, each row as it ends."""

    def __init__(self, progress: Progress, budget_s: float) -> None:
        self.progress, self.budget_s = progress, budget_s
        self.bar = progress.add_task("starting the arm", total=None)

    def note(self, text: str) -> None:
        err.print(text)

    def attempt(self, i: int, n: int, task: Task, run_index: int) -> Callable[[float, int], None]:
        self.progress.update(
            self.bar, total=n, completed=i, description=f"{task.instance_id} run {run_index + 1}"
        )

        def tick(elapsed: float, requests: int) -> None:
            self.progress.update(
                self.bar,
                description=(
                    f"{task.instance_id} run {run_index + 1}: {elapsed:.0f}/{self.budget_s:.0f} s, "
                    f"{requests} requests"
                ),
            )

        return tick

    def done(self, row: TaskRow) -> None:
        self.progress.advance(self.bar)
        _print_row(row)


def _run_with_progress(job: AgentJob) -> None:
    run = job.run
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        try:
            meta = execute(job, RichAgentUI(progress, job.settings.budget_s))
        except KeyboardInterrupt:
            err.print(
                f"interrupted; recorded attempts are kept. Continue with: lumobench agent --resume {run.path}"
            )
            raise typer.Exit(130) from None
    err.print(f"{meta.status}: task table {run.path / TABLE_MD}, predictions in {run.path}", highlight=False)
    _print_table(run)
    failed = [row for row in run.latest_rows().values() if row.status not in ("completed", "timeout")]
    if failed:
        retry = sum(row.status not in ATTEMPTED for row in failed)
        err.print(
            f"[red]{len(failed)} attempt(s) failed[/] ({', '.join(sorted({row.status for row in failed}))})"
            + (f"; `lumobench agent --resume {run.path}` retries {retry} of them" if retry else ""),
            highlight=False,
        )
        raise typer.Exit(1)


def _print_table(run: AgentRunDir) -> None:
    meta = run.read_meta()
    table = Table("task", "run", "status", "agent min", "requests", "output tokens", "patch", "evaluation")
    for row in table_rows(meta, run):
        table.add_row(
            row.task,
            str(row.run),
            row.status,
            "—" if row.agent_min is None else f"{row.agent_min:.1f}",
            "—" if row.requests is None else str(row.requests),
            "—" if row.output_tokens is None else f"{row.output_tokens:,}",
            row.patch,
            row.evaluation,
        )
    out.print(table)


def _run_meta(folder: Path) -> AgentRunMeta | None:
    """The metadata of the agent run whose predictions lie in `folder` (None for any other folder)."""
    if not (folder / RUN_FILE).is_file():
        return None
    try:
        return AgentRunDir.open(folder).read_meta()
    except (LumobenchError, ValueError):  # another kind of run, or unreadable metadata
        return None


def evaluate_command(
    predictions: Annotated[
        Path, typer.Argument(help="SWE-bench predictions JSONL (e.g. a run's predictions.jsonl).")
    ],
    tasks: Annotated[
        list[str] | None,
        typer.Option(
            "--tasks",
            help="Where the predicted instances are defined (default: the --tasks of the agent run the "
            "predictions belong to, else the shipped lists).",
        ),
    ] = None,
    logs: Annotated[
        Path | None, typer.Option(help="Grade existing SWE-bench harness logs under this folder (offline).")
    ] = None,
    run_id: Annotated[str, typer.Option(help="Run id for the SWE-bench harness.")] = "lumobench",
    max_workers: Annotated[int, typer.Option(min=1, help="Parallel harness containers.")] = 1,
    timeout_s: Annotated[
        int, typer.Option("--timeout-s", min=1, help="Harness (or --local test run) timeout per instance.")
    ] = 1800,
    local: Annotated[
        bool,
        typer.Option(
            "--local",
            help="Grade here without Docker: one cached venv per task version (SWE-bench's specs), tests "
            "run with pytest, graded by swebench's parser.",
        ),
    ] = False,
    repos: Annotated[
        Path | None,
        typer.Option(
            help="--local: folder of repository mirrors (default: the agent run's --repos, else "
            f"{CACHE_DIR / 'repos'})."
        ),
    ] = None,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="--local: build the task versions' environments again.")
    ] = False,
) -> None:
    """Evaluate predictions with the SWE-bench harness (needs Docker), locally (--local), or grade
    existing harness logs (--logs)."""
    with user_errors():
        if local and logs is not None:
            raise LumobenchError("give --local or --logs, not both")
        if not local and (repos is not None or rebuild):
            raise LumobenchError("--repos and --rebuild belong to --local")
        preds = ev.read_predictions(predictions)
        ids = [p.instance_id for p in preds]
        meta = _run_meta(predictions.parent)
        specs = _split(tasks or []) or (meta.tasks if meta else [])
        task_map = {t.instance_id: t for t in resolve_tasks([*specs, *ids])}
        if local:
            # abspath, not absolute(): the messages name the mirror without "x/../"
            repos_dir = Path(os.path.abspath(repos or (meta.repos_dir if meta else CACHE_DIR / "repos")))
            if not repos_dir.is_dir():
                raise LumobenchError(f"no folder of mirrors at {repos_dir} (give --repos DIR)")
            out_dir = predictions.with_name(evaluation_path(predictions).stem + ".local")
            err.print(f"grading locally (logs in {out_dir})", highlight=False)
            evaluations = evaluate_locally(
                preds,
                task_map,
                repos_dir,
                out_dir.absolute(),
                lambda line: err.print(line, highlight=False),
                rebuild=rebuild,
                timeout_s=timeout_s,
            )
        elif logs is not None:
            evaluations = ev.grade(preds, task_map, ev.find_test_logs(logs))
        elif why := ev.docker_unavailable():
            err.print(
                f"[yellow]not evaluated:[/] {why}; the SWE-bench harness needs a Docker daemon. "
                "Empty patches count as unresolved; the others are marked not evaluated."
            )
            evaluations = ev.mark_not_evaluated(preds, why)
        else:
            logs_dir = ev.run_harness(
                preds, task_map, predictions.parent / f"swebench-{run_id}", run_id, max_workers, timeout_s
            )
            evaluations = ev.grade(preds, task_map, ev.find_test_logs(logs_dir))
        target = evaluation_path(predictions)
        ev.write_evaluations(evaluations, target)
        if (predictions.parent / RUN_FILE).is_file():
            with contextlib.suppress(LumobenchError):  # another kind of run: no task table to refresh
                write_task_table(AgentRunDir.open(predictions.parent))
    counts = {
        s: sum(e.status == s for e in evaluations)
        for s in (ev.RESOLVED, ev.UNRESOLVED, ev.EMPTY_PATCH, ev.NOT_EVALUATED)
    }
    out.print(", ".join(f"{n} {s}" for s, n in counts.items()) + f" → {target}", highlight=False)


def record_command(
    upstream: Annotated[
        str, typer.Option(help="The OpenAI-compatible server to forward to (http://host:port).")
    ],
    out_corpus: Annotated[Path, typer.Option("--out", help="Corpus JSONL to append captured requests to.")],
    port: Annotated[int, typer.Option(help="Port to listen on (0 = any free port).")] = 8100,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    task: Annotated[str | None, typer.Option(help="Task label stored in each record's source.")] = None,
) -> None:
    """Run a recording proxy until Ctrl-C: point clients at it, every chat request becomes a corpus record."""
    with user_errors():
        proxy = RecordingProxy(upstream, out_corpus, task=task)

    async def serve() -> None:
        runner = web.AppRunner(proxy.app(), shutdown_timeout=1.0, handler_cancellation=True)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()
            raise LumobenchError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound = runner.addresses[0][1]
        err.print(
            f"recording proxy on http://{host}:{bound}/v1 → {proxy.upstream}, writing {out_corpus} "
            "(Ctrl-C stops)",
            highlight=False,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with user_errors(), contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    err.print(f"recorded {proxy.recorded} requests into {out_corpus}", highlight=False)


def select_command(
    corpus: Annotated[Path, typer.Argument(help="Captured corpus (JSONL) to select from.")],
    n: Annotated[int, typer.Option("--n", min=1, help="How many records to select (paper: 43).")],
    out_manifest: Annotated[
        Path, typer.Option("--out", help="Manifest to write (e.g. manifests/NAME.json).")
    ],
) -> None:
    """Select N records across conversations (proportional, spaced in capture order); freeze a manifest."""
    with user_errors():
        manifest = freeze_selection(corpus, load_corpus(corpus), n)
        write_manifest(manifest, out_manifest)
    shares = manifest.selection.params["per_conversation"]
    out.print(
        f"selected {manifest.n_records} of {manifest.selection.params['of']} records from "
        f"{len(shares)} conversations → {out_manifest}",
        highlight=False,
    )
