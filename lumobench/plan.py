"""Replay planning: turn CLI choices, or an interrupted run directory, into `Plan`s.

Everything is validated up front (corpus, manifest, arms, ports, API keys, endpoint, results folder)
so that a mistake is reported before any server starts and before any run directory is created. A run
directory is locked by the one process that writes it (`RunDir.lock`).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from lumobench.arms import (
    REPO_ROOT,
    ResolvedArm,
    api_key_from_env,
    arm_path,
    check_launchable,
    load_arm,
    resolve_arm,
)
from lumobench.client import Target
from lumobench.corpus import CorpusRecord, file_sha256, load_corpus, record_sha256
from lumobench.errors import LumobenchError
from lumobench.launch import arm_redactor, check_port_free
from lumobench.manifest import ManifestDiff, ManifestMismatch, read_manifest, select_by_manifest
from lumobench.probe import probe_endpoint
from lumobench.redact import Redactor
from lumobench.results import ArmInfo, RunDir, RunMeta, host_info, new_run_id, now_iso

#: the embedded default: LumoTree's own arms, compared on the matched set (their TOML files come
#: with the engine)
DEFAULT_ARMS = ("lumotree-ar", "lumotree-mtp5", "lumotree")
#: `--with-peers`: vLLM's CPU build serving the same shipped model, plain and with its own MTP
PEER_ARMS = ("vllm-cpu-ar", "vllm-cpu-mtp3", "vllm-cpu-mtp5")


@dataclass
class Plan:
    """One run directory to fill: where requests go and, for arms, what to launch first."""

    run: RunDir
    meta: RunMeta
    records: list[CorpusRecord]
    target: Target
    arm: ResolvedArm | None


@dataclass(frozen=True)
class Timeouts:
    """Per-request clocks (s): longest silence, and longest total time (None: derived per record)."""

    silence_s: float = 900.0
    deadline_s: float | None = None

    def check(self) -> Timeouts:
        for flag, value in (("--request-timeout", self.silence_s), ("--request-deadline", self.deadline_s)):
            if value is not None and not 0 < value < math.inf:  # NaN fails too
                raise LumobenchError(f"{flag} must be a finite number of seconds above 0 (got {value:g})")
        return self


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


def _check_limits(arm: ResolvedArm, records: list[CorpusRecord], corpus: Path) -> None:
    """Refuse, before anything is sent, a corpus with requests the arm cannot serve."""
    limits = arm.config.limits
    if limits.greedy_only and (sampled := [r.id for r in records if not r.is_greedy]):
        shown = ", ".join(sampled[:3]) + (", ..." if len(sampled) > 3 else "")
        why = f" ({limits.why})" if limits.why else ""
        raise LumobenchError(
            f"arm {arm.name} serves greedy requests only{why}; {len(sampled)} of {len(records)} records of "
            f"{corpus} sample or leave temperature unset ({shown}): replay a greedy corpus such as "
            f"corpora/demo-greedy.jsonl"
        )


def _normalise_endpoint(url: str) -> str:
    """The server's base URL (a trailing /v1 dropped); a URL lumobench cannot append paths to is refused
    (a key in its query string would also be sent in the clear to every route and logged there)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise LumobenchError(f"--endpoint {Redactor().url(url)} is not an http:// or https:// URL")
    if parts.query or parts.fragment:
        raise LumobenchError(
            f"--endpoint {Redactor().url(url)} has a query string: give the server's base URL (lumobench "
            "appends /v1/... to it) and pass an API key with --api-key-env NAME"
        )
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


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
    redactor: Redactor,
) -> RunMeta:
    return RunMeta(
        run_id=run_id,
        created=now_iso(),
        argv=redactor.argv(sys.argv),
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


def _arm_info(arm: ResolvedArm, redactor: Redactor) -> ArmInfo:
    """The arm as run.json records it: secrets in its environment and command line masked."""
    config = arm.config.model_dump(mode="json")
    config["command"], config["env"] = redactor.argv(config["command"]), redactor.env(config["env"])
    return ArmInfo(
        name=arm.name,
        config={
            "file": str(arm.source),
            "arm": config,
            "argv": redactor.argv(arm.argv),
            "env": redactor.env(arm.env),
            "model": arm.model,
        },
        config_sha256=arm.source_sha256,
        launched=True,
    )


def _arm_target(arm: ResolvedArm, api: str | None, timeouts: Timeouts) -> Target:
    req = arm.config.request
    return Target(
        base_url=arm.base_url,
        api=api or req.api,  # type: ignore[arg-type]
        model=arm.served_model_name,
        stream_options=req.stream_options,
        extra_body=req.extra_body,
        request_timeout_s=timeouts.silence_s,
        request_deadline_s=timeouts.deadline_s,
        api_key=arm.api_key,
        health_path=arm.config.readiness.health,
    )


def _create_run_dirs(out: Path, plans: list[tuple[Path, RunMeta, Redactor]]) -> list[RunDir]:
    """Create (and lock) the run directories, last of all: every check that can refuse the run is done."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise LumobenchError(f"--out {out} is not a directory") from None
    except OSError as exc:  # e.g. a component longer than the file system allows
        raise LumobenchError(f"cannot create the results folder {out}: {exc.strerror or exc}") from None
    return [RunDir.create(path, meta, redactor) for path, meta, redactor in plans]


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
    timeouts: Timeouts,
    boot_per_run: bool | None = None,
    max_tokens_cap: int | None = None,
    with_peers: bool = False,
    api_key_env: str | None = None,
) -> list[Plan]:
    """Validate everything up front (corpus, manifest, arms, ports, endpoint) before any server starts,
    then create the run directories.

    boot_per_run: start each launched arm afresh per repetition; None takes the arm file's setting.
    max_tokens_cap: lower every request's max_tokens to at most this (e.g. a corpus captured on a
    long-context arm, replayed on a small-context engine); recorded in run.json.
    with_peers: add `PEER_ARMS` to the arms (to the default arms when none are named).
    api_key_env: the environment variable holding the API key to send (default: the arm's).
    """
    timeouts.check()
    if with_peers and endpoint:
        raise LumobenchError("--with-peers launches the vLLM CPU arms; it does not combine with --endpoint")
    if with_peers:
        arms = [*(arms or DEFAULT_ARMS), *(a for a in PEER_ARMS if a not in arms)]
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
    if endpoint:
        if boot_per_run:
            raise LumobenchError("--boot-per-run needs arms that lumobench launches, not --endpoint")
        base = _normalise_endpoint(endpoint)
        running = None
        if arms:  # an arm already running at the endpoint: use its request settings, launch nothing
            config, source = load_arm(arms[0])
            running = resolve_arm(config, source, model=model, api_key_env=api_key_env)
            _check_limits(running, records, corpus)
        key = running.api_key if running else api_key_from_env(api_key_env, "--endpoint")
        served = probe_endpoint(base, key)
        redactor = (arm_redactor(running) if running else Redactor()) | Redactor.for_launch(api_key=key)
        target = Target(
            base_url=base,
            api=api or "chat",  # type: ignore[arg-type]
            model=model or served.model,
            request_timeout_s=timeouts.silence_s,
            request_deadline_s=timeouts.deadline_s,
            api_key=key,
        )
        info = ArmInfo(name=label or "endpoint")
        if running:
            target = replace(_arm_target(running, api, timeouts), base_url=base, model=model or served.model)
            info = _arm_info(running, redactor).model_copy(
                update={"launched": False, "name": label or running.name}
            )
        target = replace(target, max_tokens_cap=max_tokens_cap)
        meta = _new_meta(
            new_run_id(info.name),
            info,
            redactor.text(base),
            target,
            corpus,
            manifest,
            records,
            runs,
            concurrency,
            redactor,
        )
        meta.engine_version, meta.engine_config = served.engine_version, served.engine_config
        meta.api_key_env = running.api_key_env if running else api_key_env
        (run,) = _create_run_dirs(out, [(out / meta.run_id, meta, redactor)])
        return [Plan(run, meta, records, target, None)]
    resolved = []
    for name in arms:
        config, source = load_arm(name)
        arm = resolve_arm(config, source, port=port, model=model, api_key_env=api_key_env)
        check_launchable(arm)
        _check_limits(arm, records, corpus)
        resolved.append(arm)
    if any(a.config.request.api == "generate" for a in resolved):
        _require_input_ids(records)
    for address in sorted({(a.config.host, a.port) for a in resolved}):
        check_port_free(*address)
    pending = []
    for arm in resolved:
        target = replace(_arm_target(arm, api, timeouts), max_tokens_cap=max_tokens_cap)
        run_id = new_run_id(arm.name if not label else f"{label}-{arm.name}")
        redactor = arm_redactor(arm)
        meta = _new_meta(
            run_id,
            _arm_info(arm, redactor),
            arm.base_url,
            target,
            corpus,
            manifest,
            records,
            runs,
            concurrency,
            redactor,
        )
        meta.boot_per_run = arm.config.boot_per_run if boot_per_run is None else boot_per_run
        meta.api_key_env = arm.api_key_env
        pending.append((arm, target, out / run_id, meta, redactor))
    run_dirs = _create_run_dirs(out, [(path, meta, r) for _, _, path, meta, r in pending])
    return [
        Plan(run, meta, records, target, arm)
        for run, (arm, target, _, meta, _) in zip(run_dirs, pending, strict=True)
    ]


def plan_resume(
    run_path: Path,
    corpus: Path | None,
    timeouts: Timeouts,
    port: int | None = None,
    api_key_env: str | None = None,
) -> Plan:
    """Reopen an interrupted run: same corpus records (checked by hash), same arm or endpoint.

    port: launch the arm on this port instead of the run's (0: a free one); api_key_env: the variable
    holding the API key, instead of the one the run recorded. The run directory is locked first.
    """
    timeouts.check()
    run = RunDir.open(run_path)
    run.lock()
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
    key_env = api_key_env or meta.api_key_env
    if meta.arm.launched:
        config, source = load_arm(meta.arm.config.get("file") or meta.arm.name)
        arm = resolve_arm(
            config,
            source,
            port=int(meta.endpoint.rsplit(":", 1)[1]) if port is None else port,
            model=meta.arm.config.get("model"),
            api_key_env=key_env,
        )
        if arm.source_sha256 != meta.arm.config_sha256:
            raise LumobenchError(f"arm file {source} changed since run {meta.run_id} started; resume refused")
        check_launchable(arm)
        check_port_free(arm.config.host, arm.port)
        run.redactor = arm_redactor(arm)
        meta.endpoint, meta.api_key_env = arm.base_url, arm.api_key_env
        target = replace(_arm_target(arm, meta.api, timeouts), max_tokens_cap=meta.max_tokens_cap)
        return Plan(run, meta, records, target, arm)
    if port is not None:
        raise LumobenchError(f"--port launches arms; run {meta.run_id} replayed a running endpoint")
    key = api_key_from_env(key_env, f"run {meta.run_id}")
    probe_endpoint(meta.endpoint, key)
    run.redactor = Redactor.for_launch(api_key=key)
    meta.api_key_env = key_env
    target = Target(
        base_url=meta.endpoint,
        api=meta.api,
        model=meta.model,
        stream_options=meta.stream_options,
        extra_body=meta.extra_body,
        request_timeout_s=timeouts.silence_s,
        request_deadline_s=timeouts.deadline_s,
        api_key=key,
        max_tokens_cap=meta.max_tokens_cap,
    )
    return Plan(run, meta, records, target, None)


def plan_resume_group(
    run_path: Path,
    corpus: Path | None,
    timeouts: Timeouts,
    port: int | None = None,
    api_key_env: str | None = None,
) -> list[Plan]:
    """Plans to resume: the run itself, or every member of its interleaved group (sibling directories
    named in `interleaved_with`, in rotation order). `port`, `api_key_env`: as for `plan_resume`; a
    group's arms take only `--port 0` (each a free port of its own)."""
    meta = RunDir.open(run_path).read_meta()
    if not meta.interleaved_with:
        return [plan_resume(run_path, corpus, timeouts, port, api_key_env)]
    if port not in (None, 0):
        raise LumobenchError(
            f"--port {port}: {run_path} was replayed interleaved with {len(meta.interleaved_with)} arms, "
            "each on its own port; resume it without --port, or with --port 0 (a free port for each)"
        )
    paths = [run_path.parent / run_id for run_id in meta.interleaved_with]
    if missing := [str(p) for p in paths if not (p / "run.json").is_file()]:
        raise LumobenchError(
            f"{run_path} was replayed interleaved with {', '.join(meta.interleaved_with)}; "
            f"missing: {', '.join(missing)} (keep the group's directories side by side)"
        )
    return [plan_resume(p, corpus, timeouts, port, api_key_env) for p in paths]
