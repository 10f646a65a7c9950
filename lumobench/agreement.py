"""Output agreement between arms: do greedy and seeded requests give the same output everywhere?

Speculative decoding is lossless: for a greedy request, or a sampled one with a seed on an engine
whose coins do not depend on the drafter (LumoTree's), every arm of the same engine and model must
emit the same tokens as plain decoding. The report counts, per arm, the deterministic requests whose
output equals the first arm's. Outputs compare by token ids when both rows carry them, otherwise by
text, reasoning and tool calls (call ids are random per server and ignored).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lumobench.results import RequestRow


@dataclass(frozen=True)
class Agreement:
    same: int  # deterministic requests whose output equals the first arm's
    compared: int  # deterministic requests completed under both arms
    differing: tuple[str, ...]  # request ids that differ, for the user to inspect


def first_completed(rows: Iterable[RequestRow]) -> dict[str, RequestRow]:
    """The completed row of each request id from its lowest repetition."""
    out: dict[str, RequestRow] = {}
    for row in sorted(rows, key=lambda r: r.run_index):
        if row.status == "completed":
            out.setdefault(row.request_id, row)
    return out


def _calls(row: RequestRow) -> list[Any]:
    return [(c.get("function") or {}) for c in row.tool_calls or ()]


def same_output(a: RequestRow, b: RequestRow) -> bool:
    """Token ids when both rows have them, else text + reasoning + tool calls without ids."""
    if a.token_ids is not None and b.token_ids is not None:
        return a.token_ids == b.token_ids
    return (a.text, a.reasoning, _calls(a)) == (b.text, b.reasoning, _calls(b))


def agreement(
    base: Sequence[RequestRow], rows: Sequence[RequestRow], deterministic_ids: Iterable[str]
) -> Agreement:
    """Compare an arm's outputs with the first arm's over the deterministic requests both completed."""
    base_by_id, by_id = first_completed(base), first_completed(rows)
    ids = [i for i in dict.fromkeys(deterministic_ids) if i in base_by_id and i in by_id]
    differing = tuple(i for i in ids if not same_output(base_by_id[i], by_id[i]))
    return Agreement(same=len(ids) - len(differing), compared=len(ids), differing=differing)
