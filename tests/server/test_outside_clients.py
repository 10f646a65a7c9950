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
from prometheus_client.parser import text_string_to_metric_families

from lumobench.corpus import load_corpus
from lumobench.errors import LumobenchError
from lumobench.metrics import parse_prometheus
from lumobench.vllm_cpu import VENV_DIR
from lumobench.vllm_cpu.env import build_vllm_cpu_env
from lumotree.model import default_model_path

from .live import LIVE_MAX_LEN

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


#: the histograms a stock vLLM 0.32 dashboard reads, each with the bucket family vLLM gives it
VLLM_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "time_to_first_token",
    "vllm:inter_token_latency_seconds": "inter_token_latency",
    "vllm:request_time_per_output_token_seconds": "inter_token_latency",
    "vllm:e2e_request_latency_seconds": "request_latency",
    "vllm:request_queue_time_seconds": "request_latency",
    "vllm:request_inference_time_seconds": "request_latency",
    "vllm:request_prefill_time_seconds": "request_latency",
    "vllm:request_decode_time_seconds": "request_latency",
    "vllm:request_prompt_tokens": "request_tokens",
    "vllm:request_generation_tokens": "request_tokens",
    "vllm:request_max_num_generation_tokens": "request_tokens",
    "vllm:iteration_tokens_total": "iteration_tokens",
}


@pytest.fixture(scope="module")
def vllm_python() -> str:
    try:
        return str(build_vllm_cpu_env(VENV_DIR))  # reused when built (the vLLM integration tests build it)
    except LumobenchError as exc:
        pytest.fail(f"the vLLM CPU environment could not be built: {exc}")


@pytest.mark.vllm
def test_metrics_carry_vllms_histograms_with_vllms_own_buckets(live_url: str, vllm_python: str) -> None:
    # vLLM's own code says the names and the bucket bounds (its loggers' source and buckets module)
    script = (
        "import json, re, vllm.v1.metrics.loggers as m\n"
        "from vllm.v1.metrics.buckets import histogram_buckets\n"
        "names = re.findall(r'_histogram_cls\\(\\s*name=\"(vllm:[a-z0-9_]+)\"', open(m.__file__).read())\n"
        f"families = {sorted(set(VLLM_HISTOGRAMS.values()))!r}\n"
        f"bounds = {{f: histogram_buckets(f, max_model_len={LIVE_MAX_LEN}) for f in families}}\n"
        "print(json.dumps([names, bounds]))"
    )
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([vllm_python, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names, buckets = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(VLLM_HISTOGRAMS) <= set(names)  # every one of them is vLLM's
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(live_url + "/metrics").text)}
    for name, family in VLLM_HISTOGRAMS.items():
        assert families[name].type == "histogram", name
        bounds = [float(s.labels["le"]) for s in families[name].samples if s.name == name + "_bucket"]
        assert bounds == [*map(float, buckets[family]), float("inf")], name


def _counter(url: str, name: str, **labels: str) -> float:
    samples = parse_prometheus(httpx.get(url + "/metrics").text)[name]
    return sum(v for lab, v in samples if labels.items() <= lab.items())


def _histogram_counts(url: str) -> dict[str, float]:
    """Every histogram's _count and _sum, and the finished-request and generated-token counters."""
    families = text_string_to_metric_families(httpx.get(url + "/metrics").text)
    out: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            if sample.name.endswith(("_count", "_sum")) or sample.name == "vllm:generation_tokens_total":
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
            elif sample.name == "vllm:request_success_total":
                out[f"success_{sample.labels['finished_reason']}"] = sample.value
    return out


@pytest.mark.vllm
def test_vllm_bench_serve_on_a_custom_dataset_is_counted_request_for_request_by_the_servers_histograms(
    live_url: str, tmp_path: Path, vllm_python: str
) -> None:
    # --dataset-name custom reads its JSONL with pandas, which the vLLM CPU venv lacked
    n, out_len = 4, 12
    dataset = tmp_path / "prompts.jsonl"
    prompts = [m.content for r in load_corpus(DEMO)[:n] for m in r.messages if m.role == "user"][:n]
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    before = _histogram_counts(live_url)
    # fmt: off
    argv = [
        vllm_python, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
        "--backend", "openai-chat", "--base-url", live_url, "--endpoint", "/v1/chat/completions",
        "--model", "lumo-tiny-coder", "--tokenizer", str(default_model_path()),
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", str(out_len),
        "--num-prompts", str(n), "--max-concurrency", "1", "--ignore-eos", "--temperature", "0",
        "--num-warmups", "0", "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(tmp_path), "--result-filename", "bench.json",
    ]
    # fmt: on
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRITON_INTERPRET": "0"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = _histogram_counts(live_url)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    result = json.loads((tmp_path / "bench.json").read_text())
    assert (result["completed"], result["failed"]) == (n, 0)
    assert result["total_output_tokens"] == out_len * n == delta["vllm:generation_tokens_total"]
    # the server's histograms hold one observation per request the client completed, no more
    for name in VLLM_HISTOGRAMS:
        if name not in ("vllm:inter_token_latency_seconds", "vllm:iteration_tokens_total"):
            assert delta[name + "_count"] == n, name
    assert delta["success_length"] == n and delta["vllm:request_generation_tokens_sum"] == out_len * n
    assert delta["vllm:request_prompt_tokens_sum"] == result["total_input_tokens"]
    # one inter-token latency per engine step after a request's first token (as vLLM observes them); the
    # client's are gaps between chunks: it also times the role chunk, sent with the first output (one
    # more per request), and a step whose text was held back (a partial character) sends no chunk
    steps = delta["vllm:iteration_tokens_total_count"]
    assert delta["vllm:inter_token_latency_seconds_count"] == steps - n
    assert steps - n >= sum(len(itl) for itl in result["itls"]) - n
    assert result["spec_decode_num_drafts"] > 0  # read from our /metrics with vLLM's names
    # the server's own time to first token (engine arrival to first token, which includes the
    # prefill) is part of what the client measures: the role chunk goes out with the first output
    server_ttft_s = delta["vllm:time_to_first_token_seconds_sum"] / n
    assert result["mean_ttft_ms"] / 1000 >= 0.9 * server_ttft_s > 0
