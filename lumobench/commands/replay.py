"""`lumobench replay`: replay a frozen corpus against arms (launched) or a running endpoint; the user
interface only: the options, the terminal's status and progress, the outcome and exit codes. What
runs is `lumobench.plan` (what to do) and `lumobench.replay.run_group` (doing it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lumobench.client import DEADLINE_BASE_S, DEADLINE_PER_TOKEN_S, DEADLINE_WITHOUT_MAX_TOKENS_S
from lumobench.corpus import MAX_TOKENS
from lumobench.errors import LumobenchError, interrupt_on_signals, user_errors
from lumobench.launch import log_tail
from lumobench.plan import PEER_ARMS, Plan, ReplayArgs, Timeouts, plan_replay
from lumobench.replay import Member, ReplayOutcome, run_group
from lumobench.reports.summary import build_report, print_table, report_command, table_console
from lumobench.results import MAX_RUNS, RequestRow

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


class RichGroupUI:
    """`run_group`'s events on the terminal: a transient line while an arm starts, a progress bar per
    arm and repetition, notes kept above them."""

    def __init__(self, bars: Progress) -> None:
        self.bars = bars
        self.boot = bars.add_task("", total=None, last="", visible=False)

    def resuming(self, run_path: Path, kept_rows: int) -> None:
        self.bars.console.print(f"resuming {run_path}: {kept_rows} completed rows kept")

    def starting(self, arm: str, log: Path, waiting_for: str | None) -> None:
        waiting = f": waiting for {waiting_for}" if waiting_for else ""
        self.bars.update(self.boot, description=f"starting arm {arm}{waiting} (log: {log})", visible=True)

    def started(self) -> None:
        self.bars.update(self.boot, visible=False)

    def note(self, text: str) -> None:
        self.bars.console.print(text, markup=False, highlight=False)

    def progress(self, plan: Plan) -> RichProgress:
        return RichProgress(self.bars, plan.meta.arm.name, plan.meta.runs)


def _print_abort(plan: Plan, outcome: ReplayOutcome) -> None:
    console.print(
        f"[red]{plan.meta.arm.name}: run aborted: {outcome.message}; kept "
        f"{outcome.completed + outcome.failed} rows in {plan.run.path}; continue with: "
        f"lumobench replay --resume {plan.run.path}[/]"
    )
    log = plan.run.server_log
    if log.exists():
        console.print(f"last lines of {log}:\n{log_tail(log, 15)}", markup=False)


def _interrupted(plans: list[Plan]) -> typer.Exit:
    kept = sum(len(p.run.read_rows()) for p in plans)
    where = ", ".join(str(p.run.path) for p in plans)
    console.print(
        f"[yellow]interrupted: kept {kept} rows in {where}; continue with: "
        f"lumobench replay --resume {plans[0].run.path}[/]"
    )
    return typer.Exit(EXIT_INTERRUPTED)


def _run(plans: list[Plan], interleave: bool, concurrency: int) -> list[ReplayOutcome]:
    """Every arm through the one loop: all in one interleaved group, or each alone, one after another.
    One arm that aborts ends the command; of several, an arm that does not start is reported and the
    rest still run."""
    groups = [plans] if interleave else [[p] for p in plans]
    outcomes: list[ReplayOutcome] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, TextColumn("{task.fields[last]}"), console=console) as bars:
        ui = RichGroupUI(bars)
        for group in groups:
            try:
                with user_errors():
                    try:
                        members = [Member(p, ui.progress(p)) for p in group]
                        outcomes += run_group(members, ui, concurrency)
                    except LumobenchError as exc:  # did not start (busy port, exited, not ready)
                        if len(plans) == 1:
                            raise
                        outcomes += [ReplayOutcome("aborted", 0, 0, str(exc).splitlines()[0])] * len(group)
            except KeyboardInterrupt:
                raise _interrupted(group) from None
            if len(plans) == 1 and outcomes[0].status == "aborted":
                bars.stop()
                _print_abort(plans[0], outcomes[0])
                raise typer.Exit(EXIT_ABORTED)
    return outcomes


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
    runs: Annotated[
        int | None, typer.Option(help="Repetitions of the whole corpus (default 1).", min=1, max=MAX_RUNS)
    ] = None,
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
        int | None, typer.Option(help="Requests in flight (default: the paper's protocol, 1).", min=1)
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Results root; each arm gets <out>/<run-id>/ (default: results).")
    ] = None,
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
            max=MAX_TOKENS,
            help="Send every request with max_tokens at most this (records without one get it), e.g. a "
            "corpus captured on a long-context arm replayed on the embedded engine; kept for --resume.",
        ),
    ] = None,
    greedy: Annotated[
        bool,
        typer.Option(
            "--greedy",
            help="Send every request as greedy decoding: temperature 0, and the record's top_p, top_k, "
            "min_p, seed and presence/frequency/repetition penalties left out (max_tokens kept), e.g. a "
            "sampled corpus replayed on greedy-only arms (vLLM CPU MTP); outputs are then compared on "
            "every request. Kept in run.json for reports and --resume.",
        ),
    ] = False,
    interleaved: Annotated[
        bool | None,
        typer.Option(
            "--interleaved/--sequential",
            help="Several arms: all up at once, each request sent to every arm in rotated order, or one "
            "arm after another; default: interleaved when the arms' memory_gb fits the memory available.",
        ),
    ] = None,
    with_peers: Annotated[
        bool,
        typer.Option(
            "--with-peers",
            help="Add the vLLM CPU arms (" + ", ".join(PEER_ARMS) + ") serving the same shipped model to "
            "the arms (default: the three lumotree arms); needs: python -m lumobench.vllm_cpu.",
        ),
    ] = False,
) -> None:
    """Replay a corpus with streaming timers; several arms print a comparison over the matched set."""
    interrupt_on_signals()
    if api not in (None, "chat", "generate"):
        raise typer.BadParameter("must be chat or generate", param_hint="--api")
    with user_errors():
        replay_plan = plan_replay(
            ReplayArgs(
                corpus=corpus,
                arms=tuple(arm or ()),
                endpoint=endpoint,
                runs=runs,
                manifest=manifest,
                resume=resume,
                concurrency=concurrency,
                out=out,
                api=api,  # type: ignore[arg-type]
                label=label,
                port=port,
                model=model,
                timeouts=Timeouts(request_timeout, request_deadline),
                api_key_env=api_key_env,
                boot_per_run=boot_per_run,
                max_tokens_cap=max_tokens_cap,
                greedy=greedy,
                interleaved=interleaved,
                with_peers=with_peers,
            )
        )
    plans = replay_plan.plans
    if not resume and plans[0].meta.manifest:
        console.print(f"corpus {corpus} matches manifest {plans[0].meta.manifest}")
    if replay_plan.note:
        console.print(replay_plan.note, markup=False)
    outcomes = _run(plans, replay_plan.interleave, replay_plan.concurrency)
    aborted = [(p, o) for p, o in zip(plans, outcomes, strict=True) if o.status == "aborted"]
    for plan, outcome in zip(plans, outcomes, strict=True):
        console.print(
            f"{plan.meta.arm.name}: {outcome.completed} completed, {outcome.failed} failed -> {plan.run.path}"
        )
    failed = sum(o.failed for o in outcomes)
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
    for plan, outcome in aborted:
        _print_abort(plan, outcome)
    if aborted:
        raise typer.Exit(EXIT_ABORTED)
    if failed:
        raise typer.Exit(EXIT_FAILED_ROWS)
