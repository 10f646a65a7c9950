"""Compile the native CPU forward (forward.c) once per machine and load it.

The shared library is built with the system C compiler (`cc`, or $CC) for this machine's CPU
(-march=native; $LUMOTREE_NATIVE_MARCH=<march> picks another target, e.g. `haswell` for the AVX2 +
FMA path on an AVX-512 machine) into a cache folder, under a name keyed by the source, the flags,
the compiler and the CPU, so a changed source, another compiler or another CPU (a shared home
folder) builds afresh. A build takes about two seconds; later loads are immediate. A library built
for a target whose vector extensions this CPU lacks is refused before it can run an illegal
instruction.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("forward.c")
BASE_FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared", "-Wno-psabi")
CACHE_ENV = "LUMOTREE_NATIVE_CACHE"
MARCH_ENV = "LUMOTREE_NATIVE_MARCH"
_MARCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
# x86 vector extensions a -march may enable, as the compiler's macros name them; /proc/cpuinfo names
# the same extensions with underscores (avx512_bf16) or without (avx512f)
_VECTOR_MACRO = re.compile(r"#define __((?:AVX|FMA|AMX|F16C)\w*?)__ 1")


class NativeBuildError(RuntimeError):
    """The native forward cannot be built or loaded here (the message says why)."""


def cache_dir() -> Path:
    """$LUMOTREE_NATIVE_CACHE, else $XDG_CACHE_HOME/lumotree, else ~/.cache/lumotree."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lumotree"


def march() -> str:
    """The -march target: $LUMOTREE_NATIVE_MARCH, else `native`."""
    value = os.environ.get(MARCH_ENV) or "native"
    if not _MARCH.fullmatch(value):
        raise NativeBuildError(
            f"{MARCH_ENV}={value!r} is not a -march value (e.g. native, haswell, x86-64-v3)"
        )
    return value


def flags(target: str) -> tuple[str, ...]:
    """The compiler flags of a build for -march=`target`."""
    return (*BASE_FLAGS, f"-march={target}")


def _cpu_flags() -> str:
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


def _first_error(log: str) -> str:
    """The compiler's first error line without its file position (a log is long; this says it)."""
    for line in log.splitlines():
        if "error" in line:
            return line.split("error:", 1)[-1].strip().removeprefix("#error").strip().strip('"')
    return log.strip()[-300:]


def _missing_extensions(cc: str, target: str) -> list[str]:
    """Vector extensions -march=`target` lets the compiler use that this x86 CPU lacks."""
    cpu = _cpu_flags()
    if target == "native" or not cpu.startswith("flags"):
        return []
    proc = subprocess.run(
        [cc, f"-march={target}", "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True
    )
    have = {f.replace("_", "").lower() for f in cpu.split(":", 1)[-1].split()}
    wanted = sorted({m.replace("_", "").lower() for m in _VECTOR_MACRO.findall(proc.stdout)})
    return [ext for ext in wanted if ext not in have]


def library_path() -> Path:
    """The cached library's path for this source, compiler, target and CPU (built if missing)."""
    cc, target = _compiler(), march()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NativeBuildError(f"C compiler {cc} does not run: {exc}") from exc
    build_flags = flags(target)
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), *build_flags, version, _cpu_flags()]).encode()
    ).hexdigest()[:16]
    target_path = cache_dir() / f"lumotree-native-{key}.so"
    if not target_path.is_file():
        target_path.parent.mkdir(parents=True, exist_ok=True)
        # build beside the target and rename: concurrent builders never load a half-written file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target_path.parent)
        os.close(fd)
        proc = subprocess.run(
            [cc, *build_flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            os.unlink(tmp)
            raise NativeBuildError(
                f"building {SOURCE.name} for -march={target} failed: {_first_error(proc.stderr)}"
            )
        os.replace(tmp, target_path)
    return target_path


@cache
def _load(path: Path, target: str) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeBuildError(f"cannot load the native forward built for -march={target}: {exc}") from exc
    lib.lt_isa.restype = ctypes.c_char_p
    return lib


def load_library() -> ctypes.CDLL:
    """The native forward library for $LUMOTREE_NATIVE_MARCH (built on first use, one load per
    target); NativeBuildError if it cannot be built, loaded, or run on this CPU."""
    path, target = library_path(), march()
    missing = _missing_extensions(_compiler(), target)
    if missing:
        raise NativeBuildError(f"-march={target} uses {', '.join(missing)}, which this CPU lacks")
    return _load(path, target)


def isa() -> str:
    """The kernel path of the library load_library() gives: avx512, avx2 or neon."""
    return load_library().lt_isa().decode()
