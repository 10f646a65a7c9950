"""One cached virtual environment per task `version` for grading without Docker (`lumobench evaluate
--local`): SWE-bench's environment specs for Astropy, the adaptations they need on the Python here,
and the build.

An environment is `.cache/local-eval/<owner__name>-<version>/`: `venv/` (the spec's pinned packages and
the build requirements), `src/` (a checkout of the repository, installed into the venv editable with
its C extensions built in place), `build.log` and `env.json` (the outcome, pins and adaptations; a
failed build is remembered there with its one-line reason until `--rebuild`). `src/` reads the
mirror's objects in place (alternates) and never writes objects, so the mirror is only read. Each
grade checks its task's base commit out in `src/` and rebuilds only the extensions whose sources
changed (seconds), instead of the build's minutes.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from lumobench.agent.paths import CACHE_DIR
from lumobench.agent.process import run_budgeted
from lumobench.agent.repos import borrow, git, mirror_objects
from lumobench.errors import LumobenchError

#: Where SWE-bench's specs were read: swebench 5 ships none (its records carry an eval script and a
#: prebuilt image name instead), so they come from the last release that has them.
SPECS_SOURCE = "swebench 4.1.0, swebench/harness/constants/python.py: SPECS_ASTROPY"
#: SPECS_ASTROPY[v]["pip_packages"] for v in 3.0 ... 5.2 (one list for all of them).
ASTROPY_PIP_PACKAGES = (
    "attrs==23.1.0",
    "exceptiongroup==1.1.3",
    "execnet==2.0.2",
    "hypothesis==6.82.6",
    "iniconfig==2.0.0",
    "numpy==1.25.2",
    "packaging==23.1",
    "pluggy==1.3.0",
    "psutil==5.9.5",
    "pyerfa==2.0.0.3",
    "pytest-arraydiff==0.5.0",
    "pytest-astropy-header==0.2.2",
    "pytest-astropy==0.10.0",
    "pytest-cov==4.1.0",
    "pytest-doctestplus==1.0.0",
    "pytest-filter-subpackage==0.1.2",
    "pytest-mock==3.11.1",
    "pytest-openfiles==0.5.0",
    "pytest-remotedata==0.4.0",
    "pytest-xdist==3.3.1",
    "pytest==7.4.0",
    "PyYAML==6.0.1",
    "setuptools==68.0.0",
    "sortedcontainers==2.4.0",
    "tomli==2.0.1",
)
#: The versions whose spec is Python 3.9 with the pins above, `pip install -e .[test]` and the
#: pre-install step below (SPECS_ASTROPY 4.1-5.2; v5.3 wants 3.10 and newer pins of its own).
ASTROPY_VERSIONS = ("4.1", "4.2", "4.3", "5.0", "5.1", "5.2")
SPEC_PYTHON = "3.9"
#: SPECS_ASTROPY[v]["pre_install"]: pin setuptools in pyproject's build requires.
PRE_INSTALL = (
    'sed -i \'s/requires = \\["setuptools",/requires = \\["setuptools==68.0.0",/\' pyproject.toml',
)
#: SPECS_ASTROPY[v]["install"], here without build isolation (see ADAPTATIONS).
INSTALL = (
    "-m",
    "pip",
    "install",
    "-e",
    ".[test]",
    "--verbose",
    "--no-build-isolation",
    "--disable-pip-version-check",
)
#: What each grade runs after applying the patch (see ADAPTATIONS).
REBUILD = ("setup.py", "build_ext", "--inplace")
#: pyproject.toml's build requires at the base commits of the paper's tasks (setuptools, setuptools_scm
#: >= 6.2, wheel, cython==0.29.22 at 4.3 and 0.29.30 at 5.1, oldest-supported-numpy, extension-helpers),
#: pinned as the adaptations say; numpy and setuptools are the spec's pins.
BUILD_REQUIREMENTS = ("cython==0.29.30", "setuptools_scm==7.1.0", "wheel==0.41.2", "extension-helpers==1.0.0")
#: The longest a venv install or the package's build may take (a 2-core machine builds Astropy in ~3 min).
BUILD_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Adaptation:
    """One way the environment differs from SWE-bench's spec, and why."""

    what: str
    why: str


ADAPTATIONS = (
    Adaptation(
        f"Python {sys.version.split()[0]} (the one running lumobench) instead of the spec's {SPEC_PYTHON}",
        "it is the Python here; every pinned package installs on it",
    ),
    Adaptation(
        "pip install -e .[test] --no-build-isolation, with pyproject's build requirements installed into "
        f"the venv beforehand ({', '.join(BUILD_REQUIREMENTS)}; numpy and setuptools are the spec's pins)",
        "the build needs no fresh isolated environment from PyPI at each grade, and the extensions compile "
        "against the numpy they run with (isolation would take oldest-supported-numpy's 1.23.2 on 3.11)",
    ),
    Adaptation(
        "cython==0.29.30 where pyproject pins cython==0.29.22 (the 4.3 tasks' base commits)",
        "0.29.22's generated C includes longintrepr.h, which CPython 3.11 moved: the build fails",
    ),
    Adaptation(
        "setuptools_scm, wheel and extension-helpers (unpinned in pyproject) pinned to releases of mid-2023",
        "the spec's pins date from then; PyPI's newest would make the build depend on the day",
    ),
    Adaptation(
        "SETUPTOOLS_SCM_PRETEND_VERSION=<version>.dev0 while building and testing",
        "the mirror is shallow and has no tags: setuptools_scm would name the tree 0.1.dev1 and warn "
        "'is shallow' at every import of astropy",
    ),
    Adaptation(
        "the editable install is made once per version; each grade runs `python setup.py build_ext "
        "--inplace` after applying the patch, where the eval script runs `pip install -e .[test]` again",
        "the build is incremental: it recompiles only the extensions whose sources the base commit or the "
        "patch changed, so the tree under test is the same and a grade takes seconds",
    ),
)


@dataclass(frozen=True)
class LocalEnv:
    """A built environment: `root` holds `venv/` and `src/`."""

    repo: str
    version: str
    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    def environ(self) -> dict[str, str]:
        """The environment of builds and test runs: the venv first on PATH, its own HOME (astropy
        keeps config and caches there), the pretended version."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
        env.update(
            PATH=f"{self.python.parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
            VIRTUAL_ENV=str(self.root / "venv"),
            HOME=str(self.root / "home"),
            SETUPTOOLS_SCM_PRETEND_VERSION=f"{self.version}.dev0",
        )
        return env


def env_root(repo: str, version: str, cache_dir: Path = CACHE_DIR / "local-eval") -> Path:
    return cache_dir / f"{repo.replace('/', '__')}-{version}"


def unsupported(repo: str, version: str) -> str | None:
    """Why local grading has no spec for this repository version (None when it has one)."""
    if repo != "astropy/astropy":
        return f"local grading knows SWE-bench's specs for astropy/astropy only, not {repo}"
    if version not in ASTROPY_VERSIONS:
        known = ", ".join(ASTROPY_VERSIONS)
        return f"local grading has no spec for astropy/astropy version {version!r} (it has {known})"
    return None


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold `root`'s lock (waiting for another grader using the same environment)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[-1][:300]


def _step(argv: list[str], env: LocalEnv, log: Path, what: str) -> None:
    """Run one build step in `src/`, appending its output to `log`; a failure raises its one line."""
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    outcome = run_budgeted(argv, env.src, env.environ(), out, err, BUILD_TIMEOUT_S)
    with log.open("a") as whole:
        whole.write(f"$ {' '.join(argv)}\n{out.read_text(errors='replace')}{err.read_text(errors='replace')}")
    reason = _last_line(err) if err.stat().st_size else _last_line(out)
    out.unlink()
    err.unlink()
    if outcome.timed_out:
        raise LumobenchError(f"{what} took longer than {BUILD_TIMEOUT_S:.0f} s (see {log})")
    if outcome.exit_code != 0:
        raise LumobenchError(f"{what} failed (exit {outcome.exit_code}): {reason} (see {log})")


def _build(env: LocalEnv, mirror: Path, base_commit: str, log: Path) -> None:
    argv = [sys.executable, "-m", "venv", str(env.root / "venv")]
    venv = subprocess.run(argv, capture_output=True, text=True)
    if venv.returncode != 0:
        raise LumobenchError(f"python -m venv failed: {venv.stderr.strip()[-300:]}")
    pip = [str(env.python), "-m", "pip", "install", "--disable-pip-version-check"]
    borrow(mirror, env.src)
    _step([*pip, *ASTROPY_PIP_PACKAGES, *BUILD_REQUIREMENTS], env, log, "installing the spec's pins")
    checkout(env, mirror, base_commit)
    for command in PRE_INSTALL:
        _step(["bash", "-c", command], env, log, "the spec's pre-install step")
    _step([str(env.python), *INSTALL], env, log, f"pip install -e .[test] of {env.repo} {env.version}")
    # the editable install compiles in a temporary folder: build once more into build/, so that each
    # grade's build_ext --inplace finds its objects there and recompiles only what changed
    _step([str(env.python), *REBUILD], env, log, "the first build_ext --inplace")
    git(["checkout", "--quiet", "--", "."], cwd=env.src)  # the pre-install edit is redone at each grade


def checkout(env: LocalEnv, mirror: Path, base_commit: str) -> None:
    """`src/` at `base_commit`, clean but for ignored build products (extensions, generated C), so the
    next build is incremental; reads objects from `mirror` (where it is now)."""
    (env.src / ".git" / "objects" / "info" / "alternates").write_text(f"{mirror_objects(mirror)}\n")
    git(["checkout", "--quiet", "--force", "--detach", base_commit], cwd=env.src)
    git(["clean", "--quiet", "--force", "-d"], cwd=env.src)


def ensure_env(
    repo: str, version: str, mirror: Path, base_commit: str, cache_dir: Path, rebuild: bool = False
) -> LocalEnv:
    """The environment of `repo` at `version`, built once (from the task at `base_commit`) and cached;
    raises the one-line reason when it cannot be built (remembered until `rebuild`). The caller holds
    `locked(env_root(...))`."""
    if why := unsupported(repo, version):
        raise LumobenchError(why)
    env = LocalEnv(repo, version, env_root(repo, version, cache_dir))
    state = env.root / "env.json"
    if state.is_file() and not rebuild:
        built = json.loads(state.read_text())
        if built["status"] == "ok":
            return env
        raise LumobenchError(f"{built['reason']} (an earlier build; --rebuild tries again)")
    shutil.rmtree(env.root, ignore_errors=True)
    (env.root / "home").mkdir(parents=True)
    log = env.root / "build.log"
    log.write_text("")
    started = time.monotonic()
    record = {
        "repo": repo,
        "version": version,
        "python": sys.version.split()[0],
        "built_from": base_commit,
        "specs": SPECS_SOURCE,
        "pip_packages": ASTROPY_PIP_PACKAGES,
        "build_requirements": BUILD_REQUIREMENTS,
        "adaptations": [asdict(a) for a in ADAPTATIONS],
    }
    try:
        _build(env, mirror, base_commit, log)
    except LumobenchError as exc:
        state.write_text(json.dumps({**record, "status": "failed", "reason": str(exc)}, indent=1) + "\n")
        raise
    seconds = round(time.monotonic() - started, 1)
    freeze = [str(env.python), "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"]
    installed = subprocess.run(freeze, capture_output=True, text=True, env=env.environ()).stdout.split()
    record.update(status="ok", build_s=seconds, installed=installed)  # the unpinned dependencies too
    state.write_text(json.dumps(record, indent=1) + "\n")
    return env
