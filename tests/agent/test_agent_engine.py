"""`lumobench agent` end to end against the embedded LumoTree engine: the real Qwen Code process, the
`lumotree` arm (the server with the shipped lumo-tiny-coder and tree speculation) and a local task.
The small model is no coding agent: the attempt may end with an empty patch; what must hold is the
plumbing — the engine serves the agent's requests, every count agrees, and the capture replays."""

from __future__ import annotations

import json

import pytest

from lumobench.arms import arm_path
from lumobench.corpus import check_corpus

from .conftest import free_port, lumobench, make_calc_repo, only_run_dir, read_jsonl, write_tasks

pytestmark = pytest.mark.integration


def test_agent_runs_against_the_lumotree_engine_and_its_capture_is_a_valid_corpus(qwen_cli, tmp_path):
    calc = make_calc_repo(tmp_path)
    tasks = write_tasks(tmp_path / "tasks.jsonl", [calc.task()])
    corpus = tmp_path / "captured.jsonl"
    # the shipped arm on a free port: a server another run left on its fixed port must not answer for it
    arm = tmp_path / "lumotree.toml"
    arm.write_text(arm_path("lumotree").read_text().replace("port = 8420", f"port = {free_port()}"))
    result = lumobench(
        "agent",
        "--tasks",
        tasks,
        "--arm",
        arm,
        "--repos",
        calc.mirrors,
        "--out",
        tmp_path / "results",
        "--budget-s",
        180,
        "--max-tokens",
        128,
        "--record",
        corpus,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path / "results")
    [row] = read_jsonl(run / "tasks.jsonl")
    assert row["status"] in ("completed", "timeout"), row
    # the engine served the agent: requests and tokens agree between proxy, engine counters and agent
    assert row["requests"] >= 1 and row["requests"] == row["counter_requests"] == row["recorded"]
    assert row["output_tokens"] == row["counter_output_tokens"] > 0
    assert row["accepted_per_event"] is not None and row["accepted_per_event"] > 0  # tree speculation ran
    assert row["leftover_processes"] == 0
    # Qwen Code knew the arm's context and waited for slow answers instead of resending them
    settings = json.loads((run / row["log_dir"] / "home" / ".qwen" / "settings.json").read_text())
    generation = settings["model"]["generationConfig"]
    assert generation["contextWindowSize"] == 32768 and generation["timeout"] == 180_000
    assert row["capped_requests"] == 0  # 128 tokens fit beside its ~20,000-token first prompt
    [prediction] = read_jsonl(run / "predictions.jsonl")
    assert prediction["instance_id"] == "local__calc-1" and prediction["model_patch"] == row["patch"]
    records, issues = check_corpus(corpus)
    assert issues == [] and len(records) == row["recorded"]
    assert records[0].max_tokens == 128 and records[0].tools
