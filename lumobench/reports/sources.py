"""What a report input is: a replay run directory, an agent run directory or a kernel result file.

`lumobench report` takes inputs of one kind; each kind has its own notebook source in `notebooks/`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from lumobench.agent.rundir import AgentRunDir
from lumobench.errors import LumobenchError
from lumobench.results import RUN_FILE, RunDir

Kind = Literal["replay", "agent", "kernels"]
KERNEL_KEYS = ("device", "copy_bandwidth_Bps")  # what every `lumobench bench kernels` result carries


def is_kernel_result(path: Path) -> bool:
    """A JSON file written by `lumobench bench kernels` (kernels.json, results/h200/*.json)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(k in data for k in KERNEL_KEYS)


def input_kind(path: Path) -> Kind:
    """The kind of one input; a one-line `LumobenchError` for anything else."""
    if not path.exists():
        raise LumobenchError(f"{path} does not exist")
    if path.is_file():
        if path.suffix == ".json" and is_kernel_result(path):
            return "kernels"
        raise LumobenchError(f"{path} is neither a run directory nor a `lumobench bench kernels` result")
    if not (path / RUN_FILE).is_file():
        raise LumobenchError(f"{path} is not a lumobench run directory (no {RUN_FILE})")
    try:
        kind = json.loads((path / RUN_FILE).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        raise LumobenchError(f"{path / RUN_FILE} is not valid run metadata") from None
    if kind == "agent":
        try:
            AgentRunDir.open(path).read_meta()
        except ValidationError as exc:
            raise LumobenchError(
                f"{path / RUN_FILE} is not valid agent-run metadata: {exc.errors()[0]['msg']}"
            ) from None
        return "agent"
    RunDir.open(path).read_meta()  # a clear error for a foreign or newer run.json
    return "replay"


def report_kind(paths: Sequence[Path]) -> Kind:
    """The one kind shared by all inputs; inputs of different kinds are refused."""
    if not paths:
        raise LumobenchError("give at least one run directory or kernel result file")
    seen: dict[Path, Path] = {}
    for path in paths:
        if path.resolve() in seen:
            raise LumobenchError(f"{path} is given twice (also as {seen[path.resolve()]})")
        seen[path.resolve()] = path
    kinds = {p: input_kind(p) for p in paths}
    found = sorted(set(kinds.values()))
    if len(found) > 1:
        examples = ", ".join(f"{next(p for p, k in kinds.items() if k == kind)} is {kind}" for kind in found)
        raise LumobenchError(
            f"give inputs of one kind (replay runs, agent runs or kernel results): {examples}"
        )
    return found[0]  # type: ignore[return-value]
