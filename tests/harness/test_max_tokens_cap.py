"""`lumobench replay --max-tokens-cap N`: a corpus captured on a long-context arm (max_tokens 24000) replays
on the embedded engine's smaller context, the cap is kept in run.json and `--resume` keeps using it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumobench.client import Target, build_request
from lumobench.corpus import CorpusRecord
from lumobench.results import RunDir

from .helpers import lumobench, small_corpus


def test_the_cap_lowers_every_response_limit_it_finds() -> None:
    record = CorpusRecord.model_validate(
        {"id": "r", "messages": [{"role": "user", "content": "x"}], "max_tokens": 24000, "input_ids": [1, 2]}
    )
    unset = CorpusRecord.model_validate({"id": "u", "messages": [{"role": "user", "content": "x"}]})
    capped = Target("http://x", max_tokens_cap=64)
    assert build_request(record, capped)[1]["max_tokens"] == 64
    assert build_request(unset, capped)[1]["max_tokens"] == 64  # no limit of its own: the cap
    assert build_request(record.model_copy(update={"max_tokens": 16}), capped)[1]["max_tokens"] == 16
    assert "max_tokens" not in build_request(unset, Target("http://x"))[1]  # no cap: sent as recorded
    extra = Target("http://x", extra_body={"max_completion_tokens": 5000}, max_tokens_cap=64)
    assert build_request(record, extra)[1]["max_completion_tokens"] == 64
    generate = Target("http://x", api="generate", max_tokens_cap=64)
    assert build_request(record, generate)[1]["sampling_params"]["max_new_tokens"] == 64


@pytest.mark.integration
def test_a_captured_corpus_replays_on_the_embedded_engine_with_a_cap(live_url: str, tmp_path: Path) -> None:
    corpus = small_corpus(tmp_path, 2, max_tokens=24000)  # as Qwen Code captures on a 262k-context arm
    refused = lumobench("replay", corpus, "--endpoint", live_url, "--out", tmp_path / "plain", timeout=300)
    assert refused.returncode == 1 and "maximum context length" in refused.stderr
    out = tmp_path / "capped"
    replay = lumobench(
        "replay", corpus, "--endpoint", live_url, "--max-tokens-cap", 8, "--out", out, timeout=300
    )
    assert replay.returncode == 0, replay.stderr[-2000:]
    [run_dir] = list(out.iterdir())
    assert json.loads((run_dir / "run.json").read_text())["max_tokens_cap"] == 8
    rows = RunDir(run_dir).read_rows()
    assert len(rows) == 2 and all(r.status == "completed" and r.completion_tokens <= 8 for r in rows)
    # a resumed run keeps the cap: drop a row and let --resume send it again
    (run_dir / "requests.jsonl").write_text(rows[0].model_dump_json() + "\n")
    resumed = lumobench("replay", "--resume", run_dir, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    again = RunDir(run_dir).read_rows()
    assert len(again) == 2 and all(r.status == "completed" and r.completion_tokens <= 8 for r in again)
