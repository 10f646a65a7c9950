"""Compile the native CPU forward (forward.c) once per machine and load it.

The shared library is built with the system C compiler (`cc`, or $CC) for this machine's CPU
(-march=native) into a cache folder, under a name keyed by the source, the flags, the compiler and
the CPU, so a changed source, another compiler or another CPU (a shared home folder) builds afresh.
A build takes about two seconds; later loads are immediate.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("forward.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared", "-Wno-psabi")
CACHE_ENV = "LUMOTREE_NATIVE_CACHE"


class NativeBuildError(RuntimeError):
    """The native forward cannot be built or loaded here (the message says why)."""


def cache_dir() -> Path:
    """$LUMOTREE_NATIVE_CACHE, else $XDG_CACHE_HOME/lumotree, else ~/.cache/lumotree."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lumotree"


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeBuildError("no C compiler found (set CC or install gcc)")
    return cc


def library_path() -> Path:
    """The cached library's path for this source, compiler and CPU (built if missing)."""
    cc = _compiler()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NativeBuildError(f"C compiler {cc} does not run: {exc}") from exc
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), *FLAGS, version, _cpu_signature()]).encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"lumotree-native-{key}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        # build beside the target and rename: concurrent builders never load a half-written file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise NativeBuildError(f"building {SOURCE.name} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    return target


@cache
def load_library() -> ctypes.CDLL:
    """The native forward library (built on first use); NativeBuildError if it cannot be."""
    try:
        return ctypes.CDLL(str(library_path()))
    except OSError as exc:
        raise NativeBuildError(f"cannot load the native forward: {exc}") from exc
