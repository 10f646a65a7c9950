"""Execute a report source of `notebooks/` (jupytext percent format) into a notebook.

The source's cell tagged `parameters` holds defaults; the values for this report go into a cell
inserted after it (tagged `injected-parameters`, as papermill does). Execution is headless: nbclient
starts an IPython kernel of this very interpreter (a kernel spec written to a temporary folder, so no
kernel installed elsewhere on the machine is picked up), with matplotlib's Agg backend, and the
notebook never reaches the network.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jupytext
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

from lumobench.reports.display import META_KEY
from lumobench.reports.sources import Kind

SOURCES_DIR = Path(__file__).with_name("notebooks")
SOURCES: dict[Kind, str] = {
    "replay": "replay_report.py",
    "agent": "agent_report.py",
    "kernels": "kernels_report.py",
}
KERNEL_NAME = "lumobench-python"
CELL_TIMEOUT_S = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NotebookFailed(Exception):
    """A cell raised: `notebook` is the executed notebook up to and including the failing cell."""

    def __init__(self, message: str, notebook: nbformat.NotebookNode) -> None:
        super().__init__(message)
        self.notebook = notebook


def source_path(kind: Kind) -> Path:
    return SOURCES_DIR / SOURCES[kind]


def load_source(path: Path, parameters: Mapping[str, Any]) -> nbformat.NotebookNode:
    """The source as a notebook, with a cell assigning `parameters` after the `parameters` cell."""
    nb = jupytext.read(path)
    lines = [f"{name} = {value!r}" for name, value in parameters.items()]
    injected = nbformat.v4.new_code_cell("\n".join(lines), metadata={"tags": ["injected-parameters"]})
    at = next(
        (i + 1 for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])),
        0,
    )
    nb.cells.insert(at, injected)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata.pop("jupytext", None)
    return nb


def _kernel_manager(spec_root: Path) -> KernelManager:
    """A kernel manager that can only start this interpreter's ipykernel."""
    spec_dir = spec_root / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    env = {"MPLBACKEND": "Agg", "JUPYTER_PLATFORM_DIRS": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [
                    sys.executable,
                    "-Xfrozen_modules=off",
                    "-m",
                    "ipykernel_launcher",
                    "-f",
                    "{connection_file}",
                ],
                "display_name": "lumobench (this interpreter)",
                "language": "python",
                "env": env,
                "metadata": {"debugger": False},
            }
        )
    )
    specs = KernelSpecManager(kernel_dirs=[str(spec_root)], ensure_native_kernel=False)
    # IPC sockets and the connection file in the temporary folder: no TCP port, nothing left behind
    return KernelManager(
        kernel_name=KERNEL_NAME,
        kernel_spec_manager=specs,
        transport="ipc",
        ip=str(spec_root / "ipc"),
        connection_file=str(spec_root / "connection.json"),
    )


def _failure(nb: nbformat.NotebookNode, path: Path) -> str:
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                why = _ANSI.sub("", output["evalue"])
                return f"{path.name} cell {index + 1} failed: {output['ename']}: {why}"
    return f"{path.name} failed"


def execute(nb: nbformat.NotebookNode, source: Path, cwd: Path | None = None) -> nbformat.NotebookNode:
    """Run every cell in order; raise `NotebookFailed` (one line naming the cell) when one raises."""
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    with tempfile.TemporaryDirectory(prefix="lumobench-kernel-") as root:
        client = NotebookClient(
            nb,
            km=_kernel_manager(Path(root)),
            timeout=CELL_TIMEOUT_S,
            startup_timeout=120,
            resources={"metadata": {"path": str(cwd or Path.cwd())}},
        )
        kernel_log = Path(root) / "kernel.log"
        with kernel_log.open("w") as log:
            try:
                client.execute(stdout=log, stderr=log)
            except CellExecutionError:
                raise NotebookFailed(_failure(nb, source), nb) from None
            except (DeadKernelError, RuntimeError, TimeoutError) as exc:
                tail = " | ".join(kernel_log.read_text().strip().splitlines()[-3:])
                raise NotebookFailed(f"{source.name}: the kernel failed: {exc} {tail}".strip(), nb) from None
    return nb


def figures(nb: nbformat.NotebookNode) -> list[tuple[str, bytes]]:
    """(name, PNG bytes) of every named figure output, in notebook order."""
    found = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get(META_KEY, {}).get("figure")
            if name and "image/png" in output.get("data", {}):
                found.append((name, base64.b64decode(output["data"]["image/png"])))
    return found


def tables(nb: nbformat.NotebookNode) -> dict[str, Any]:
    """The raw values behind every named table output (its application/json data), by name."""
    found = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get(META_KEY, {}).get("table")
            if name:
                found[name] = output.get("data", {}).get("application/json")
    return found
