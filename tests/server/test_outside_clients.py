"""Clients nobody here wrote, against the real server process and engine: the openai SDK (streamed chat
with tools and reasoning, logit_bias, vLLM's extra fields, an image part) and `vllm bench serve` from
the vLLM CPU venv (no failed request; its time to first token includes the prefill)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from harness.helpers import DEMO

from lumobench.corpus import load_corpus
from lumobench.errors import LumobenchError
from lumobench.metrics import parse_prometheus
from lumobench.vllm_cpu import VENV_DIR
from lumobench.vllm_cpu.env import build_vllm_cpu_env
from lumotree.model import default_model_path

pytestmark = pytest.mark.integration
AGENT = [
    {"role": "system", "content": "You are a careful software engineering agent. Use the tools."},
    {"role": "user", "content": "Where is `replay_wal` defined?"},
]
CODE = [{"role": "user", "content": "Complete this function:\n```python\ndef mean(xs):\n```"}]


@pytest.fixture(scope="module")
def sdk(live_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_sdk_streams_reasoning_and_one_tool_call_per_index(sdk: openai.OpenAI) -> None:
    tools = [t.model_dump(mode="json", exclude_none=True) for t in load_corpus(DEMO)[0].tools or []]
    stream = sdk.chat.completions.create(
        model="lumo-tiny-coder",
        messages=AGENT,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=96,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning, name, arguments = "", None, ""
    for chunk in chunks:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            assert extra.get("reasoning") == extra.get("reasoning_content")
            reasoning += extra.get("reasoning") or ""
            calls = choice.delta.tool_calls or []
            assert len({c.index for c in calls}) == len(calls)  # one entry per index per chunk
            if calls:  # what clients that read tool_calls[0] do
                name = name or calls[0].function.name
                arguments += calls[0].function.arguments or ""
    assert "replay_wal" in reasoning and name == "grep" and "replay_wal" in json.loads(arguments)["pattern"]
    finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.finish_reason for c in finishing] == ["tool_calls"]
    assert "stop_reason" in (finishing[0].model_extra or {})
    assert chunks[-1].usage.completion_tokens > 0 and chunks[-1].system_fingerprint.startswith("lumotree-")


def test_openai_sdk_logit_bias_changes_the_answer_and_image_parts_get_400(sdk: openai.OpenAI) -> None:
    def answer(**extra: object) -> openai.types.chat.ChatCompletion:
        return sdk.chat.completions.create(
            model="lumo-tiny-coder",
            messages=CODE,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=8,
            extra_body={"return_token_ids": True},
            **extra,  # type: ignore[arg-type]
        )

    plain = answer()
    first = plain.choices[0].model_extra["token_ids"][0]
    biased = answer(logit_bias={str(first): -100})
    assert biased.choices[0].model_extra["token_ids"][0] != first
    assert plain.system_fingerprint == biased.system_fingerprint and plain.system_fingerprint
    assert (
        plain.choices[0].message.model_extra["reasoning"]
        == plain.choices[0].message.model_extra["reasoning_content"]
    )
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(
            model="lumo-tiny-coder",
            messages=[{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}],
            max_tokens=4,
        )
    assert err.value.status_code == 400 and "'image_url' is not supported" in err.value.message


def _counter(url: str, name: str, **labels: str) -> float:
    samples = parse_prometheus(httpx.get(url + "/metrics").text)[name]
    return sum(v for lab, v in samples if labels.items() <= lab.items())


def test_vllm_bench_serve_completes_every_request_and_times_the_first_token_after_prefill(
    live_url: str, tmp_path: Path
) -> None:
    try:
        python = build_vllm_cpu_env(VENV_DIR)  # reused when built (the vLLM integration tests build it)
    except LumobenchError as exc:
        pytest.fail(f"the vLLM CPU environment could not be built: {exc}")
    n = 2
    ttft_before = _counter(live_url, "vllm:time_to_first_token_seconds_sum")
    requests_before = _counter(live_url, "vllm:time_to_first_token_seconds_count")
    # fmt: off
    argv = [
        str(python), "-m", "vllm.entrypoints.cli.main", "bench", "serve",
        "--backend", "openai-chat", "--base-url", live_url, "--endpoint", "/v1/chat/completions",
        "--model", "lumo-tiny-coder", "--tokenizer", str(default_model_path()),
        "--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "8",
        "--num-prompts", str(n), "--max-concurrency", "1", "--ignore-eos", "--temperature", "0",
        "--num-warmups", "0", "--disable-tqdm",
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json",
    ]
    # fmt: on
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRITON_INTERPRET": "0"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert (result["completed"], result["failed"]) == (n, 0)
    assert result["total_output_tokens"] == 8 * n
    assert result["spec_decode_num_drafts"] > 0  # read from our /metrics with vLLM's names
    # the server's own time to first token (engine arrival to first token, which includes the
    # prefill) is part of what the client measures: the role chunk no longer goes out before it
    served = _counter(live_url, "vllm:time_to_first_token_seconds_count") - requests_before
    server_ttft_s = (_counter(live_url, "vllm:time_to_first_token_seconds_sum") - ttft_before) / served
    assert served >= n  # the bench's readiness probe is one more request
    assert result["mean_ttft_ms"] / 1000 >= 0.9 * server_ttft_s > 0
