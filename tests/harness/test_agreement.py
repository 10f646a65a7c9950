"""Output agreement between arms: greedy and seeded requests must give the first arm's output."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from lumobench.agreement import agreement, same_output
from lumobench.results import RequestRow

from .helpers import lumobench, small_corpus


def row(rid: str, run: int = 0, tokens: list[int] | None = None, text: str = "", **kw: object) -> RequestRow:
    return RequestRow(
        run_index=run,
        seq=0,
        request_id=rid,
        status="completed",
        t_send_ns=0,
        token_ids=tokens,
        text=text,
        started_at="t",
        **kw,  # type: ignore[arg-type]
    )


def test_token_ids_decide_when_both_rows_have_them() -> None:
    assert same_output(row("a", tokens=[1, 2], text="x"), row("a", tokens=[1, 2], text="y"))
    assert not same_output(row("a", tokens=[1, 2]), row("a", tokens=[1, 3]))


def test_text_and_tool_calls_decide_without_token_ids_and_call_ids_are_ignored() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
    other_id = call | {"id": "call_2"}
    other_args = call | {"function": {"name": "grep", "arguments": '{"x": 1}'}}
    assert same_output(row("a", tool_calls=[call]), row("a", tool_calls=[other_id]))
    assert not same_output(row("a", tool_calls=[call]), row("a", tool_calls=[other_args]))
    assert not same_output(row("a", text="x"), row("a", text="x", reasoning="r"))


def test_only_deterministic_requests_completed_in_both_arms_are_compared() -> None:
    base = [row("g", tokens=[1]), row("s", tokens=[2]), row("u", tokens=[3]), row("f", tokens=[4])]
    arm = [
        row("g", run=1, tokens=[9]),  # a later repetition does not count
        row("g", run=0, tokens=[1]),
        row("s", tokens=[5]),
        row("u", tokens=[6]),  # unseeded sampled: not compared
        RequestRow(run_index=0, seq=0, request_id="f", status="failed", t_send_ns=0, started_at="t"),
    ]
    got = agreement(base, arm, ["g", "s", "f"])
    assert (got.same, got.compared, got.differing) == (1, 2, ("s",))


def test_report_counts_same_outputs_and_names_the_differing_requests(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    corpus = small_corpus(tmp_path, 3)
    records = [json.loads(x) for x in corpus.read_text().splitlines()]
    for record in records:
        record.pop("seed", None)
    records[0] |= {"temperature": 0.0}
    records[1] |= {"temperature": 0.6, "seed": 5}
    records[2] |= {"temperature": 0.6}  # unseeded sampled: not compared
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    arms = [
        scripted_arm("plain", tokens=12),
        scripted_arm("chunked", tokens=12, tokens_per_event=3),
        scripted_arm("shorter", tokens=10),
    ]
    proc = lumobench("replay", corpus, *(a for arm in arms for a in ("--arm", arm)), "--out", tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    assert "shorter: output differs from plain for greedy/seeded requests: wal-t01, wal-t02" in " ".join(
        proc.stdout.split()
    )
    run_of = {p.name.rsplit("-", 1)[1]: p for p in (tmp_path / "r").iterdir()}
    runs = [run_of[name] for name in ("plain", "chunked", "shorter")]  # the first one is the reference
    by_arm = {a["arm"]: a for a in json.loads(lumobench("report", *runs, "--format", "json").stdout)["arms"]}
    assert by_arm["plain"]["same_output"] is None
    assert (by_arm["chunked"]["same_output"], by_arm["chunked"]["same_output_compared"]) == (2, 2)
    assert (by_arm["shorter"]["same_output"], by_arm["shorter"]["differing_outputs"]) == (
        0,
        ["wal-t01", "wal-t02"],
    )
