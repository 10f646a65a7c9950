"""The native forward's structures (forward.c) and their ctypes mirror (model.py) have one layout:
every structure's size and every field's offset, as the host build, the AVX2 build and the ARM64
build (run under qemu-user, as remote.py runs it) were compiled; and a mirror that differs is named
and refused before any call."""

from __future__ import annotations

import ctypes
import platform
import subprocess
from pathlib import Path

import pytest

from lumotree.model.native import build
from lumotree.model.native import model as native_model
from lumotree.model.native.model import c_layout, layout_mismatches
from tests.model.conftest import QEMU

STRUCTS = ("Linear", "Layer", "Model", "Rows")


@pytest.mark.parametrize("march", ["native", "haswell"])
def test_the_ctypes_mirror_has_the_layout_the_library_was_built_with(
    march: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if march == "haswell" and platform.machine() != "x86_64":
        pytest.skip("the AVX2 build is x86-64 only")
    monkeypatch.setenv(build.MARCH_ENV, march)
    table = c_layout(build.load_library())
    assert set(STRUCTS) <= table.keys() and "Model.draft_n" in table and "Rows.anc_stride" in table
    assert layout_mismatches(table) == []


def test_the_arm64_build_has_the_mirror_layout(neon_driver: Path) -> None:
    run = subprocess.run([QEMU, str(neon_driver), "--layout"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    table = {name: int(value) for name, value in (line.split() for line in run.stdout.splitlines())}
    assert set(STRUCTS) <= table.keys()
    assert layout_mismatches(table) == []


class _SwappedLinear(ctypes.Structure):
    _fields_ = [("k", ctypes.c_int32), ("n_pad", ctypes.c_int32), ("w", ctypes.c_void_p)]


class _WiderLinear(ctypes.Structure):
    _fields_ = [("n_pad", ctypes.c_int64), ("k", ctypes.c_int32), ("w", ctypes.c_void_p)]


class _ShortLinear(ctypes.Structure):
    _fields_ = [("n_pad", ctypes.c_int32), ("k", ctypes.c_int32)]


@pytest.mark.parametrize(
    ("mirror", "named"),
    [
        (_SwappedLinear, ["Linear.k: C 4, ctypes 0", "Linear.n_pad: C 0, ctypes 4"]),
        (_WiderLinear, ["Linear.k: C 4, ctypes 8", "Linear.w: C 8, ctypes 16"]),
        (_ShortLinear, ["Linear.w: C 8, ctypes missing"]),
    ],
)
def test_a_mirror_that_differs_is_named_and_refused(
    mirror: type[ctypes.Structure], named: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(native_model._MIRRORS, "Linear", mirror)
    table = c_layout(build.load_library())
    found = layout_mismatches(table)
    assert [m for m in found if m.startswith("Linear.")] == named
    size = ctypes.sizeof(mirror)
    assert (f"Linear: C {table['Linear']}, ctypes {size}" in found) == (size != table["Linear"])
    with pytest.raises(build.NativeBuildError, match="differ from model"):
        native_model._library()
