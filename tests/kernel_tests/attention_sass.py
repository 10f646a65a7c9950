"""Instructions a warp runs per key tile in tree attention's split-K at the Qwen3.5-27B tiles, read in
the sm_90 machine code without a GPU (the figures of results/h200/NOTES.md, session 21).

Run as a script with TRITON_INTERPRET unset, from the repository root with serving/ on PYTHONPATH;
put the H200's Triton first (`pip install --target /tmp/t36 triton==3.6.0`, then
PYTHONPATH=/tmp/t36:serving:.) to read what the device compiles. For every loop of the kernel that
holds one key tile's P @ V wgmma: its instructions, those a forward branch inside it skips
(the accumulator's rescale when no row's maximum moved), its FMULs and its local-memory (spill)
instructions; then the kernel's registers, spills and shared memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import hopper_aot  # the compile entries and helpers of the sm_90 compile test

ENTRY = "tree attention partial, 27B tiles"


def key_tile_loops(sass: str, pv_steps: int) -> list[dict]:
    """Each loop (`hopper_aot.sass_loops`) whose body holds one key tile's P @ V (`pv_steps`
    m64n256 wgmma steps): its size, what its largest forward branch inside it skips, its FMULs
    and spill instructions."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := hopper_aot.SASS_LABEL.match(line))}
    loops = []
    for start, end in hopper_aot.sass_loops(sass):
        if sum("HGMMA.64x256" in b for b in lines[start:end]) != pv_steps:
            continue
        ops = [m.group(1) for b in lines[start : end + 1] if (m := hopper_aot.SASS_INSTRUCTION.search(b))]
        skipped = 0
        for i in range(start, end):
            inner = hopper_aot.SASS_BRANCH.search(lines[i])
            if inner and i < labels.get(inner.group(1), -1) <= end:
                stop = labels[inner.group(1)]
                skipped = max(
                    skipped, sum(1 for x in lines[i + 1 : stop] if hopper_aot.SASS_INSTRUCTION.search(x))
                )
        loops.append(
            {
                "instructions": len(ops),
                "skippable": skipped,
                "FMUL": ops.count("FMUL"),
                "spills": sum(op in ("LDL", "STL") for op in ops),
            }
        )
    return loops


def main() -> None:
    compiled = hopper_aot.compile_hopper(*hopper_aot.KERNELS[ENTRY])
    print(f"{ENTRY} (triton {hopper_aot.triton.__version__}):")
    pv_steps = hopper_aot.KERNELS[ENTRY][1]["BN"] // 16  # k16 steps over a tile's keys
    for n, loop in enumerate(key_tile_loops(hopper_aot.sass_of(compiled.asm["cubin"]), pv_steps)):
        print(f"  key-tile loop {n}: {loop}")
    usage = hopper_aot.resource_usage(compiled.asm["ptx"])
    shared = compiled.metadata.shared
    print(f"  registers {usage['registers']}, spill bytes {usage['spill_bytes']}, shared bytes {shared}")


if __name__ == "__main__":
    main()
