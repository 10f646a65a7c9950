"""Serving arms: the TOML model of `serving/arms/*.toml` and its resolution into a command line.

An arm file names an engine, a command template, a port, environment variables, readiness URLs and
request settings. Strings in `command`, `model` and `env` may use

    {python} {repo} {host} {port} {model} {served_model_name} {speculative_config}
    ${VAR}  ${VAR:-default}          (environment variables; the default may use {repo})

so one file works on every checkout. `lumobench serve ARM` and `lumobench replay --arm ARM` use it.
A keyed arm names the environment variable holding its API key (`api_key_env`): the server reads it
from its inherited environment, lumobench sends it as `Authorization: Bearer KEY` on every request and
readiness probe, and only the variable's name is ever written down.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lumobench.corpus import CorpusRecord
from lumobench.errors import LumobenchError

REPO_ROOT = Path(__file__).resolve().parents[1]
ARMS_DIR_ENV = "LUMOBENCH_ARMS_DIR"
# ${NAME} or ${NAME:-default}; the default may itself contain {placeholders}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-((?:[^{}]|\{\w+\})*))?\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Readiness(_Strict):
    """Readiness is `health` answering 200, then `models` listing the served model, within `timeout_s`."""

    health: str = "/health"
    models: str = "/v1/models"
    timeout_s: float = Field(default=300.0, gt=0)


class RequestSettings(_Strict):
    """How replay talks to this arm: the API, extra `stream_options` and extra body fields."""

    api: Literal["chat", "generate"] = "chat"
    stream_options: dict[str, Any] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)


class Limits(_Strict):
    """What an arm cannot serve; replay refuses such a corpus before it sends anything."""

    greedy_only: bool = False  # every record must set temperature 0
    why: str = ""  # one line for the refusal, e.g. the engine bug and where it is written up


class ArmConfig(_Strict):
    name: str
    engine: str  # vllm, sglang, lumotree, scripted, ...
    description: str = ""
    model: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    #: environment variable holding the API key the server requires (e.g. VLLM_API_KEY); None: no key
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    readiness: Readiness = Field(default_factory=Readiness)
    request: RequestSettings = Field(default_factory=RequestSettings)
    speculative: dict[str, Any] | None = None
    requires_gpu: bool = False
    #: start a fresh server for every repetition (the paper boots the tree arm per run): an engine that
    #: learns from earlier outputs (LumoTree's suffix cache) would otherwise draft the repetition's
    #: answers from the previous one's
    boot_per_run: bool = False
    #: shown when the command's program or the model path does not exist (how to build them)
    setup_hint: str | None = None
    #: resident memory of the running arm's whole process group (GiB, measured): an interleaved replay
    #: boots its arms together only when their sum fits the memory available; None = unknown
    memory_gb: float | None = Field(default=None, gt=0)
    limits: Limits = Field(default_factory=Limits)


@dataclass(frozen=True)
class ResolvedArm:
    """An arm with every template filled in: ready to launch."""

    config: ArmConfig
    argv: list[str]
    env: dict[str, str]  # only the arm's own variables (merged over os.environ at launch)
    model: str | None
    served_model_name: str | None  # what requests name as "model" (None: ask /v1/models)
    base_url: str
    source: Path | None
    source_sha256: str | None
    api_key: str | None = field(default=None, repr=False)  # api_key_env's value, in memory only
    api_key_env: str | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])


def arms_dir() -> Path:
    return Path(os.environ.get(ARMS_DIR_ENV) or REPO_ROOT / "serving" / "arms")


def known_arms(directory: Path | None = None) -> list[str]:
    directory = directory or arms_dir()
    return sorted(p.stem for p in directory.glob("*.toml"))


def arm_path(name_or_path: str, directory: Path | None = None) -> Path:
    """`NAME` → `<arms dir>/NAME.toml`; anything ending in .toml is taken as a path."""
    if name_or_path.endswith(".toml"):
        return Path(name_or_path)
    return (directory or arms_dir()) / f"{name_or_path}.toml"


def load_arm(name_or_path: str, directory: Path | None = None) -> tuple[ArmConfig, Path]:
    """Read and validate one arm file; an unknown name lists the known arms."""
    path = arm_path(name_or_path, directory)
    if not path.is_file():
        known = ", ".join(known_arms(path.parent)) or "none"
        raise LumobenchError(f"unknown arm {name_or_path!r}: {path} does not exist (known arms: {known})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise LumobenchError(f"{path}: not valid TOML ({exc})") from None
    data.setdefault("name", path.stem)
    try:
        return ArmConfig.model_validate(data), path
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise LumobenchError(f"{path}: {field}: {err['msg']}") from None


def _expand_env(text: str, arm: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is None:
            raise LumobenchError(f"arm {arm} needs the environment variable {name}")
        return default

    return _ENV_REF.sub(sub, text)


def _fill(text: str, fields: dict[str, str], arm: str, env: dict[str, str]) -> str:
    text = _expand_env(text, arm, env)
    try:
        return text.format(**fields)
    except KeyError as exc:
        raise LumobenchError(f"arm {arm}: unknown placeholder {{{exc.args[0]}}} in {text!r}") from None


def free_port(host: str) -> int:
    """A port nobody listens on now (the OS picks it); the server binds it moments later."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def api_key_from_env(name: str | None, who: str, environ: dict[str, str] | None = None) -> str | None:
    """The API key held by the environment variable `name` (None when no variable is named)."""
    if name is None:
        return None
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise LumobenchError(f"{who}: {name!r} is not an environment variable name (--api-key-env NAME)")
    key = (os.environ if environ is None else environ).get(name)
    if not key:
        raise LumobenchError(f"{who} needs its API key in the environment variable {name}, which is not set")
    return key


def resolve_arm(
    config: ArmConfig,
    source: Path | None = None,
    *,
    port: int | None = None,
    model: str | None = None,
    environ: dict[str, str] | None = None,
    api_key_env: str | None = None,
) -> ResolvedArm:
    """Fill the arm's templates; `port`/`model` override the file (the CLI's --port/--model), port 0
    picks a free port; `api_key_env` overrides the arm's (the CLI's --api-key-env)."""
    environ = dict(os.environ if environ is None else environ)
    if port == 0:
        port = free_port(config.host)
    port = port or config.port
    fields = {"python": sys.executable, "repo": str(REPO_ROOT), "host": config.host, "port": str(port)}
    resolved_model = model or (config.model and _fill(config.model, fields, config.name, environ))
    fields["model"] = resolved_model or ""
    served = config.served_model_name and _fill(config.served_model_name, fields, config.name, environ)
    fields["served_model_name"] = served or resolved_model or ""
    fields["speculative_config"] = json.dumps(config.speculative or {}, separators=(",", ":"))
    env = {k: _fill(v, fields, config.name, environ) for k, v in config.env.items()}
    argv = [_fill(part, fields, config.name, environ | env) for part in config.command]
    digest = hashlib.sha256(source.read_bytes()).hexdigest() if source else None
    key_env = api_key_env or config.api_key_env
    key = api_key_from_env(key_env, f"arm {config.name}", environ | env)
    return ResolvedArm(
        config=config,
        argv=argv,
        env=env,
        model=resolved_model,
        served_model_name=served or resolved_model,
        base_url=f"http://{config.host}:{port}",
        source=source,
        source_sha256=digest,
        api_key=key,
        api_key_env=key_env,
    )


def check_launchable(arm: ResolvedArm) -> None:
    """Fail early, with the arm's setup hint, when its program, model or GPU is missing."""
    hint = f" ({arm.config.setup_hint})" if arm.config.setup_hint else ""
    program = arm.argv[0]
    if shutil.which(program) is None:
        raise LumobenchError(f"arm {arm.name}: program {program} not found{hint}")
    # only filesystem paths are checked; hub-style ids ("org/name") are left to the engine
    if arm.model and arm.model.startswith(("/", "./", "../")) and not Path(arm.model).exists():
        raise LumobenchError(f"arm {arm.name}: model path {arm.model} does not exist{hint}")
    if arm.config.requires_gpu and shutil.which("nvidia-smi") is None:
        raise LumobenchError(f"arm {arm.name} needs an NVIDIA GPU (engine {arm.config.engine}){hint}")


def check_serves(
    arm: ResolvedArm, records: Sequence[CorpusRecord], corpus: Path | None, greedy: bool = False
) -> None:
    """Refuse, before anything is sent, a corpus with requests the arm cannot serve (its `[limits]`);
    `greedy`: every request will be sent as greedy decoding (`replay --greedy`)."""
    limits = arm.config.limits
    if limits.greedy_only and not greedy and (sampled := [r.id for r in records if not r.is_greedy]):
        shown = ", ".join(sampled[:3]) + (", ..." if len(sampled) > 3 else "")
        why = f" ({limits.why})" if limits.why else ""
        raise LumobenchError(
            f"arm {arm.name} serves greedy requests only{why}; {len(sampled)} of {len(records)} records of "
            f"{corpus} sample or leave temperature unset ({shown}): replay with --greedy (every request "
            f"sent as greedy decoding) or a greedy corpus such as corpora/demo-greedy.jsonl"
        )
