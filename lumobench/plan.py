"""Replay planning: turn CLI choices, or an interrupted run directory, into `Plan`s.

Everything is validated up front (corpus, manifest, arms, endpoint, run directory) so that a mistake
is reported before any server starts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from lumobench.arms import REPO_ROOT, ResolvedArm, arm_path, check_launchable, load_arm, resolve_arm
from lumobench.client import Target
from lumobench.corpus import CorpusRecord, file_sha256, load_corpus, record_sha256
from lumobench.errors import LumobenchError
from lumobench.manifest import ManifestDiff, ManifestMismatch, read_manifest, select_by_manifest
from lumobench.results import ArmInfo, RunDir, RunMeta, host_info, new_run_id, now_iso

#: the embedded default: LumoTree's own arms, compared on the matched set (their TOML files come
#: with the engine)
DEFAULT_ARMS = ("lumotree-ar", "lumotree-mtp5", "lumotree")


@dataclass
class Plan:
    """One run directory to fill: where requests go and, for arms, what to launch first."""

    run: RunDir
    meta: RunMeta
    records: list[CorpusRecord]
    target: Target
    arm: ResolvedArm | None


def _manifest_for(corpus: Path, manifest: Path | None) -> Path | None:
    """--manifest, else manifests/<corpus stem>.json of this checkout when it pins this corpus."""
    if manifest:
        return manifest
    auto = REPO_ROOT / "manifests" / f"{corpus.stem}.json"
    if auto.is_file() and Path(read_manifest(auto).corpus).name == corpus.name:
        return auto
    return None


def select_records(corpus: Path, manifest: Path | None) -> tuple[list[CorpusRecord], Path | None]:
    """The corpus records to replay (the manifest's, in its order, when there is one) and that manifest."""
    records = load_corpus(corpus)
    manifest = _manifest_for(corpus, manifest)
    if manifest:
        records = select_by_manifest(read_manifest(manifest), manifest, records)
    return records, manifest


def _require_input_ids(records: list[CorpusRecord]) -> None:
    if lacking := [r.id for r in records if r.input_ids is None]:
        raise LumobenchError(
            f"the generate API replays input_ids, which these records lack: {', '.join(lacking)}"
        )


def _normalise_endpoint(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def probe_endpoint(base_url: str) -> tuple[str | None, str | None]:
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
        corpus=str(corpus.resolve()),  # absolute, so --resume works from any directory
        corpus_sha256=file_sha256(corpus),
        manifest=str(manifest.resolve()) if manifest else None,
        manifest_sha256=file_sha256(manifest) if manifest else None,
        request_ids=[r.id for r in records],
        record_sha256={r.id: record_sha256(r) for r in records},
        deterministic_ids=[r.id for r in records if r.is_deterministic],
        runs=runs,
        concurrency=concurrency,
        stream_options=target.stream_options,
        extra_body=target.extra_body,
        max_tokens_cap=target.max_tokens_cap,
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
    *,
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
    boot_per_run: bool | None = None,
    max_tokens_cap: int | None = None,
) -> list[Plan]:
    """Validate everything up front (corpus, manifest, arms, endpoint) before any server starts.

    boot_per_run: start each launched arm afresh per repetition; None takes the arm file's setting.
    max_tokens_cap: lower every request's max_tokens to at most this (e.g. a corpus captured on a
    long-context arm, replayed on a small-context engine); recorded in run.json.
    """
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
    records, manifest = select_records(corpus, manifest)
    if api == "generate":
        _require_input_ids(records)
    plans = []
    if endpoint:
        if boot_per_run:
            raise LumobenchError("--boot-per-run needs arms that lumobench launches, not --endpoint")
        base = _normalise_endpoint(endpoint)
        served, engine = probe_endpoint(base)
        target = Target(base_url=base, api=api or "chat", model=model or served, request_timeout_s=timeout)  # type: ignore[arg-type]
        info = ArmInfo(name=label or "endpoint")
        if arms:  # an arm already running at the endpoint: use its request settings, launch nothing
            config, source = load_arm(arms[0])
            running = resolve_arm(config, source, model=model)
            target = replace(_arm_target(running, api, timeout), base_url=base, model=model or served)
            info = _arm_info(running).model_copy(update={"launched": False, "name": label or running.name})
        target = replace(target, max_tokens_cap=max_tokens_cap)
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
    if any(a.config.request.api == "generate" for a in resolved):
        _require_input_ids(records)
    for arm in resolved:
        target = replace(_arm_target(arm, api, timeout), max_tokens_cap=max_tokens_cap)
        run_id = new_run_id(arm.name if not label else f"{label}-{arm.name}")
        meta = _new_meta(
            run_id, _arm_info(arm), arm.base_url, target, corpus, manifest, records, runs, concurrency
        )
        meta.boot_per_run = arm.config.boot_per_run if boot_per_run is None else boot_per_run
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
        target = replace(_arm_target(arm, meta.api, timeout), max_tokens_cap=meta.max_tokens_cap)
        return Plan(run, meta, records, target, arm)
    probe_endpoint(meta.endpoint)
    target = Target(
        base_url=meta.endpoint,
        api=meta.api,
        model=meta.model,
        stream_options=meta.stream_options,
        extra_body=meta.extra_body,
        request_timeout_s=timeout,
        max_tokens_cap=meta.max_tokens_cap,
    )
    return Plan(run, meta, records, target, None)
