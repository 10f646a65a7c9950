"""Reports over several run directories: failed arms, the reference arm, paired ratios, notes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumobench.errors import LumobenchError
from lumobench.reports.summary import build_report, render_csv, render_json, table_notes
from lumobench.results import ArmInfo, RequestRow, RunDir, RunMeta

IDS = ["a", "b", "c"]


def _run(root: Path, arm: str, decode_s: float | None, interleaved: bool = False) -> Path:
    """A finished one-repetition run of `arm`: every request completed with 11 tokens in `decode_s`,
    or (decode_s None) every request failed with HTTP 500."""
    meta = RunMeta(
        run_id=f"run-{arm}",
        created="t",
        arm=ArmInfo(name=arm),
        endpoint="http://x",
        corpus="c",
        corpus_sha256="h",
        request_ids=IDS,
        deterministic_ids=IDS,
        runs=1,
        interleaved_with=[f"run-{arm}"] if interleaved else [],
    )
    run = RunDir.create(root / meta.run_id, meta)
    for seq, rid in enumerate(IDS):
        ok = decode_s is not None
        run.append_row(
            RequestRow(
                run_index=0,
                seq=seq,
                request_id=rid,
                status="completed" if ok else "failed",
                error=None if ok else "HTTP 500: EngineCore encountered an issue",
                completion_tokens=11 if ok else None,
                t_send_ns=0,
                t_first_ns=1_000 if ok else None,
                t_end_ns=1_000 + int((decode_s or 0) * (1 + seq) * 1e9) if ok else None,
                token_ids=list(range(11)) if ok else None,
                started_at="t",
                others_cpu_s=0.001 if interleaved else None,
            )
        )
    return run.path


def test_an_arm_that_completed_nothing_is_failed_and_the_others_are_still_compared(tmp_path: Path) -> None:
    slow, broken, fast = (
        _run(tmp_path, "slow", 1.0),
        _run(tmp_path, "broken", None),
        _run(tmp_path, "fast", 0.5),
    )
    reports = build_report([slow, broken, fast])
    assert [r.status for r in reports] == ["ok", "failed", "ok"]
    assert [r.matched for r in reports] == [3, 0, 3]
    assert reports[0].pooled_tokens_per_s == pytest.approx(30 / 6.0)
    assert reports[1].pooled_tokens_per_s is None and reports[1].failed == 3
    assert reports[2].reference == "slow" and reports[2].ratio_vs_first == pytest.approx(2.0)
    assert reports[2].per_request_ratios == {i: pytest.approx(2.0) for i in IDS}
    assert (reports[2].same_output, reports[2].same_output_compared) == (3, 3)
    notes = table_notes(reports)
    assert (
        "failed (completed nothing, left out of the matched set): broken; the other arms are compared"
        in notes
    )
    assert any(n.startswith("measured one arm after another") for n in notes)
    # a failed first arm hands the reference to the next arm that completed something
    first_broken = build_report([broken, fast, slow])
    assert first_broken[2].reference == "fast" and first_broken[2].ratio_vs_first == pytest.approx(0.5)
    assert first_broken[1].same_output is None and first_broken[1].ratio_vs_first is None
    # any arm that completed something can be the reference
    vs_fast = build_report([slow, broken, fast], reference="fast")
    assert vs_fast[0].ratio_vs_first == pytest.approx(0.5) and vs_fast[2].same_output is None
    with pytest.raises(LumobenchError, match="--reference broken: that arm completed nothing"):
        build_report([slow, broken], reference="broken")
    with pytest.raises(LumobenchError, match="--reference nope: no such arm among slow, broken"):
        build_report([slow, broken], reference="nope")
    arms = json.loads(render_json(first_broken))["arms"]
    assert [a["status"] for a in arms] == ["failed", "ok", "ok"]
    assert (
        render_csv(first_broken)
        .splitlines()[0]
        .startswith("arm,run_dir,runs,completed,failed,matched,pooled_tokens_per_s")
    )


def test_interleaved_runs_report_the_idle_arms_cpu(tmp_path: Path) -> None:
    reports = build_report(
        [_run(tmp_path, "x", 1.0, interleaved=True), _run(tmp_path, "y", 0.25, interleaved=True)]
    )
    assert all(r.interleaved for r in reports)
    # 3 ms of other arms' CPU over the 6 s (resp. 1.5 s) the requests were in flight
    assert reports[0].others_cpu_per_s == pytest.approx(0.003 / 6.0, rel=1e-3)
    assert reports[1].ratio_vs_first == pytest.approx(4.0)
    assert any(
        n.startswith("interleaved: all arms up at once") and "ms CPU per s" in n for n in table_notes(reports)
    )


def test_the_papers_rate_table_marks_a_failed_arm_and_names_the_reference(tmp_path: Path) -> None:
    from lumobench.reports.tables import rate_table, to_markdown  # pandas: only the paper tables need it

    broken, fast, slow = (
        _run(tmp_path, "broken", None),
        _run(tmp_path, "fast", 0.5),
        _run(tmp_path, "slow", 1.0),
    )
    markdown = to_markdown(rate_table(build_report([broken, fast, slow])))
    assert "| broken | 1 | 0/3 | 0 | – | – | – | failed | – | failed |" in markdown
    assert "| fast | 1 | 3/0 | 3 | 10.00 |" in markdown and "| ref | – | ref |" in markdown
    assert "| vs fast | paired 95% CI |" in markdown and "| 0.50x |" in markdown
    assert "Failed (completed nothing, left out of the matched set): broken." in markdown
