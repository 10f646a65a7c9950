"""Qwen Code, the agent: install a pinned npm release once into a cache, give each run its own HOME and
settings, run it headless under a wall budget, and read its own report (stream-json events).

Measured facts this relies on (notes/environment.md): 0.15.10 is the newest release for Node 20;
`OPENAI_BASE_URL` must end in `/v1`; it rewrites `~/.qwen/settings.json`; it waits on an open stdin;
it re-spawns itself as a child; an unreachable server makes it exit 0 with an "[API Error: ...]" result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lumobench.agent.paths import AGENTS_DIR, CACHE_DIR
from lumobench.agent.process import ProcessOutcome, run_budgeted
from lumobench.errors import LumobenchError

PACKAGE = "@qwen-code/qwen-code"
DEFAULT_VERSION = "0.15.10"
INSTALL_CACHE = CACHE_DIR / "qwen-code"
SETTINGS_TEMPLATE = AGENTS_DIR / "qwen-code" / "settings.json"
API_ERROR_PREFIX = "[API Error"
_NPM_PREFIX = re.compile(r"^npm (?:error|ERR!) ?")
# npm's lines that say nothing about the cause: stack frames, fields of an error object, the log hint
_NPM_NOISE = re.compile(r"^(at |code |syscall |errno |A complete log of this run|[{}]|\w+: ['\d])")


def _cli_path(root: Path) -> Path:
    return root / "node_modules" / PACKAGE / "cli.js"


def _installed_version(root: Path) -> str | None:
    try:
        return json.loads((root / "node_modules" / PACKAGE / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def node_version() -> tuple[int, int, int]:
    """The (major, minor, patch) of `node` on PATH; `LumobenchError` if Node.js is missing."""
    node = shutil.which("node")
    if node is None:
        raise LumobenchError("Node.js is not on PATH: Qwen Code needs Node >= 20 (and npm to install it)")
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    match = re.match(r"v(\d+)\.(\d+)\.(\d+)", out.strip())
    if not match:
        raise LumobenchError(f"cannot read the Node.js version from `node --version`: {out.strip()!r}")
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def _check_engines(root: Path, version: str) -> None:
    """Refuse a release whose `engines.node` lower bound (the `>=X.Y.Z` form npm packages use) is above
    the installed Node; other range forms are left to npm's own warning."""
    engines = json.loads((root / "node_modules" / PACKAGE / "package.json").read_text()).get("engines", {})
    match = re.fullmatch(r"\s*>=\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*", engines.get("node", ""))
    if match:
        needed = tuple(int(g or 0) for g in match.groups())
        have = node_version()
        if have < needed:
            raise LumobenchError(
                f"Qwen Code {version} needs Node {engines['node']}, this machine has "
                f"{'.'.join(map(str, have))} (0.15.10 is the newest release for Node 20)"
            )


def npm_failure(stderr: str, returncode: int) -> str:
    """What went wrong, in one line, from npm's stderr: its error code and first message
    (`ETARGET: No matching version found for ...`), never the "complete log" pointer."""
    lines = [_NPM_PREFIX.sub("", line).strip() for line in stderr.splitlines() if _NPM_PREFIX.match(line)]
    code = next((line.split()[1] for line in lines if line.startswith("code ") and " " in line), None)
    messages = [line for line in lines if line and not _NPM_NOISE.match(line)]
    # npm prefixes continued messages with a lowercase category ("notarget No matching ...")
    message = re.sub(r"^[a-z0-9]+ (?=[A-Z])", "", messages[0]) if messages else ""
    if not (code or message):
        rest = [line.strip() for line in stderr.splitlines() if line.strip()]
        return rest[-1] if rest else f"npm exit {returncode}"
    return ": ".join(part for part in (code, message) if part)


def ensure_qwen_code(version: str = DEFAULT_VERSION, cache: Path = INSTALL_CACHE) -> Path:
    """Path of Qwen Code's `cli.js` for `version`, installing it with npm into `cache/<version>` if absent.

    The install goes to a temporary folder that is renamed into place only when complete, so an
    interrupted install is never mistaken for a finished one.
    """
    root = cache / version
    if _installed_version(root) == version and _cli_path(root).is_file():
        _check_engines(root, version)
        return _cli_path(root)
    node_version()
    npm = shutil.which("npm")
    if npm is None:
        raise LumobenchError("npm is not on PATH: it is needed once to install Qwen Code")
    staging = cache / f".{version}.installing-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        out = subprocess.run(
            [
                npm,
                "install",
                "--prefix",
                str(staging),
                "--no-audit",
                "--no-fund",
                "--save-exact",
                "--loglevel=error",
                f"{PACKAGE}@{version}",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
        )
        if out.returncode != 0 or _installed_version(staging) != version:
            why = npm_failure(out.stderr, out.returncode)
            raise LumobenchError(f"installing {PACKAGE}@{version} with npm failed: {why}")
        _check_engines(staging, version)
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _cli_path(root)


def write_settings(
    home: Path,
    model: str,
    sampling: dict[str, Any],
    budget_s: float,
    context_window: int | None = None,
) -> Path:
    """Write `home/.qwen/settings.json` from the shipped template: the arm's model and sampling (which
    must include `max_tokens`, the response cap), a request timeout of the whole wall budget (Qwen
    Code's default, 120 s, abandons and resends any slower answer, which a CPU arm's long prompts
    always are) and, when known, the arm's context window (so it compresses its history before the
    arm refuses it). Returns the settings path."""
    settings = json.loads(SETTINGS_TEMPLATE.read_text())
    settings["model"]["name"] = model
    generation = settings["model"]["generationConfig"]
    generation["samplingParams"] = dict(sampling)
    generation["timeout"] = max(1, round(budget_s * 1000))  # milliseconds
    if context_window is not None:
        generation["contextWindowSize"] = context_window
    path = home / ".qwen" / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")
    return path


@dataclass
class AgentReport:
    """What Qwen Code reported about its own run (its stream-json events).

    `requests` counts model responses it received (API-error turns excluded), `output_tokens` sums
    their usage; `result` is None when the final result event never came (killed or crashed)."""

    requests: int = 0
    output_tokens: int = 0
    tool_calls: int = 0
    api_errors: list[str] = field(default_factory=list)
    result: str | None = None
    result_is_error: bool = False
    num_turns: int | None = None


def parse_stream(path: Path) -> AgentReport:
    """Read Qwen Code's `-o stream-json` output (one JSON event per line; a torn last line is ignored)."""
    report = AgentReport()
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return report
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "assistant":
            message = event.get("message") or {}
            parts = message.get("content") or []
            texts = [p.get("text", "") for p in parts if p.get("type") == "text"]
            errors = [t for t in texts if t.startswith(API_ERROR_PREFIX)]
            if errors:
                report.api_errors.extend(errors)
                continue
            report.requests += 1
            report.output_tokens += int((message.get("usage") or {}).get("output_tokens") or 0)
            report.tool_calls += sum(1 for p in parts if p.get("type") == "tool_use")
        elif kind == "result":
            report.result = str(event.get("result", ""))
            report.result_is_error = bool(event.get("is_error"))
            report.num_turns = event.get("num_turns")
            if report.result.startswith(API_ERROR_PREFIX) and report.result not in report.api_errors:
                report.api_errors.append(report.result)
    return report


@dataclass(frozen=True)
class AgentEndpoint:
    """The OpenAI-compatible endpoint the agent talks to (`base_url` ends in /v1)."""

    base_url: str
    model: str
    api_key: str = "lumobench"


def run_qwen_code(
    cli: Path,
    workdir: Path,
    prompt: str,
    endpoint: AgentEndpoint,
    sampling: dict[str, Any],
    log_dir: Path,
    budget_s: float,
    on_tick: Callable[[float], None] | None = None,
    context_window: int | None = None,
) -> tuple[ProcessOutcome, AgentReport]:
    """Run Qwen Code headless (yolo approval) on `workdir` with `prompt`, its own HOME under `log_dir`
    (settings, chat recordings, debug logs stay there) and output in `log_dir/agent.{jsonl,stderr}`.
    Paths are made absolute: the agent runs inside `workdir`."""
    log_dir, workdir = log_dir.absolute(), workdir.absolute()
    home = log_dir / "home"
    write_settings(home, endpoint.model, sampling, budget_s, context_window)
    base_url = endpoint.base_url.rstrip("/")
    env = {
        **os.environ,
        "HOME": str(home),
        "OPENAI_BASE_URL": base_url if base_url.endswith("/v1") else base_url + "/v1",
        "OPENAI_API_KEY": endpoint.api_key,
        "OPENAI_MODEL": endpoint.model,
        "NO_COLOR": "1",
        "NO_BROWSER": "1",
    }
    # --prompt=VALUE keeps a problem statement that starts with "-" from being read as an option
    argv = [
        shutil.which("node") or "node",
        str(cli),
        "--yolo",
        "--output-format",
        "stream-json",
        f"--prompt={prompt}",
    ]
    stream = log_dir / "agent.jsonl"
    outcome = run_budgeted(argv, workdir, env, stream, log_dir / "agent.stderr", budget_s, on_tick=on_tick)
    return outcome, parse_stream(stream)
