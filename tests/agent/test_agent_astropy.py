"""One real task of the paper's study end to end (issue 24): Qwen Code on astropy__astropy-12907 from the
shared read-only Astropy mirror against the `lumotree` arm serving the shipped lumo-tiny-coder, the
traffic recorded, the patch graded locally. Slow: an attempt takes ~0.5 min on the 2-core VM (a 20,000-
token first prompt), up to its 300 s budget, and a non-empty patch builds the 4.3 grading environment
(minutes, once). Skipped where ../shared/data is absent. The small model is no coding agent: what must
hold is the plumbing on a real repository, not the patch."""

from __future__ import annotations

import json

import pytest
from harness.helpers import lumobench as run_cli

from lumobench.arms import arm_path
from lumobench.corpus import check_corpus

from .conftest import free_port, only_run_dir, read_jsonl, tree_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TASK = "astropy__astropy-12907"


def test_a_real_astropy_task_from_the_readonly_mirror_end_to_end(qwen_cli, readonly_mirrors, tmp_path):
    before = tree_state(readonly_mirrors)
    corpus = tmp_path / "captured.jsonl"
    arm = tmp_path / "lumotree.toml"
    arm.write_text(arm_path("lumotree").read_text().replace("port = 8420", f"port = {free_port()}"))
    result = run_cli(
        "agent",
        "--tasks",
        TASK,
        "--arm",
        arm,
        "--repos",
        readonly_mirrors,
        "--no-clone",
        "--out",
        tmp_path / "results",
        "--budget-s",
        300,
        "--max-tokens",
        1024,
        "--sampling",
        "seed=0",
        "--record",
        corpus,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path / "results")
    [row] = read_jsonl(run / "tasks.jsonl")
    assert row["status"] in ("completed", "timeout"), row
    # the arm served Qwen Code's real prompt (system prompt, tools, the task) and every count agrees
    assert row["requests"] >= 1 and row["requests"] == row["counter_requests"] == row["recorded"]
    assert row["output_tokens"] == row["counter_output_tokens"] > 0
    assert row["accepted_per_event"] is not None and row["accepted_per_event"] > 0  # tree speculation ran
    assert row["leftover_processes"] == 0 and row["capped_requests"] == 0
    # the capture is a valid corpus of sampled, seeded requests of this task's conversation
    records, issues = check_corpus(corpus)
    assert issues == [] and len(records) == row["recorded"]
    first = records[0]
    assert first.source.task == TASK and first.source.turn == 0 and first.tools
    assert (first.temperature, first.seed, first.max_tokens) == (0.6, 0, 1024) and first.is_deterministic
    assert "astropy" in json.dumps([m.model_dump() for m in first.messages])  # the task reached the model
    assert f"| {TASK} | 1 | {row['status']} |" in (run / "task-table.md").read_text()
    # graded here without Docker: an empty patch needs no environment, another builds 4.3 once
    result = run_cli("evaluate", run / "predictions.jsonl", "--local", timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    [evaluation] = read_jsonl(run / "evaluation.jsonl")
    if row["patch"]:
        assert evaluation["status"] in ("resolved", "unresolved"), evaluation
        graded = evaluation["status"]
    else:
        assert evaluation["status"] == "empty-patch", evaluation
        graded = "unresolved (empty patch)"
    assert f"| {graded} |" in (run / "task-table.md").read_text()  # the table shows the grade
    assert tree_state(readonly_mirrors) == before  # the mirror is only read
