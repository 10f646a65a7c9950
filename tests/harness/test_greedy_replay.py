"""`lumobench replay --greedy`: a sampled corpus replayed as greedy decoding (e.g. the agent corpus on
vLLM CPU's greedy-only MTP arms). What goes over the wire, what run.json keeps, what --resume sends."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.scripted_server import Script, ScriptedServer
from click.testing import Result

from lumobench.client import GREEDY_DROPPED, Target, build_request
from lumobench.corpus import CorpusRecord
from lumobench.results import RunDir

from .helpers import DEMO, lumobench

SAMPLED = {
    "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05, "presence_penalty": 1.0,
    "frequency_penalty": 0.5, "repetition_penalty": 1.1, "seed": 7,
}  # fmt: skip


def _record(**fields: Any) -> CorpusRecord:
    return CorpusRecord.model_validate(
        {"id": "r", "messages": [{"role": "user", "content": "x"}], "input_ids": [1, 2], **fields}
    )


def _sampled_corpus(tmp_path: Path) -> Path:
    """Three demo records (sampled: temperature 0.6, top-p, top-k, presence penalty), the last unseeded."""
    lines = [json.loads(x) | {"max_tokens": 16} for x in DEMO.read_text().splitlines()[:3]]
    del lines[-1]["seed"]
    corpus = tmp_path / "sampled.jsonl"
    corpus.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return corpus


def test_greedy_sends_temperature_zero_and_nothing_else_of_the_sampling() -> None:
    record = _record(**SAMPLED, max_tokens=300, ignore_eos=True)
    # an arm's extra_body may carry sampling too: greedy is applied after the merge
    greedy = Target("http://x", extra_body={"top_k": 40, "return_token_ids": True}, greedy=True)
    _, body = build_request(record, greedy)
    assert body["temperature"] == 0 and not set(GREEDY_DROPPED) & set(body)
    assert (body["max_tokens"], body["ignore_eos"], body["return_token_ids"]) == (300, True, True)
    assert body["messages"] == [{"role": "user", "content": "x"}] and body["stream"] is True
    assert build_request(record, Target("http://x"))[1]["top_k"] == 20  # without --greedy: as recorded
    # with the cap, and on the generate API (the seed travels as sampling_seed there)
    _, capped = build_request(record, Target("http://x", max_tokens_cap=64, greedy=True))
    assert capped["max_tokens"] == 64 and capped["temperature"] == 0
    _, generate = build_request(record, Target("http://x", api="generate", max_tokens_cap=64, greedy=True))
    assert generate["sampling_params"] == {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}


def test_a_greedy_replay_sends_greedy_requests_and_resume_keeps_sending_them(
    tmp_path: Path, cli: Callable[..., Result]
) -> None:
    corpus, out = _sampled_corpus(tmp_path), tmp_path / "runs"
    script = Script(turns=[{"content": "ok"}])
    with ScriptedServer(script) as server:
        # a process of its own, as a user runs it: run.json records that command line
        replay = lumobench("replay", corpus, "--endpoint", server.url, "--greedy", "--out", out)
        assert replay.returncode == 0, replay.stderr[-2000:]
        assert len(script.requests) == 3
        for body in script.requests:
            assert body["temperature"] == 0 and not set(GREEDY_DROPPED) & set(body)
            assert body["max_tokens"] == 16
        [run_dir] = list(out.iterdir())
        meta = RunDir(run_dir).read_meta()
        assert meta.greedy and "--greedy" in meta.argv
        # greedy makes every request deterministic, the unseeded one too: all are compared across arms
        assert meta.deterministic_ids == ["wal-t01", "wal-t02", "wal-t03"]
        # --greedy cannot change a run being resumed; the run's own choice is kept
        refused = cli("replay", "--resume", run_dir, "--greedy")
        assert refused.exit_code == 2 and "--greedy cannot change them" in refused.output
        rows = RunDir(run_dir).read_rows()
        (run_dir / "requests.jsonl").write_text(rows[0].model_dump_json() + "\n")
        resumed = cli("replay", "--resume", run_dir)
        assert resumed.exit_code == 0, resumed.output
        assert len(script.requests) == 5
        for body in script.requests[3:]:
            assert body["temperature"] == 0 and not set(GREEDY_DROPPED) & set(body)
        # without --greedy the same corpus goes out with its records' sampling
        plain = cli("replay", corpus, "--endpoint", server.url, "--out", tmp_path / "plain")
        assert plain.exit_code == 0, plain.output
    assert script.requests[-1]["temperature"] == 0.6 and script.requests[-1]["top_k"] == 20
    [plain_dir] = list((tmp_path / "plain").iterdir())
    assert not RunDir(plain_dir).read_meta().greedy
    assert RunDir(plain_dir).read_meta().deterministic_ids == ["wal-t01", "wal-t02"]
    assert len(RunDir(run_dir).read_rows()) == 3
