"""Replay planning: turn the command line's `ReplayArgs`, or an interrupted run directory, into a
`ReplayPlan`: one `Plan` per arm, and whether they run interleaved.

Everything is validated up front (corpus, manifest, arms, ports, API keys, endpoint, results folder,
the interleaving choice) so that a mistake is reported before any server starts and before any run
directory is created. A run directory is locked by the one process that writes it (`RunDir.lock`).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from lumobench.arms import (
    REPO_ROOT,
    ResolvedArm,
    api_key_from_env,
    arm_path,
    check_launchable,
    check_serves,
    load_arm,
    resolve_arm,
)
from lumobench.client import Target
from lumobench.corpus import CorpusRecord, file_sha256, load_corpus, record_sha256
from lumobench.errors import LumobenchError
from lumobench.interleave import available_memory_gb, choose_mode
from lumobench.launch import check_port_free
from lumobench.manifest import ManifestDiff, ManifestMismatch, read_manifest, select_by_manifest
from lumobench.probe import EndpointInfo, probe_endpoint
from lumobench.redact import Redactor
from lumobench.results import ArmInfo, RunDir, RunMeta, create_run_dirs, host_info, new_run_id, now_iso

#: the embedded default: LumoTree's own arms, compared on the matched set (their TOML files come
#: with the engine)
DEFAULT_ARMS = ("lumotree-ar", "lumotree-mtp5", "lumotree")
#: `--with-peers`: vLLM's CPU build serving the same shipped model, plain and with its own MTP
PEER_ARMS = ("vllm-cpu-ar", "vllm-cpu-mtp3", "vllm-cpu-mtp5")


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


@dataclass(frozen=True)
class ReplayArgs:
    """`lumobench replay`'s options as given (None: not given), carried from the command line to the
    plan as one value. Without `resume` a new run starts from `corpus`; with it, the options that would
    change the run are refused (`new_run_options`)."""

    corpus: Path | None = None
    arms: tuple[str, ...] = ()
    endpoint: str | None = None
    runs: int | None = None
    manifest: Path | None = None
    resume: Path | None = None
    concurrency: int | None = None
    out: Path | None = None
    api: Literal["chat", "generate"] | None = None
    label: str | None = None
    port: int | None = None  # launch arms on this port (0: a free one); also with resume
    model: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    api_key_env: str | None = None  # the variable holding the API key (default: the arm's, the run's)
    boot_per_run: bool | None = None  # None: the arm file's setting
    max_tokens_cap: int | None = None  # every request's max_tokens lowered to at most this
    greedy: bool = False  # every request sent as greedy decoding (`client.greedy_body`)
    interleaved: bool | None = None  # None: interleave when the arms fit the machine
    with_peers: bool = False  # add `PEER_ARMS` (to the default arms when none are named)

    def new_run_options(self) -> list[str]:
        """The flags given that only a new run takes."""
        flags = {
            "--arm": self.arms or None, "--endpoint": self.endpoint, "--runs": self.runs,
            "--manifest": self.manifest, "--concurrency": self.concurrency, "--out": self.out,
            "--api": self.api, "--label": self.label, "--model": self.model,
            "--boot-per-run" if self.boot_per_run else "--one-boot": self.boot_per_run,
            "--max-tokens-cap": self.max_tokens_cap, "--greedy": self.greedy or None,
            "--with-peers": self.with_peers or None,
        }  # fmt: skip
        return [flag for flag, value in flags.items() if value is not None]


@dataclass
class Plan:
    """One run directory to fill: where requests go and, for arms, what to launch first."""

    run: RunDir
    meta: RunMeta
    records: list[CorpusRecord]
    target: Target
    arm: ResolvedArm | None


@dataclass(frozen=True)
class ReplayPlan:
    """A whole replay: one plan per arm, all up at once with requests rotated among them
    (`interleave`), or one after another; `note` says why, for the person watching."""

    plans: list[Plan]
    interleave: bool
    note: str | None
    concurrency: int


@dataclass(frozen=True)
class _Pending:
    """A run planned but not created yet: what run.json will say besides the corpus and the counts."""

    label: str
    info: ArmInfo
    endpoint: str
    target: Target
    redactor: Redactor
    arm: ResolvedArm | None = None
    boot_per_run: bool = False
    api_key_env: str | None = None
    engine: EndpointInfo | None = None  # what a running endpoint said about itself


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


def _arm_target(arm: ResolvedArm, args: ReplayArgs) -> Target:
    """Where and how requests to a launched arm go: its request settings, the options' clocks, cap and
    greedy choice."""
    req = arm.config.request
    return Target(
        base_url=arm.base_url,
        api=args.api or req.api,
        model=arm.served_model_name,
        stream_options=req.stream_options,
        extra_body=req.extra_body,
        request_timeout_s=args.timeouts.silence_s,
        request_deadline_s=args.timeouts.deadline_s,
        api_key=arm.api_key,
        health_path=arm.config.readiness.health,
        max_tokens_cap=args.max_tokens_cap,
        greedy=args.greedy,
    )


def _arm_names(args: ReplayArgs) -> list[str]:
    """The arms to replay: the ones named, `--with-peers`' additions, the default three when neither an
    arm nor an endpoint is given."""
    arms = list(args.arms)
    if args.with_peers and args.endpoint:
        raise LumobenchError("--with-peers launches the vLLM CPU arms; it does not combine with --endpoint")
    if args.with_peers:
        arms = [*(arms or DEFAULT_ARMS), *(a for a in PEER_ARMS if a not in arms)]
    if len(arms) > 1 and args.endpoint:
        raise LumobenchError("--endpoint takes at most one --arm (the arm that is already running there)")
    if not arms and not args.endpoint:
        missing = [str(arm_path(a)) for a in DEFAULT_ARMS if not arm_path(a).is_file()]
        if missing:
            raise LumobenchError(
                f"the default arms ({', '.join(DEFAULT_ARMS)}) come with the LumoTree engine; missing arm "
                f"file(s): {', '.join(missing)}. Pass --arm NAME (e.g. --arm vllm-cpu-tiny) or --endpoint URL"
            )
        arms = list(DEFAULT_ARMS)
    return arms


def _endpoint_run(args: ReplayArgs, endpoint: str, arms: list[str], records: list[CorpusRecord]) -> _Pending:
    """The run against a server that is already running (with the arm that runs there, if named)."""
    if args.boot_per_run:
        raise LumobenchError("--boot-per-run needs arms that lumobench launches, not --endpoint")
    base = _normalise_endpoint(endpoint)
    running = None
    if arms:  # an arm already running at the endpoint: use its request settings, launch nothing
        config, source = load_arm(arms[0])
        running = resolve_arm(config, source, model=args.model, api_key_env=args.api_key_env)
        check_serves(running, records, args.corpus, greedy=args.greedy)
    key = running.api_key if running else api_key_from_env(args.api_key_env, "--endpoint")
    served = probe_endpoint(base, key)
    model = args.model or served.model
    redactor = (Redactor.for_arm(running) if running else Redactor()) | Redactor.for_launch(api_key=key)
    if running:
        target = replace(_arm_target(running, args), base_url=base, model=model)
        info = _arm_info(running, redactor).model_copy(
            update={"launched": False, "name": args.label or running.name}
        )
    else:
        target = Target(
            base_url=base,
            api=args.api or "chat",
            model=model,
            request_timeout_s=args.timeouts.silence_s,
            request_deadline_s=args.timeouts.deadline_s,
            api_key=key,
            max_tokens_cap=args.max_tokens_cap,
            greedy=args.greedy,
        )
        info = ArmInfo(name=args.label or "endpoint")
    key_env = running.api_key_env if running else args.api_key_env
    return _Pending(
        label=info.name,
        info=info,
        endpoint=redactor.text(base),
        target=target,
        redactor=redactor,
        api_key_env=key_env,
        engine=served,
    )


def _arm_runs(args: ReplayArgs, arms: list[str], records: list[CorpusRecord]) -> list[_Pending]:
    """The runs of arms that lumobench launches: each resolved, launchable, able to serve the corpus,
    on a port that is free now."""
    resolved = []
    for name in arms:
        config, source = load_arm(name)
        arm = resolve_arm(config, source, port=args.port, model=args.model, api_key_env=args.api_key_env)
        check_launchable(arm)
        check_serves(arm, records, args.corpus, greedy=args.greedy)
        resolved.append(arm)
    if any(a.config.request.api == "generate" for a in resolved):
        _require_input_ids(records)
    for address in sorted({(a.config.host, a.port) for a in resolved}):
        check_port_free(*address)
    return [
        _Pending(
            label=arm.name if not args.label else f"{args.label}-{arm.name}",
            info=_arm_info(arm, redactor := Redactor.for_arm(arm)),
            endpoint=arm.base_url,
            target=_arm_target(arm, args),
            redactor=redactor,
            arm=arm,
            boot_per_run=arm.config.boot_per_run if args.boot_per_run is None else args.boot_per_run,
            api_key_env=arm.api_key_env,
        )
        for arm in resolved
    ]


def _new_meta(run: _Pending, args: ReplayArgs, records: list[CorpusRecord], manifest: Path | None) -> RunMeta:
    """run.json of a new run: the command line and the arm, the corpus records and manifest it pins,
    the host."""
    assert args.corpus is not None
    target = run.target
    return RunMeta(
        argv=run.redactor.argv(sys.argv),
        arm=run.info,
        endpoint=run.endpoint,
        api=target.api,
        model=target.model,
        engine_version=run.engine.engine_version if run.engine else None,
        engine_config=run.engine.engine_config if run.engine else {},
        corpus=str(args.corpus.resolve()),  # absolute, so --resume works from any directory
        corpus_sha256=file_sha256(args.corpus),
        manifest=str(manifest.resolve()) if manifest else None,
        manifest_sha256=file_sha256(manifest) if manifest else None,
        request_ids=[r.id for r in records],
        record_sha256={r.id: record_sha256(r) for r in records},
        deterministic_ids=[r.id for r in records if target.greedy or r.is_deterministic],
        runs=args.runs or 1,
        concurrency=args.concurrency or 1,
        boot_per_run=run.boot_per_run,
        api_key_env=run.api_key_env,
        stream_options=target.stream_options,
        extra_body=target.extra_body,
        max_tokens_cap=target.max_tokens_cap,
        greedy=target.greedy,
        run_id=new_run_id(run.label),
        created=now_iso(),
        host=host_info(),
    )


def plan_replay(args: ReplayArgs) -> ReplayPlan:
    """The replay `args` ask for, validated up front; run directories are created last of all."""
    args.timeouts.check()
    if args.resume:
        if named := args.new_run_options():
            raise LumobenchError(
                f"--resume continues {args.resume} with its own settings; {', '.join(named)} cannot change "
                "them (start a new run instead)"
            )
        plans = _resume_group(args.resume, args)
        # an interleaved group resumes interleaved unless --sequential says otherwise
        interleave = bool(plans[0].meta.interleaved_with) and args.interleaved is not False
        return ReplayPlan(plans, interleave, None, plans[0].meta.concurrency)
    if args.corpus is None:
        raise LumobenchError("give a CORPUS file (or --resume RUN_DIR)")
    arms = _arm_names(args)
    records, manifest = select_records(args.corpus, args.manifest)
    if args.api == "generate":
        _require_input_ids(records)
    if args.endpoint:
        pending = [_endpoint_run(args, args.endpoint, arms, records)]
    else:
        pending = _arm_runs(args, arms, records)
    concurrency = args.concurrency or 1
    interleave, note = choose_mode(
        [p.arm for p in pending], args.interleaved, concurrency, available_memory_gb()
    )
    metas = [_new_meta(p, args, records, manifest) for p in pending]
    out = args.out or Path("results")
    runs = create_run_dirs(out, [(m, p.redactor) for p, m in zip(pending, metas, strict=True)])
    plans = [
        Plan(run, meta, records, p.target, p.arm) for run, meta, p in zip(runs, metas, pending, strict=True)
    ]
    return ReplayPlan(plans, interleave, note, concurrency)


def _resume(run_path: Path, args: ReplayArgs) -> Plan:
    """Reopen an interrupted run: same corpus records (checked by hash), same arm or endpoint.

    `args.port` launches the arm on this port instead of the run's (0: a free one); `args.api_key_env`
    names the variable holding the API key, instead of the one the run recorded; `args.corpus` is
    where the corpus is now (default: where it was). The run directory is locked first.
    """
    run = RunDir.open(run_path)
    run.lock()
    meta = run.read_meta()
    corpus = args.corpus or Path(meta.corpus)
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
    key_env = args.api_key_env or meta.api_key_env
    if meta.arm.launched:
        config, source = load_arm(meta.arm.config.get("file") or meta.arm.name)
        arm = resolve_arm(
            config,
            source,
            port=int(meta.endpoint.rsplit(":", 1)[1]) if args.port is None else args.port,
            model=meta.arm.config.get("model"),
            api_key_env=key_env,
        )
        if arm.source_sha256 != meta.arm.config_sha256:
            raise LumobenchError(f"arm file {source} changed since run {meta.run_id} started; resume refused")
        check_launchable(arm)
        check_port_free(arm.config.host, arm.port)
        run.redactor = Redactor.for_arm(arm)
        meta.endpoint, meta.api_key_env = arm.base_url, arm.api_key_env
        target = _arm_target(
            arm, replace(args, api=meta.api, max_tokens_cap=meta.max_tokens_cap, greedy=meta.greedy)
        )
        return Plan(run, meta, records, target, arm)
    if args.port is not None:
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
        request_timeout_s=args.timeouts.silence_s,
        request_deadline_s=args.timeouts.deadline_s,
        api_key=key,
        max_tokens_cap=meta.max_tokens_cap,
        greedy=meta.greedy,
    )
    return Plan(run, meta, records, target, None)


def _resume_group(run_path: Path, args: ReplayArgs) -> list[Plan]:
    """Plans to resume: the run itself, or every member of its interleaved group (sibling directories
    named in `interleaved_with`, in rotation order); a group's arms take only `--port 0` (each a free
    port of its own)."""
    meta = RunDir.open(run_path).read_meta()
    if not meta.interleaved_with:
        return [_resume(run_path, args)]
    if args.port not in (None, 0):
        raise LumobenchError(
            f"--port {args.port}: {run_path} was replayed interleaved with {len(meta.interleaved_with)} "
            "arms, each on its own port; resume it without --port, or with --port 0 (a free port for each)"
        )
    paths = [run_path.parent / run_id for run_id in meta.interleaved_with]
    if missing := [str(p) for p in paths if not (p / "run.json").is_file()]:
        raise LumobenchError(
            f"{run_path} was replayed interleaved with {', '.join(meta.interleaved_with)}; "
            f"missing: {', '.join(missing)} (keep the group's directories side by side)"
        )
    return [_resume(p, args) for p in paths]
