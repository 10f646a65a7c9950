"""The real server process with the real engine and the shipped model (tree drafter): the API end to
end, counters, queueing of concurrent requests, client disconnects, and lumobench replay against it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from harness.helpers import DEMO, lumobench, processes_with

from lumobench.corpus import load_corpus
from lumobench.metrics import parse_prometheus
from lumobench.plan import ReplayArgs, plan_replay
from lumobench.replay import Member, run_group
from lumobench.stream import ChatRecorder, GenerateRecorder, StreamRecorder
from lumotree.engine.config import NATIVE_TREE_SHAPE, EngineConfig
from lumotree.model.native.build import isa as native_isa

from .live import LIVE_MAX_LEN as MAX_LEN
from .live import lumotree_server

pytestmark = pytest.mark.integration
SYSTEM = (
    "You are a careful software engineering agent working in a Python repository. Use the tools to "
    "inspect files, run commands and edit code. Reply concisely."
)
AGENT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is `replay_wal` defined?"}]
CODE = [
    {"role": "user", "content": 'Complete this function:\n```python\ndef mean(xs):\n    """Average."""\n```'}
]


@pytest.fixture(scope="module")
def url(live_url: str) -> str:
    return live_url


@pytest.fixture(scope="module")
def tools() -> list[dict]:
    return [t.model_dump(mode="json", exclude_none=True) for t in load_corpus(DEMO)[0].tools or []]


def stream(url: str, path: str, body: dict, recorder: StreamRecorder) -> StreamRecorder:
    with httpx.stream("POST", url + path, json=body | {"stream": True}, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for raw in resp.iter_raw():
            recorder.feed(raw, time.monotonic_ns())
    assert recorder.failure() is None, recorder.failure()
    return recorder


def counters(url: str) -> dict[str, float]:
    samples = parse_prometheus(httpx.get(url + "/metrics").text)
    return {name: sum(v for _, v in rows) for name, rows in samples.items()} | {
        f"success_{lab['finished_reason']}": v for lab, v in samples.get("vllm:request_success_total", [])
    }


def test_agent_turn_streams_reasoning_and_a_tool_call(url: str, tools: list[dict]) -> None:
    body = {"messages": AGENT, "tools": tools, "temperature": 0, "max_tokens": 96}
    rec = stream(
        url, "/v1/chat/completions", body | {"stream_options": {"include_usage": True}}, ChatRecorder()
    )
    fields = rec.text_fields()
    assert "replay_wal" in fields["reasoning"]  # the model thinks first (trained on such episodes)
    (call,) = fields["tool_calls"]
    assert call["function"]["name"] == "grep"
    assert "replay_wal" in json.loads(call["function"]["arguments"])["pattern"]
    assert rec.finish_reason == "tool_calls"
    whole = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
    msg = whole["choices"][0]["message"]
    assert msg["reasoning_content"] == fields["reasoning"] and msg["content"] == (fields["text"] or None)
    assert [c["function"] for c in msg["tool_calls"]] == [c["function"] for c in fields["tool_calls"]]
    assert whole["usage"]["completion_tokens"] == rec.completion_tokens


def test_greedy_logprobs_rank_the_chosen_token_first(url: str) -> None:
    body = {"prompt": "def add(a, b):\n", "max_tokens": 24, "temperature": 0, "logprobs": 3}
    out = httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
    lp = out["logprobs"]
    assert "".join(lp["tokens"]) == out["text"] or "\ufffd" in "".join(lp["tokens"])
    for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert len(top) == 3 and chosen == pytest.approx(max(top.values()), abs=1e-6)


def test_generate_with_token_ids_streams_cumulative_counts(url: str) -> None:
    ids = httpx.post(url + "/tokenize", json={"messages": CODE}).json()["tokens"]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 40, "temperature": 0}}
    rec = stream(url, "/generate", body, GenerateRecorder())
    assert rec.chunk_tokens == sorted(set(rec.chunk_tokens)) and rec.chunk_tokens[-1] == rec.completion_tokens
    assert len(rec.token_ids) == rec.completion_tokens
    whole = httpx.post(url + "/generate", json=body, timeout=120).json()
    assert whole["output_ids"] == rec.token_ids and whole["text"] == rec.text_fields()["text"]
    chat = httpx.post(
        url + "/v1/chat/completions", json={"messages": CODE, "temperature": 0, "max_tokens": 40}
    )
    assert chat.json()["choices"][0]["message"]["content"] == whole["text"]  # same prompt, same greedy answer


def test_metrics_move_by_what_was_served(url: str, tools: list[dict]) -> None:
    before = counters(url)
    usages = []
    for n in (32, 48):
        body = {"messages": AGENT, "tools": tools, "temperature": 0, "max_tokens": n, "ignore_eos": True}
        usages.append(httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()["usage"])
    after = counters(url)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["vllm:generation_tokens_total"] == sum(u["completion_tokens"] for u in usages) == 80
    assert delta["vllm:prompt_tokens_total"] == sum(u["prompt_tokens"] for u in usages)
    assert delta["success_length"] == 2
    # the second request repeats the first one's prompt: the prefix cache serves part of it
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] > 0
    assert delta["vllm:prefix_cache_hits_total"] == sum(
        u["prompt_tokens_details"]["cached_tokens"] for u in usages
    )
    # per-request spec stats add up to the server's counters
    assert (
        delta["vllm:spec_decode_num_drafts_total"] == sum(u["spec_decode"]["num_drafts"] for u in usages) > 0
    )
    assert delta["vllm:spec_decode_num_accepted_tokens_total"] == sum(
        u["spec_decode"]["num_accepted_tokens"] for u in usages
    )
    assert delta["lumotree:phase_seconds_count"] > 0
    # vLLM's latency histograms: one TTFT, e2e and queue observation per request, an ITL per later cycle
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert delta[f"vllm:{name}_seconds_count"] == 2, name
    assert delta["vllm:inter_token_latency_seconds_count"] == delta["vllm:spec_decode_num_drafts_total"]
    assert 0 < delta["vllm:time_to_first_token_seconds_sum"] < delta["vllm:e2e_request_latency_seconds_sum"]
    assert after["vllm:kv_cache_usage_perc"] == 0  # idle: no request holds KV rows


def test_the_request_histograms_of_vllm_0_32_count_each_request(url: str) -> None:
    before = counters(url)
    body = {"messages": CODE, "temperature": 0, "max_tokens": 24, "ignore_eos": True}
    usage = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()["usage"]
    after = counters(url)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    for name in ("prefill_time", "decode_time", "inference_time", "time_per_output_token"):
        assert delta[f"vllm:request_{name}_seconds_count"] == 1, name
    for name in ("prompt_tokens", "generation_tokens", "max_num_generation_tokens"):
        assert delta[f"vllm:request_{name}_count"] == 1, name
    assert delta["vllm:request_prompt_tokens_sum"] == usage["prompt_tokens"]
    assert delta["vllm:request_generation_tokens_sum"] == usage["completion_tokens"] == 24
    assert delta["vllm:request_max_num_generation_tokens_sum"] == 24
    # one observation per engine step that emitted tokens: the prompt computed with the first token
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert delta["vllm:iteration_tokens_total_sum"] == usage["prompt_tokens"] - cached + 24
    assert delta["vllm:iteration_tokens_total_count"] == 1 + delta["vllm:inter_token_latency_seconds_count"]
    prefill, decode = (
        delta["vllm:request_prefill_time_seconds_sum"],
        delta["vllm:request_decode_time_seconds_sum"],
    )
    assert delta["vllm:request_inference_time_seconds_sum"] == pytest.approx(prefill + decode)
    assert 0 < decode < delta["vllm:e2e_request_latency_seconds_sum"]
    assert delta["vllm:request_time_per_output_token_seconds_sum"] == pytest.approx(decode / 23)


def test_a_stop_string_request_is_counted_as_stop_with_the_tokens_the_client_received(url: str) -> None:
    # vLLM counts a stop-string finish as "stop" and only what it returned; the engine ran on for 1-7
    # tokens before the abort landed, counted as "abort" with those tokens
    plain = {
        "messages": CODE,
        "temperature": 0,
        "max_tokens": 48,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    whole = httpx.post(url + "/v1/chat/completions", json=plain, timeout=120).json()["choices"][0]["message"]
    text = whole["content"] or whole["reasoning"]
    for at in (3, 12, 25):  # stop strings completed early, midway and late in the answer
        stop = text[len(text) * at // 48 :][:3]
        body = plain | {"stop": [stop], "stream": True, "stream_options": {"include_usage": True}}
        body["max_tokens"] = 400
        before = counters(url)
        rec = stream(url, "/v1/chat/completions", body, ChatRecorder())
        time.sleep(0.5)  # the engine applies the stop before its next step
        after = counters(url)
        delta = {k: after[k] - before.get(k, 0) for k in after}
        assert rec.finish_reason == "stop" and rec.completion_tokens is not None, stop
        assert delta["vllm:generation_tokens_total"] == rec.completion_tokens, stop
        assert (delta["success_stop"], delta["success_abort"], delta["success_length"]) == (1, 0, 0)
        assert delta["vllm:request_generation_tokens_sum"] == rec.completion_tokens
        assert delta["vllm:e2e_request_latency_seconds_count"] == 1


def test_concurrent_requests_queue_and_match_their_solo_answers(url: str, tools: list[dict]) -> None:
    # greedy: the answer depends only on the prompt (a seeded sampled answer also depends on the tree
    # the drafter builds, and the suffix drafter learns from earlier outputs)
    bodies = [
        {"messages": CODE, "temperature": 0, "max_tokens": 40},
        {"messages": AGENT, "tools": tools, "temperature": 0, "max_tokens": 60},
        {"messages": [{"role": "user", "content": "Explain what a write-ahead log is."}], "temperature": 0},
        {"prompt": "import os\n\ndef walk(", "max_tokens": 30, "temperature": 0},
    ]
    paths = ["/v1/completions" if "prompt" in b else "/v1/chat/completions" for b in bodies]
    solo = [httpx.post(url + p, json=b, timeout=120).json() for p, b in zip(paths, bodies, strict=True)]

    async def together() -> list[dict]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            replies = await asyncio.gather(
                *(client.post(p, json=b) for p, b in zip(paths, bodies, strict=True))
            )
        return [r.json() for r in replies]

    crowd = asyncio.run(together())
    for alone, together_ in zip(solo, crowd, strict=True):
        for reply in (alone, together_):
            reply.pop("id"), reply.pop("created")
            # acceptance and prefix-cache hits depend on what the drafter and the cache saw before
            reply["usage"].pop("spec_decode"), reply["usage"].pop("prompt_tokens_details")
            for c in (reply["choices"][0].get("message") or {}).get("tool_calls") or []:
                c.pop("id")  # call ids are random
        assert alone == together_


def _wait_for(url: str, key: str, value: float, timeout_s: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while (now := counters(url)).get(key, 0) < value:
        assert time.monotonic() < deadline, f"{key} stayed at {now.get(key, 0)} (expected {value})"
        time.sleep(0.1)
    return now


def test_client_disconnects_abort_running_and_queued_requests(url: str) -> None:
    aborted = counters(url).get("success_abort", 0)
    chat = url + "/v1/chat/completions"
    # as many tokens as the context holds: the engine must not finish the running request while the
    # test waits (a seeded run of 3,000 tokens took 3.5 s here, and a faster CI machine beat the test)
    most = MAX_LEN - 200
    long = {"messages": CODE, "max_tokens": most, "ignore_eos": True, "temperature": 0.7, "seed": 1}
    # (keep each response's chunk iterator referenced: dropping it makes httpx close the stream)
    with httpx.stream("POST", chat, json=long | {"stream": True}, timeout=60) as running:
        running_chunks = running.iter_raw()
        next(running_chunks)
        _wait_for(url, "vllm:num_requests_running", 1)
        # (a queued stream sends its headers at once and its first chunk only with its first token)
        with httpx.stream("POST", chat, json=long | {"stream": True}, timeout=60):
            _wait_for(url, "vllm:num_requests_waiting", 1)  # queued behind the running request
        _wait_for(url, "success_abort", aborted + 1)
        with pytest.raises(httpx.ReadTimeout):  # a non-streamed request whose client gives up
            httpx.post(chat, json=long, timeout=1.0)
        _wait_for(url, "success_abort", aborted + 2)
        assert counters(url)["vllm:num_requests_running"] == 1  # the first stream still runs
        next(running_chunks)
    state = _wait_for(url, "success_abort", aborted + 3)
    time.sleep(0.5)
    idle = counters(url)
    assert idle["vllm:generation_tokens_total"] == state["vllm:generation_tokens_total"]
    assert idle["vllm:num_requests_running"] == idle["vllm:num_requests_waiting"] == 0


def test_bad_requests_to_the_real_engine_get_4xx(url: str) -> None:
    long_prompt = "x = 1\n" * MAX_LEN
    r = httpx.post(url + "/v1/completions", json={"prompt": long_prompt, "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(url + "/v1/chat/completions", json={"messages": CODE, "max_tokens": MAX_LEN})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": CODE, "temperature": "hot"})
    assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]
    r = httpx.post(
        url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_replay_of_the_demo_corpus_reports_acceptance_from_metrics(url: str, tmp_path: Path) -> None:
    # the lumotree arm's request settings (per-chunk usage, token ids) against this running server
    argv = ["replay", DEMO, "--arm", "lumotree", "--endpoint", url, "--out", tmp_path]
    proc = lumobench(*argv, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = list(tmp_path.iterdir())
    report = json.loads(lumobench("report", run_dir, "--format", "json").stdout)["arms"][0]
    assert (report["arm"], report["completed"], report["failed"]) == ("lumotree", 22, 0)
    assert report["accepted_per_event"] > 0.5 and report["per_position_acceptance"][0] > 0.3
    assert report["tokens_per_chunk"] > 1.5  # speculation delivers several tokens per streamed chunk
    assert set(report["phase_ms"]) >= {"target", "drafter", "dispatch"}  # the paper's Table IX spans
    assert all(ms > 0 for ms in report["phase_ms"].values())
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["completion_tokens"] == len(r["token_ids"]) == r["chunk_tokens"][-1]
        assert r["t_send_ns"] < r["t_first_ns"] <= r["t_end_ns"]
    before, after = ((run_dir / "metrics" / f"run0.seg0.{s}.prom").read_text() for s in ("before", "after"))
    served = sum(v for _, v in parse_prometheus(after)["vllm:generation_tokens_total"]) - sum(
        v for _, v in parse_prometheus(before)["vllm:generation_tokens_total"]
    )
    assert served == sum(r["completion_tokens"] for r in rows)
    # run.json records how the engine ran: the native forward's ISA path and the shape it chose for it
    engine = json.loads((run_dir / "run.json").read_text())["engine_config"]
    assert engine["kernels"] == "cpu-native" and engine["native_isa"] == native_isa()
    assert engine["tree_shape"] == NATIVE_TREE_SHAPE[native_isa()]
    assert engine["rows"] == EngineConfig(kernels="cpu-native").shaped().geometry().rows


def test_foreign_host_names_huge_bodies_and_invalid_text_get_4xx(url: str) -> None:
    # bound to 127.0.0.1: a name a web page controls (DNS rebinding) is refused, loopback names are not
    assert httpx.get(url + "/health", headers={"Host": "rebind.attacker.example"}).status_code == 403
    assert httpx.get(url.replace("127.0.0.1", "localhost") + "/health").status_code == 200
    raw = {"content-type": "application/json"}
    bad_text = httpx.post(url + "/v1/completions", content=json.dumps({"prompt": "\ud800"}), headers=raw)
    assert bad_text.status_code == 400 and bad_text.json()["error"]["param"] == "prompt"
    huge = b'{"prompt": "' + b"x" * (33 * 2**20) + b'"}'  # over any default limit (32 MiB at most)
    assert httpx.post(url + "/v1/completions", content=huge, headers=raw, timeout=60).status_code == 413


def _server_pid(url: str) -> int:
    """The pid of the `python -m lumotree.server` process listening on `url`'s port."""
    (pid,) = processes_with("lumotree.server", url.rsplit(":", 1)[1])
    return pid


def _rss_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_bodies_too_big_for_the_context_neither_stall_the_server_nor_keep_its_memory(url: str) -> None:
    # the bodies: 900k one-word messages (27 MB) silenced /health 11-12 s, 400k tools 8 s, and a
    # 10 MB prompt added 1.5-1.8 GB of RSS that was never returned
    raw = {"content-type": "application/json"}
    word = [{"role": "user", "content": "hi"}]
    bodies = {
        "messages": json.dumps({"messages": word * 900_000}).encode(),
        "tools": json.dumps(
            {"messages": word, "tools": [{"type": "function", "function": {"name": "f"}}] * 400_000}
        ),
        "10 MB prompt": json.dumps({"messages": [{"role": "user", "content": "word " * 2_000_000}]}).encode(),
        # inside every limit: rendered and tokenized (~100k tokens), then refused for the context
        "tokenized": json.dumps({"messages": [{"role": "user", "content": "word " * 100_000}]}).encode(),
    }
    pid = _server_pid(url)
    idle = _rss_mb(pid)
    for name, body in [
        *bodies.items(),
        ("tokenized again", bodies["tokenized"]),
        ("again", bodies["tokenized"]),
    ]:
        answer: dict[str, httpx.Response] = {}

        def send(b: bytes | str = body, into: dict[str, httpx.Response] = answer) -> None:
            into["r"] = httpx.post(url + "/v1/chat/completions", content=b, headers=raw, timeout=120)

        sender = threading.Thread(target=send)
        sender.start()
        waits = []
        while sender.is_alive():
            start = time.monotonic()
            assert httpx.get(url + "/health", timeout=30).status_code == 200
            waits.append(time.monotonic() - start)
            time.sleep(0.05)
        sender.join()
        assert answer["r"].status_code in (400, 413), (name, answer["r"].text)
        assert max(waits, default=0) < 2.0, (name, max(waits))
        # what a request takes is given back, not kept per request
        assert _rss_mb(pid) - idle < 150, (name, _rss_mb(pid) - idle)


def test_a_key_in_the_query_string_is_masked_in_the_access_log(tmp_path: Path) -> None:
    secret = "sk-query-secret-abc123"
    log = tmp_path / "server.log"
    with lumotree_server(log, "--api-key", "lumo-test-key-k3y", "--max-model-len", "512") as base:
        assert httpx.get(f"{base}/v1/models?x=1&api_key={secret}").status_code == 401  # refused, still logged
        assert httpx.get(f"{base}/health?token={secret}").status_code == 200
    text = log.read_text()
    assert "GET /v1/models?x=1&api_key=*** HTTP/1.1" in text and "GET /health?token=*** HTTP/1.1" in text
    assert secret not in text


def test_api_key_is_required_when_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "lumo-test-key-k3y"
    with lumotree_server(tmp_path / "server.log", "--api-key", key, "--max-model-len", "512") as base:
        assert httpx.get(base + "/v1/models").status_code == 401
        bad = httpx.post(
            base + "/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer nope"}
        )
        assert bad.status_code == 401
        ok = httpx.post(
            base + "/v1/completions",
            json={"prompt": "def f():", "max_tokens": 4},
            headers={"Authorization": "Bearer " + key},
            timeout=60,
        )
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
        assert httpx.get(base + "/health").status_code == 200
        # replay sends the key it finds in the variable --api-key-env names, and writes only the name
        corpus = tmp_path / "short.jsonl"
        record = {"messages": CODE, "max_tokens": 8, "temperature": 0}
        corpus.write_text("".join(json.dumps(record | {"id": f"k{i}"}) + "\n" for i in range(2)))
        monkeypatch.setenv("LUMO_TEST_KEY", key)
        (plan,) = plan_replay(
            ReplayArgs(corpus=corpus, endpoint=base, out=tmp_path / "r", api_key_env="LUMO_TEST_KEY")
        ).plans
        (outcome,) = run_group([Member(plan)])
    assert (outcome.status, outcome.completed) == ("finished", 2)
    assert plan.run.read_meta().api_key_env == "LUMO_TEST_KEY"
    files = [p for p in plan.run.path.rglob("*") if p.is_file()]
    assert [p.name for p in files if key.encode() in p.read_bytes()] == []
