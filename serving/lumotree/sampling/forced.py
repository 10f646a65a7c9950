"""Forced acceptance, for speed work only: every cycle accepts a spine prefix whose length comes
from a fixed schedule instead of from the acceptance walk.

Random weights accept nothing, so the decode cycle of a random-weight 27B model would publish
root-only paths and never show what a cycle that accepts drafts costs. With a schedule the walk
still runs (its cost is in the cycle), then its path is replaced by the first `count` drafts of the
spine (fewer when the spine is shorter), and the emitted tokens are those drafts followed by the
walk's own choice at the last accepted node. Publication, drafting and the server then work on
paths of the schedule's lengths. Outputs are not a model's: the server says so in its log and
`/v1/models`.

A schedule is written as one of
    "paper"            the paper's mean accepted drafts per event: 4.05 for the tree, 3.17 for chain
                       MTP-5 (each a mix of floor and ceil in the right proportion)
    "3.4"              a mean for every drafter
    "0,4,5,7"          the counts themselves, cycled
    "hist:FILE.json"   {"accepted_per_pos": [...], "num_drafts": N} (a replay's spec counters, e.g.
                       the tiny model's), or one such entry per drafter kind ({"tree": {...},
                       "mtp": {...}}): the counts in the proportions of that histogram
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PAPER_MEANS = {"tree": 4.05, "mtp": 3.17}
SCHEDULE_LEN = 64


class ForcedAcceptanceError(ValueError):
    """A schedule that cannot be parsed or used."""


@dataclass(frozen=True)
class ForcedAcceptance:
    """counts: accepted drafts per cycle, cycled; spec: how it was written (for logs)."""

    counts: tuple[int, ...]
    spec: str

    @property
    def mean(self) -> float:
        return sum(self.counts) / len(self.counts)

    @classmethod
    def parse(cls, spec: str, drafter: str) -> ForcedAcceptance:
        """The schedule `spec` (see the module docstring) for a drafter kind ("mtp" or "tree")."""
        text = spec.strip()
        if drafter not in PAPER_MEANS:
            raise ForcedAcceptanceError(
                f"forced acceptance needs a drafting arm (mtp or tree), not {drafter!r}"
            )
        if text == "paper":
            return cls(mean_schedule(PAPER_MEANS[drafter]), spec)
        if text.startswith("hist:"):
            return cls(histogram_schedule(Path(text[5:]), drafter), spec)
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            raise ForcedAcceptanceError(
                f"forced acceptance {spec!r}: expected paper, a mean, comma-separated counts or hist:FILE"
            ) from None
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ForcedAcceptanceError(f"forced acceptance {spec!r}: counts must be finite and >= 0")
        if len(values) == 1:
            return cls(mean_schedule(values[0]), spec)
        if any(v != int(v) for v in values):
            raise ForcedAcceptanceError(f"forced acceptance {spec!r}: a list holds whole counts")
        return cls(tuple(int(v) for v in values), spec)


def mean_schedule(mean: float, length: int = SCHEDULE_LEN) -> tuple[int, ...]:
    """`length` counts of floor(mean) and floor(mean) + 1 whose average is `mean` (to 1/length),
    the larger ones spread evenly."""
    base = int(mean)
    more = round((mean - base) * length)
    return tuple(base + ((i + 1) * more // length - i * more // length) for i in range(length))


def histogram_schedule(path: Path, drafter: str, length: int = SCHEDULE_LEN) -> tuple[int, ...]:
    """Counts in the proportions of a spec histogram: accepted_per_pos[d] events accepted at least
    d + 1 drafts out of num_drafts events (the drafter's own entry when the file has one per kind)."""
    try:
        doc = json.loads(path.read_text())
        doc = doc.get(drafter, doc)
        per_pos, events = [int(v) for v in doc["accepted_per_pos"]], int(doc["num_drafts"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ForcedAcceptanceError(f"forced acceptance histogram {path}: {exc}") from None
    if events <= 0 or any(b > a for a, b in zip([events, *per_pos], per_pos, strict=False)):
        raise ForcedAcceptanceError(f"forced acceptance histogram {path}: counts must fall with depth")
    exact = [a - b for a, b in zip([events, *per_pos], [*per_pos, 0], strict=True)]  # events of 0, 1, ...
    counts: list[int] = []
    for drafts, n in enumerate(exact):
        counts += [drafts] * round(n * length / events)
    return tuple(counts or [0])


def forced_path(spine: Sequence[int], tokens: Sequence[int], count: int) -> tuple[list[int], list[int]]:
    """The host reference: spine nodes [root, ...] and the tree's tokens -> (accepted nodes, the
    accepted drafts' tokens) of a forced path of `count` drafts (fewer on a shorter spine)."""
    nodes = list(spine[: min(count, len(spine) - 1) + 1])
    return nodes, [int(tokens[n]) for n in nodes[1:]]
