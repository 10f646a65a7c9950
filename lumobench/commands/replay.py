"""`lumobench replay`: replay a frozen corpus against arms (launched here) or a running endpoint."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lumobench.arms import REPO_ROOT, ResolvedArm, arm_path, check_launchable, load_arm, resolve_arm
from lumobench.client import Target
from lumobench.corpus import CorpusRecord, file_sha256, load_corpus, record_sha256
from lumobench.errors import LumobenchError, user_errors
from lumobench.launch import ArmServer, interrupt_on_signals, launched, log_tail
from lumobench.manifest import ManifestDiff, ManifestMismatch, read_manifest, select_by_manifest
from lumobench.replay import ReplayOutcome, execute
from lumobench.report import build_report, render_table, table_console
from lumobench.results import ArmInfo, RequestRow, RunDir, RunMeta, host_info, new_run_id, now_iso

#: the embedded default: LumoTree's own arms, compared on the matched set (their TOML files come
#: with the engine)
DEFAULT_ARMS = ("lumotree-ar", "lumotree-mtp5", "lumotree")
EXIT_FAILED_ROWS, EXIT_ABORTED, EXIT_INTERRUPTED = 1, 3, 130

console = Console(stderr=True)


@dataclass
class Plan:
    """One run directory to fill: where requests go and, for arms, what to launch first."""

    run: RunDir
    meta: RunMeta
    records: list[CorpusRecord]
    target: Target
    arm: ResolvedArm | None


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


def _manifest_for(corpus: Path, manifest: Path | None) -> Path | None:
    """--manifest, else manifests/<corpus stem>.json of this checkout when it pins this corpus."""
    if manifest:
        return manifest
    auto = REPO_ROOT / "manifests" / f"{corpus.stem}.json"
    if auto.is_file() and Path(read_manifest(auto).corpus).name == corpus.name:
        return auto
    return None


def _select_records(corpus: Path, manifest: Path | None, api: str) -> tuple[list[CorpusRecord], Path | None]:
    records = load_corpus(corpus)
    manifest = _manifest_for(corpus, manifest)
    if manifest:
        records = select_by_manifest(read_manifest(manifest), manifest, records)
        console.print(f"corpus {corpus} matches manifest {manifest} ({len(records)} records)")
    if api == "generate" and (lacking := [r.id for r in records if r.input_ids is None]):
        raise LumobenchError(
            f"--api generate replays input_ids, which these records lack: {', '.join(lacking)}"
        )
    return records, manifest


def _normalise_endpoint(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _probe(base_url: str) -> tuple[str | None, str | None]:
    """(first served model id, engine version) of a running server; raises if it cannot be reached."""
    try:
        with httpx.Client(base_url=base_url, timeout=10) as client:
            resp = client.get("/v1/models")
            model = resp.json()["data"][0]["id"] if resp.status_code == 200 else None
            version = client.get("/version")
            engine = version.json().get("version") if version.status_code == 200 else None
    except httpx.HTTPError as exc:
        raise LumobenchError(f"cannot reach endpoint {base_url}: {exc}") from None
    except (ValueError, KeyError, IndexError):
        return None, None
    return model, engine


def _new_meta(
    run_id: str,
    arm: ArmInfo,
    endpoint: str,
    target: Target,
    corpus: Path,
    manifest: Path | None,
    records: list[CorpusRecord],
    runs: int,
    concurrency: int,
) -> RunMeta:
    return RunMeta(
        run_id=run_id,
        created=now_iso(),
        argv=sys.argv,
        arm=arm,
        endpoint=endpoint,
        api=target.api,
        model=target.model,
        corpus=str(corpus),
        corpus_sha256=file_sha256(corpus),
        manifest=str(manifest) if manifest else None,
        manifest_sha256=file_sha256(manifest) if manifest else None,
        request_ids=[r.id for r in records],
        record_sha256={r.id: record_sha256(r) for r in records},
        runs=runs,
        concurrency=concurrency,
        stream_options=target.stream_options,
        extra_body=target.extra_body,
        host=host_info(),
    )


def _arm_info(arm: ResolvedArm) -> ArmInfo:
    return ArmInfo(
        name=arm.name,
        config={
            "file": str(arm.source),
            "arm": arm.config.model_dump(mode="json"),
            "argv": arm.argv,
            "env": arm.env,
            "model": arm.model,
        },
        config_sha256=arm.source_sha256,
        launched=True,
    )


def _arm_target(arm: ResolvedArm, api: str | None, timeout: float) -> Target:
    req = arm.config.request
    return Target(
        base_url=arm.base_url,
        api=api or req.api,  # type: ignore[arg-type]
        model=arm.served_model_name,
        stream_options=req.stream_options,
        extra_body=req.extra_body,
        request_timeout_s=timeout,
    )


def plan_new(
    corpus: Path,
    arms: list[str],
    endpoint: str | None,
    api: str | None,
    label: str | None,
    runs: int,
    manifest: Path | None,
    concurrency: int,
    out: Path,
    port: int | None,
    model: str | None,
    timeout: float,
) -> list[Plan]:
    """Validate everything up front (corpus, manifest, arms, endpoint) before any server starts."""
    if len(arms) > 1 and endpoint:
        raise LumobenchError("--endpoint takes at most one --arm (the arm that is already running there)")
    if not arms and not endpoint:
        missing = [str(arm_path(a)) for a in DEFAULT_ARMS if not arm_path(a).is_file()]
        if missing:
            raise LumobenchError(
                f"the default arms ({', '.join(DEFAULT_ARMS)}) come with the LumoTree engine; missing arm "
                f"file(s): {', '.join(missing)}. Pass --arm NAME (e.g. --arm vllm-cpu-tiny) or --endpoint URL"
            )
        arms = list(DEFAULT_ARMS)
    records, manifest = _select_records(corpus, manifest, api or "chat")
    plans = []
    if endpoint:
        base = _normalise_endpoint(endpoint)
        served, engine = _probe(base)
        target = Target(base_url=base, api=api or "chat", model=model or served, request_timeout_s=timeout)  # type: ignore[arg-type]
        info = ArmInfo(name=label or "endpoint")
        if arms:  # an arm already running at the endpoint: use its request settings, launch nothing
            config, source = load_arm(arms[0])
            running = resolve_arm(config, source, model=model)
            target = replace(_arm_target(running, api, timeout), base_url=base, model=model or served)
            info = _arm_info(running).model_copy(update={"launched": False, "name": label or running.name})
        meta = _new_meta(
            new_run_id(info.name), info, base, target, corpus, manifest, records, runs, concurrency
        )
        meta.engine_version = engine
        plans.append(Plan(RunDir.create(out / meta.run_id, meta), meta, records, target, None))
        return plans
    resolved = []
    for name in arms:
        config, source = load_arm(name)
        arm = resolve_arm(config, source, port=port, model=model)
        check_launchable(arm)
        resolved.append(arm)
    if api == "generate" or any(a.config.request.api == "generate" for a in resolved):
        _select_records(corpus, manifest, "generate")
    for arm in resolved:
        target = _arm_target(arm, api, timeout)
        run_id = new_run_id(arm.name if not label else f"{label}-{arm.name}")
        meta = _new_meta(
            run_id, _arm_info(arm), arm.base_url, target, corpus, manifest, records, runs, concurrency
        )
        plans.append(Plan(RunDir.create(out / run_id, meta), meta, records, target, arm))
    return plans


def plan_resume(run_path: Path, corpus: Path | None, timeout: float) -> Plan:
    """Reopen an interrupted run: same corpus records (checked by hash), same arm or endpoint."""
    run = RunDir.open(run_path)
    meta = run.read_meta()
    corpus = corpus or Path(meta.corpus)
    by_id = {r.id: r for r in load_corpus(corpus)}
    diff = ManifestDiff(
        changed=[
            i for i in meta.request_ids if i in by_id and record_sha256(by_id[i]) != meta.record_sha256.get(i)
        ],
        missing=[i for i in meta.request_ids if i not in by_id],
    )
    if diff.changed or diff.missing:
        raise ManifestMismatch(run.path / "run.json", diff)
    records = [by_id[i] for i in meta.request_ids]
    if meta.arm.launched:
        config, source = load_arm(meta.arm.config.get("file") or meta.arm.name)
        arm = resolve_arm(
            config, source, port=int(meta.endpoint.rsplit(":", 1)[1]), model=meta.arm.config.get("model")
        )
        if arm.source_sha256 != meta.arm.config_sha256:
            raise LumobenchError(f"arm file {source} changed since run {meta.run_id} started; resume refused")
        check_launchable(arm)
        target = _arm_target(arm, meta.api, timeout)
        return Plan(run, meta, records, target, arm)
    _probe(meta.endpoint)
    target = Target(
        base_url=meta.endpoint,
        api=meta.api,
        model=meta.model,
        stream_options=meta.stream_options,
        extra_body=meta.extra_body,
        request_timeout_s=timeout,
    )
    return Plan(run, meta, records, target, None)


def _execute(plan: Plan, concurrency: int, server: ArmServer | None) -> ReplayOutcome:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
        console=console,
    ) as progress:
        ui = RichProgress(progress, plan.meta.arm.name, plan.meta.runs)
        alive = None if server is None else (lambda: server.exit_code() is None)
        return asyncio.run(
            execute(
                plan.run,
                plan.meta,
                plan.records,
                plan.target,
                concurrency=concurrency,
                server_alive=alive,
                progress=ui,
            )
        )


def run_plan(plan: Plan, concurrency: int) -> ReplayOutcome:
    """Launch the arm if there is one, replay, stop the arm; Ctrl-C propagates as KeyboardInterrupt."""
    kept = plan.run.prepare_resume()
    if kept:
        console.print(f"resuming {plan.run.path}: {len(kept)} completed rows kept")
    if plan.arm is None:
        return _execute(plan, concurrency, None)
    arm, log = plan.arm, plan.run.server_log
    status = console.status(f"starting arm {arm.name} (log: {log})")
    status.start()
    try:
        with launched(
            arm,
            log,
            on_wait=lambda s: status.update(f"starting arm {arm.name}: waiting for {s} (log: {log})"),
        ) as server:
            status.stop()
            plan.meta.engine_version = _probe(arm.base_url)[1]
            plan.meta.model = plan.target.model or server.served_model
            plan.target = replace(plan.target, model=plan.meta.model)
            plan.run.write_meta(plan.meta)
            return _execute(plan, concurrency, server)
    finally:
        status.stop()


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
    port: Annotated[int | None, typer.Option(help="Launch arms on this port instead of their own.")] = None,
    model: Annotated[
        str | None, typer.Option(help="Arms: model path instead of the arm's. Endpoint: model name to send.")
    ] = None,
    request_timeout: Annotated[float, typer.Option(help="Longest silence within one response (s).")] = 900.0,
) -> None:
    """Replay a corpus with streaming timers; several arms print a comparison over the matched set."""
    interrupt_on_signals()
    if api not in (None, "chat", "generate"):
        raise typer.BadParameter("must be chat or generate", param_hint="--api")
    with user_errors():
        if resume:
            plans = [plan_resume(resume, corpus, request_timeout)]
            concurrency = plans[0].meta.concurrency
        elif corpus is None:
            raise LumobenchError("give a CORPUS file (or --resume RUN_DIR)")
        else:
            plans = plan_new(
                corpus,
                arm or [],
                endpoint,
                api,
                label,
                runs,
                manifest,
                concurrency,
                out,
                port,
                model,
                request_timeout,
            )
    failed = 0
    for plan in plans:
        try:
            with user_errors():
                outcome = run_plan(plan, concurrency)
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
        table_console().print(render_table(build_report([p.run.path for p in plans])))
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
