"""`lumobench replay`: replay a frozen corpus against arms (launched) or a running endpoint; the user
interface only: the options, the terminal's status and progress, the outcome and exit codes. What
runs is `lumobench.plan` (what to do) and `lumobench.replay.run_plan` (doing it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.status import Status

from lumobench.client import DEADLINE_BASE_S, DEADLINE_PER_TOKEN_S, DEADLINE_WITHOUT_MAX_TOKENS_S
from lumobench.errors import LumobenchError, user_errors
from lumobench.launch import interrupt_on_signals, log_tail
from lumobench.plan import Plan, Timeouts, plan_new, plan_resume
from lumobench.replay import run_plan
from lumobench.report import build_report, print_table, report_command, table_console
from lumobench.results import RequestRow

EXIT_FAILED_ROWS, EXIT_ABORTED, EXIT_INTERRUPTED = 1, 3, 130

console = Console(stderr=True)


class RichProgress:
    """Progress bar per repetition, with the last request's tokens and decode time."""

    def __init__(self, progress: Progress, label: str, runs: int) -> None:
        self.progress, self.label, self.runs = progress, label, runs
        self.task: Any = None

    def run_started(self, run_index: int, total: int, already_done: int) -> None:
        self.task = self.progress.add_task(
            f"{self.label} run {run_index + 1}/{self.runs}", total=total, completed=already_done, last=""
        )

    def row_written(self, row: RequestRow) -> None:
        if row.status == "failed":
            last = f"[red]{row.request_id} failed: {(row.error or '')[:60]}[/]"
        else:
            last = f"{row.request_id}: n={row.completion_tokens} in {row.decode_s or 0:.2f} s"
        self.progress.update(self.task, advance=1, last=last)


class RichPlanUI:
    """`run_plan`'s events on the terminal: a status line while an arm starts, progress bars."""

    def __init__(self) -> None:
        self.status: Status | None = None

    def resuming(self, run_path: Path, kept_rows: int) -> None:
        console.print(f"resuming {run_path}: {kept_rows} completed rows kept")

    def arm_starting(self, arm: str, log: Path, waiting_for: str | None) -> None:
        text = (
            f"starting arm {arm}" + (f": waiting for {waiting_for}" if waiting_for else "") + f" (log: {log})"
        )
        if self.status is None:
            self.status = console.status(text)
            self.status.start()
        else:
            self.status.update(text)

    def arm_started(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    @contextmanager
    def replaying(self, plan: Plan) -> Iterator[RichProgress]:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, TextColumn("{task.fields[last]}"), console=console) as progress:
            yield RichProgress(progress, plan.meta.arm.name, plan.meta.runs)


def replay(
    corpus: Annotated[Path | None, typer.Argument(help="Corpus (JSONL). Optional with --resume.")] = None,
    arm: Annotated[
        list[str] | None,
        typer.Option(
            "--arm", help="Arm to launch and replay (repeatable); with --endpoint: the arm running there."
        ),
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="Replay against an already running server (base URL).")
    ] = None,
    runs: Annotated[int, typer.Option(help="Repetitions of the whole corpus.", min=1)] = 1,
    manifest: Annotated[
        Path | None,
        typer.Option(
            help="Frozen manifest the corpus must match (default: manifests/<corpus name>.json if present)."
        ),
    ] = None,
    resume: Annotated[
        Path | None, typer.Option(help="Finish an interrupted run directory (no duplicates, no gaps).")
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="Requests in flight (the paper's protocol: 1).", min=1)
    ] = 1,
    out: Annotated[Path, typer.Option(help="Results root; each arm gets <out>/<run-id>/.")] = Path("results"),
    api: Annotated[
        str | None,
        typer.Option(
            help="chat (OpenAI chat completions) or generate (SGLang /generate "
            "with input_ids); default: the arm's setting, else chat."
        ),
    ] = None,
    label: Annotated[str | None, typer.Option(help="Name for the run (and the endpoint in reports).")] = None,
    port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Launch arms on this port instead of their own (0: a free one); also with --resume.",
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Arms: model path instead of the arm's. Endpoint: model name to send.")
    ] = None,
    request_timeout: Annotated[float, typer.Option(help="Longest silence within one response (s).")] = 900.0,
    request_deadline: Annotated[
        float | None,
        typer.Option(
            help=f"Longest total time of one request (s); default: {DEADLINE_BASE_S:g} s + "
            f"{DEADLINE_PER_TOKEN_S:g} s per max_tokens of the record ({DEADLINE_WITHOUT_MAX_TOKENS_S:g} s "
            "without max_tokens)."
        ),
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(
            help="Environment variable holding the API key to send (Authorization: Bearer); default: the "
            "arm's api_key_env. Only the variable's name is recorded."
        ),
    ] = None,
    boot_per_run: Annotated[
        bool | None,
        typer.Option(
            "--boot-per-run/--one-boot",
            help="Start launched arms afresh for every repetition, or once for all; default: the arm "
            "file's boot_per_run (true for the lumotree arms, whose suffix cache learns earlier outputs).",
        ),
    ] = None,
    max_tokens_cap: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Send every request with max_tokens at most this (records without one get it), e.g. a "
            "corpus captured on a long-context arm replayed on the embedded engine; kept for --resume.",
        ),
    ] = None,
) -> None:
    """Replay a corpus with streaming timers; several arms print a comparison over the matched set."""
    interrupt_on_signals()
    if api not in (None, "chat", "generate"):
        raise typer.BadParameter("must be chat or generate", param_hint="--api")
    timeouts = Timeouts(request_timeout, request_deadline)
    with user_errors():
        if resume:
            plans = [plan_resume(resume, corpus, timeouts, port, api_key_env)]
            concurrency = plans[0].meta.concurrency
        elif corpus is None:
            raise LumobenchError("give a CORPUS file (or --resume RUN_DIR)")
        else:
            plans = plan_new(
                corpus,
                arms=arm or [],
                endpoint=endpoint,
                api=api,
                label=label,
                runs=runs,
                manifest=manifest,
                concurrency=concurrency,
                out=out,
                port=port,
                model=model,
                timeouts=timeouts,
                boot_per_run=boot_per_run,
                max_tokens_cap=max_tokens_cap,
                api_key_env=api_key_env,
            )
            if plans[0].meta.manifest:
                console.print(f"corpus {corpus} matches manifest {plans[0].meta.manifest}")
    failed = 0
    for plan in plans:
        try:
            with user_errors():
                outcome = run_plan(plan, concurrency, RichPlanUI())
        except KeyboardInterrupt:
            rows = plan.run.read_rows()
            console.print(
                f"[yellow]interrupted: kept {len(rows)} rows in {plan.run.path}; continue with: "
                f"lumobench replay --resume {plan.run.path}[/]"
            )
            raise typer.Exit(EXIT_INTERRUPTED) from None
        if outcome.status == "aborted":
            console.print(
                f"[red]run aborted: {outcome.message}; kept {outcome.completed + outcome.failed} rows in "
                f"{plan.run.path}; continue with: lumobench replay --resume {plan.run.path}[/]"
            )
            log = plan.run.server_log
            if log.exists():
                console.print(f"last lines of {log}:\n{log_tail(log, 15)}", markup=False)
            raise typer.Exit(EXIT_ABORTED)
        failed += outcome.failed
        console.print(
            f"{plan.meta.arm.name}: {outcome.completed} completed, {outcome.failed} failed -> {plan.run.path}"
        )
    with user_errors():
        print_table(build_report([p.run.path for p in plans]), table_console())
    report_hint = report_command([p.run.path for p in plans])
    console.print(f"full report (tables, figures): {report_hint}", markup=False, soft_wrap=True)
    if failed:
        for plan in plans:
            for row in (r for r in plan.run.read_rows() if r.status == "failed"):
                console.print(
                    f"failed: {plan.meta.arm.name} run {row.run_index + 1} {row.request_id}: {row.error}",
                    markup=False,
                )
        total = sum(len(p.meta.request_ids) * p.meta.runs for p in plans)
        console.print(
            f"[red]{failed} of {total} requests failed (rows kept in requests.jsonl; "
            f"--resume RUN_DIR retries them)[/]"
        )
        raise typer.Exit(EXIT_FAILED_ROWS)
