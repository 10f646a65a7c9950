"""The walk of one replay row through lumobench's modules, counted as issue 27 counts it.

A `sys.setprofile` tracer records every call of a lumobench function in the main thread while
`lumobench replay` (the CLI, in this process) replays a one-request corpus against a scripted server,
launched from an arm file (`--mode arm`) or already running (`--mode endpoint`). Each distinct function
counts once, at its first call (a loop over stream chunks is one step of the walk, not one per chunk);
code run at import time is left out, and so are comprehension and generator-expression frames
(Python 3.12 inlines comprehensions, so they are no step of their own). The row's trip is the walk
from the CLI's entry to the call that appends the row to requests.jsonl (`RunDir.append_row`); the
command's walk goes on to the table printed at the end. Over the modules of those calls, in order:

    stays    runs of consecutive calls in one module
    rooms    distinct modules
    returns  stays - rooms: entries into a module the walk had already left

    python -m tests.harness.walk [--mode arm|endpoint] [--show]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from .helpers import free_port, scripted_server, small_corpus

#: frames that are no function of their own (comprehensions are inlined from Python 3.12 on)
SKIPPED_FRAMES = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}
#: the call that ends a row's trip: the row appended to requests.jsonl
ROW_WRITTEN = ("lumobench.results", "RunDir.append_row")


@dataclass(frozen=True)
class Walk:
    """The modules of the walk's steps, in order, and its counts."""

    steps: list[tuple[str, str]]  # (module, function), first calls only

    @property
    def modules(self) -> list[str]:
        """One entry per stay: the module, consecutive repeats collapsed."""
        out: list[str] = []
        for module, _ in self.steps:
            if not out or out[-1] != module:
                out.append(module)
        return out

    @property
    def stays(self) -> int:
        return len(self.modules)

    @property
    def rooms(self) -> int:
        return len(set(self.modules))

    @property
    def returns(self) -> int:
        return self.stays - self.rooms

    def summary(self) -> str:
        return f"{self.stays} stays in {self.rooms} rooms with {self.returns} returns"

    def trip(self) -> Walk:
        """The walk up to the row's write (inclusive)."""
        end = self.steps.index(ROW_WRITTEN)
        return Walk(self.steps[: end + 1])


@contextmanager
def tracing() -> Iterator[list[tuple[str, str]]]:
    """Record (module, function) of the first call of every lumobench function in this thread."""
    seen: set[Any] = set()
    steps: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code in seen or code.co_name == "<module>":
            return
        if code.co_name in SKIPPED_FRAMES:
            return
        module = frame.f_globals.get("__name__", "")
        if module == "lumobench" or module.startswith("lumobench."):
            seen.add(code)
            steps.append((module, code.co_qualname))

    main = threading.current_thread()
    sys.setprofile(profile)
    try:
        yield steps
    finally:
        sys.setprofile(None)
        assert threading.current_thread() is main


def walk_of(run: Callable[[], object]) -> Walk:
    """The walk of the lumobench calls `run` makes."""
    with tracing() as steps:
        run()
    return Walk(list(steps))


def replay_walk(tmp: Path, mode: str) -> Walk:
    """`lumobench replay` of one demo request: against a running scripted server (`endpoint`) or an
    arm that launches one (`arm`)."""
    from typer.testing import CliRunner

    from lumobench.cli import app

    corpus = small_corpus(tmp, 1)
    runner = CliRunner()

    def invoke(*args: str | Path) -> None:
        result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
        if result.exit_code != 0:
            raise SystemExit(f"replay failed ({result.exit_code}): {result.output}")

    if mode == "endpoint":
        with scripted_server(tmp, tokens=8) as url:
            return walk_of(lambda: invoke("replay", corpus, "--endpoint", url, "--out", tmp / "runs"))
    arm = tmp / "scripted.toml"
    script = tmp / "script.json"
    script.write_text(json.dumps({"tokens": 8}))
    arm.write_text(
        f'engine = "scripted"\nport = {free_port()}\n'
        f'command = ["{{python}}", "-m", "lumobench.bench.client.scripted_server", "--port", "{{port}}", '
        f'"--script", "{script}"]\n[readiness]\ntimeout_s = 30\n'
    )
    return walk_of(lambda: invoke("replay", corpus, "--arm", arm, "--out", tmp / "runs"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("endpoint", "arm"), default="arm")
    parser.add_argument("--show", action="store_true", help="Print every stay with its functions.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="walk-") as tmp:
        found = replay_walk(Path(tmp), args.mode)
    if args.show:
        current: tuple[str, list[str]] | None = None
        for module, function in found.trip().steps:
            if current is None or current[0] != module:
                if current is not None:
                    print(f"{current[0]}: {', '.join(current[1])}")
                current = (module, [])
            current[1].append(function)
        if current is not None:
            print(f"{current[0]}: {', '.join(current[1])}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"{args.mode} at {commit.stdout.strip()}: the row's trip {found.trip().summary()}; ", end="")
    print(f"the whole command {found.summary()}")


if __name__ == "__main__":
    main()
