"""Draw a replay subset from a captured corpus (paper §VI): `n` records allocated across conversations in
proportion to their sizes (largest remainder), and within each conversation spaced evenly through
capture order. The selection is frozen as a manifest over the captured corpus before any replay."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from lumobench.corpus import CorpusRecord
from lumobench.errors import LumobenchError
from lumobench.manifest import Manifest, Selection, freeze_manifest

RULE = "proportional-spaced"


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """Split `n` over groups in proportion to `sizes` by the largest-remainder method; ties go to the
    earlier group. Each share is at most its group's size; the shares sum to `n` (≤ sum of sizes)."""
    total = sum(sizes.values())
    if not 0 < n <= total:
        raise LumobenchError(f"cannot select {n} of {total} records")
    quotas = {group: n * size / total for group, size in sizes.items()}
    shares = {group: math.floor(q) for group, q in quotas.items()}
    order = sorted(sizes, key=lambda g: (-(quotas[g] - shares[g]), list(sizes).index(g)))
    for group in order[: n - sum(shares.values())]:
        shares[group] += 1
    return shares


def spaced(size: int, k: int) -> list[int]:
    """`k` of `range(size)` spread evenly (the midpoints of k equal strata), in increasing order."""
    return [math.floor((i + 0.5) * size / k) for i in range(k)]


def conversation_of(record: CorpusRecord) -> str:
    """The group a record belongs to: its source task and conversation ('' parts when absent)."""
    source = record.source
    return f"{source.task or ''}/{source.conversation or ''}" if source else "/"


def select_records(records: Sequence[CorpusRecord], n: int) -> tuple[list[CorpusRecord], dict[str, int]]:
    """The selected records in capture (file) order, and how many each conversation contributed."""
    groups: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        groups.setdefault(conversation_of(record), []).append(index)
    shares = allocate({g: len(members) for g, members in groups.items()}, n)
    chosen = sorted(groups[g][i] for g, k in shares.items() if k for i in spaced(len(groups[g]), k))
    return [records[i] for i in chosen], shares


def freeze_selection(corpus_path: Path, records: Sequence[CorpusRecord], n: int) -> Manifest:
    """Select `n` records of the corpus and freeze the manifest (rule, n and per-conversation shares)."""
    selected, shares = select_records(records, n)
    params = {"n": n, "of": len(records), "per_conversation": shares}
    return freeze_manifest(corpus_path, selected, Selection(rule=RULE, params=params))
