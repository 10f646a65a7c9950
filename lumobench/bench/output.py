"""What every benchmark writes beside its numbers: the commit it ran at and its tables as JSON and
markdown."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import typer


def command_line(verb: str) -> str:
    """This run as `lumobench bench VERB ...`, whichever entry point started it (that command or its
    `python -m lumobench.bench...` alias)."""
    args = sys.argv[1:]
    if args[:2] == ["bench", verb]:
        args = args[2:]
    return shlex.join(["lumobench", "bench", verb, *args])


def current_commit() -> str | None:
    """LUMOBENCH_COMMIT (a staged copy on the device machine has no repository of its own: the
    caller names the commit), else this checkout's HEAD."""
    named = os.environ.get("LUMOBENCH_COMMIT")
    if named:
        return named
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return head or None


def write_tables(out: Path, doc: dict, markdown: Callable[[dict], str]) -> None:
    """`doc` as out.json and its markdown as out.md (the folder made), the markdown echoed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    typer.echo(markdown(doc))
