"""Run a NativeModel's calls in another process: driver.c built for another target (an ARM64 build
run under qemu-user on an x86 machine, so the NEON path's parity tests run here) or under a
profiler (callgrind counts instructions of the calls alone).

Each call writes a memory image (every buffer the library may touch, the pointers between them as
relocations, the call's arguments), runs the driver on it and copies the buffers back, so the
NativeModel behaves as if its library ran in process: `attach(native, command)` swaps its `_call`.
Both ends are little-endian LP64 (x86-64, aarch64): the structures have one layout (checked against
the ctypes mirror by tests/model/test_native_layout.py).
"""

from __future__ import annotations

import ctypes
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from lumotree.model.native.build import BASE_FLAGS, SOURCE, NativeBuildError
from lumotree.model.native.model import NativeModel

DRIVER = SOURCE.with_name("driver.c")
CALLS = ("lt_verify", "lt_publish", "lt_logits", "lt_mtp_step", "lt_mtp_propose")


def build_driver(cc: str, march: str, out: Path, static: bool = False) -> Path:
    """driver.c (with forward.c) compiled by `cc` for -march=`march` into the executable `out`."""
    extra = ["-static"] if static else []
    cmd = [cc, *(f for f in BASE_FLAGS if f not in ("-fPIC", "-shared")), f"-march={march}", *extra]
    proc = subprocess.run([*cmd, "-g", str(DRIVER), "-o", str(out), "-lm"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise NativeBuildError(f"building {DRIVER.name} with {cc} failed: {proc.stderr.strip()[-500:]}")
    return out


class _Image:
    """Memory spans (tensors merged where they overlap, then one per structure) and the pointers
    among them."""

    def __init__(self, tensors: Sequence[Tensor], structs: Sequence[ctypes.Structure | ctypes.Array]) -> None:
        merged: list[list[int]] = []
        ranges = sorted(
            (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors if t.numel()
        )
        for a, b in ranges:
            if merged and a < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.data = [(a, b) for a, b in merged]  # written back after a call
        self.spans = self.data + [
            (ctypes.addressof(s), ctypes.addressof(s) + ctypes.sizeof(s)) for s in structs
        ]

    def locate(self, addr: int) -> tuple[int, int]:
        for i, (a, b) in enumerate(self.spans):
            if a <= addr < b:
                return i, addr - a
        raise ValueError(f"pointer {addr:#x} is in no buffer of the image")

    def relocations(self, obj: ctypes.Structure | ctypes.Array, out: list[tuple[int, int, int, int]]) -> None:
        """Every non-null pointer field inside `obj` (recursively) as (span, offset, span, offset)."""
        if isinstance(obj, ctypes.Array):
            for item in obj:
                self.relocations(item, out)
            return
        base = ctypes.addressof(obj)
        for name, kind in obj._fields_:
            field = getattr(type(obj), name)
            if isinstance(kind, type) and issubclass(kind, ctypes.Structure):
                self.relocations(getattr(obj, name), out)
            elif kind is ctypes.c_void_p or issubclass(kind, ctypes._Pointer):
                addr = ctypes.c_void_p.from_address(base + field.offset).value
                if addr:
                    out.append((*self.locate(base + field.offset), *self.locate(addr)))


def attach(native: NativeModel, command: Sequence[str]) -> None:
    """Make `native` run its calls through the driver executable `command` (e.g. qemu-aarch64 DRIVER)."""

    def call(name: str, *args: ctypes.Structure | Tensor | int) -> int:
        tensors = [*native.tensors(), *(a for a in args if isinstance(a, Tensor))]
        structs = native.structures()
        structs += [a for a in args if isinstance(a, ctypes.Structure) and all(a is not s for s in structs)]
        image = _Image(tensors, structs)
        relocs: list[tuple[int, int, int, int]] = []
        for s in structs:
            image.relocations(s, relocs)
        blob = [b"LTIMG1\0\0", struct.pack("<I", len(image.spans))]
        for a, b in image.spans:
            blob += [struct.pack("<Q", b - a), ctypes.string_at(a, b - a)]
        blob.append(struct.pack("<I", len(relocs)))
        blob += [struct.pack("<IQIQ", *r) for r in relocs]
        blob.append(struct.pack("<III", 1, CALLS.index(name), len(args)))
        for a in args:
            if isinstance(a, int):
                blob.append(struct.pack("<Iq", 0, a))
            else:
                addr = a.data_ptr() if isinstance(a, Tensor) else ctypes.addressof(a)
                blob.append(struct.pack("<IIQ", 1, *image.locate(addr)))
        with tempfile.TemporaryDirectory(prefix="lumotree-remote-") as tmp:
            src, dst = Path(tmp) / "image", Path(tmp) / "out"
            src.write_bytes(b"".join(blob))
            proc = subprocess.run([*command, str(src), str(dst)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"{name} under {' '.join(command)} failed ({proc.returncode}): {proc.stderr[-500:]}"
                )
            data = dst.read_bytes()
        at = 0
        for i, (a, b) in enumerate(image.spans):
            if i < len(image.data):  # the structures stay as they are: the library only reads them
                ctypes.memmove(a, data[at : at + b - a], b - a)
            at += b - a
        return struct.unpack_from("<q", data, at)[0]

    native._call = call  # type: ignore[method-assign]
