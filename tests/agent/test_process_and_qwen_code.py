"""Budgeted processes (timeouts end the whole tree) and the Qwen Code install, settings and report parsing."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from lumobench.agent.process import MARKER_VAR, run_budgeted
from lumobench.agent.qwen_code import DEFAULT_VERSION, ensure_qwen_code, parse_stream, write_settings
from lumobench.errors import LumobenchError

# A parent that starts a child in a NEW session (as Qwen Code's shell tool does), then hangs.
DETACHING_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_budget_ends_the_process_and_its_detached_children(tmp_path):
    start = time.monotonic()
    outcome = run_budgeted(
        [sys.executable, "-c", DETACHING_PARENT],
        tmp_path,
        {"PATH": "/usr/bin:/bin"},
        tmp_path / "out",
        tmp_path / "err",
        budget_s=2,
        grace_s=0.5,
    )
    assert outcome.timed_out and 2 <= outcome.wall_s < 4 and time.monotonic() - start < 6
    child = int((tmp_path / "out").read_text().split()[0])
    assert outcome.leftovers_killed >= 1
    deadline = time.monotonic() + 2
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_normal_exit_keeps_exit_code_and_marks_the_environment(tmp_path):
    code = f"import os, sys; print(os.environ['{MARKER_VAR}']); sys.exit(7)"
    outcome = run_budgeted([sys.executable, "-c", code], tmp_path, {}, tmp_path / "out", tmp_path / "err", 30)
    assert (outcome.exit_code, outcome.timed_out, outcome.leftovers_killed) == (7, False, 0)
    assert len((tmp_path / "out").read_text().strip()) == 32


def test_missing_node_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LumobenchError, match=r"Node\.js is not on PATH"):
        ensure_qwen_code(DEFAULT_VERSION, cache=tmp_path / "cache")


@pytest.mark.integration
def test_pinned_release_is_installed_once_and_reused(qwen_cli):
    assert qwen_cli.is_file() and DEFAULT_VERSION in str(qwen_cli)
    package = json.loads((qwen_cli.parent / "package.json").read_text())
    assert package["version"] == DEFAULT_VERSION
    mtime = qwen_cli.stat().st_mtime_ns
    assert ensure_qwen_code() == qwen_cli and qwen_cli.stat().st_mtime_ns == mtime


def test_settings_turn_off_statistics_and_memory_and_cap_responses(tmp_path):
    path = write_settings(tmp_path, "m", {"max_tokens": 24000, "presence_penalty": 1.0}, 900, 32768)
    settings = json.loads(path.read_text())
    assert path == tmp_path / ".qwen" / "settings.json"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["memory"]["enableManagedAutoMemory"] is False
    assert settings["model"]["generationConfig"]["samplingParams"] == {
        "max_tokens": 24000,
        "presence_penalty": 1.0,
    }
    assert settings["model"]["name"] == "m"
    # slow CPU answers are waited for (no abandon-and-resend after 120 s); history is compressed in time
    assert settings["model"]["generationConfig"]["timeout"] == 900_000
    assert settings["model"]["generationConfig"]["contextWindowSize"] == 32768
    unknown = json.loads(write_settings(tmp_path / "b", "m", {"max_tokens": 8}, 60).read_text())
    assert "contextWindowSize" not in unknown["model"]["generationConfig"]


def test_stream_report_counts_responses_and_separates_api_errors(tmp_path):
    events = [
        {"type": "system", "subtype": "init"},
        {
            "type": "assistant",
            "message": {
                "content": [{"type": "tool_use", "name": "x"}, {"type": "tool_use"}],
                "usage": {"output_tokens": 30},
            },
        },
        {
            "type": "assistant",
            "message": {"content": [{"type": "text", "text": "done"}], "usage": {"output_tokens": 12}},
        },
        {
            "type": "assistant",
            "message": {
                "content": [{"type": "text", "text": "[API Error: Connection error.]"}],
                "usage": {"output_tokens": 0},
            },
        },
        {"type": "result", "result": "[API Error: Connection error.]", "is_error": False, "num_turns": 3},
    ]
    stream = tmp_path / "agent.jsonl"
    stream.write_text("\n".join(json.dumps(e) for e in events) + '\n{"type": "assist')  # torn last line
    report = parse_stream(stream)
    assert (report.requests, report.output_tokens, report.tool_calls) == (2, 42, 2)
    assert report.api_errors == ["[API Error: Connection error.]"]
    assert report.num_turns == 3
