"""The plugin in a real vLLM CPU server (the `vllm-cpu-lumotree` arm, float32), one boot for the module.

The prefill budget is cut to 512 tokens so the demo prompts prefill in chunks, batched with other
requests' trees. Every request is sent twice at once, with drafts and with none (vllm_xargs
lumotree_drafts=0: root-only trees, the plugin's own sampler), and both outputs must be the same
tokens, greedy and seeded alike; vLLM's spec-decode counters must count the trees; a request that
fails inside the plugin fails alone, and one the plugin cannot honour is refused at admission.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from harness.helpers import DEMO, free_port

from lumobench.arms import load_arm, resolve_arm
from lumobench.corpus import CorpusRecord, load_corpus
from lumobench.errors import LumobenchError
from lumobench.launch import launched
from lumobench.metrics import parse_prometheus
from lumobench.vllm_cpu import SHIPPED_EXPORT_DIR
from lumobench.vllm_cpu.export import export_qwen3_next

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
# greedy; seeded with a presence penalty; min_p with a long prompt (prefilled in chunks); repetition penalty
RECORDS = ("ops-t01", "wal-t02", "ops-t03", "chat-explain")
MAX_TOKENS = 32  # short: this test is in the default run


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    """The shipped model exported to Qwen3-Next with its MTP weights (what the arm serves; reused)."""
    try:
        return export_qwen3_next(SHIPPED_EXPORT_DIR)
    except LumobenchError as exc:
        pytest.fail(f"exporting the shipped model for vLLM failed: {exc}")


@pytest.fixture(scope="module")
def server(
    vllm_python: Path, checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    config, source = load_arm("vllm-cpu-lumotree")
    command = list(config.command)
    command[command.index("--max-num-batched-tokens") + 1] = "512"  # chunked prefill, mixed batches
    config = config.model_copy(update={"command": command})
    arm = resolve_arm(config, source, port=free_port(), model=str(checkpoint))
    with launched(arm, tmp_path_factory.mktemp("vllm-lumotree") / "server.log") as running:
        yield arm.base_url, running.served_model or ""


def _body(record: CorpusRecord, model: str, drafts: bool) -> dict:
    dumped = record.model_dump(mode="json", exclude_unset=True)
    body = {"model": model, "messages": dumped["messages"], **record.sampling(), "return_token_ids": True}
    body["max_tokens"] = min(body.get("max_tokens") or MAX_TOKENS, MAX_TOKENS)
    if "tools" in dumped:
        body["tools"] = dumped["tools"]
    if not drafts:
        body["vllm_xargs"] = {"lumotree_drafts": 0}
    return body


def _complete(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=600)


def _spec_counters(url: str) -> dict[str, float]:
    metrics = parse_prometheus(httpx.get(url + "/metrics", timeout=30).text)
    names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    return {n: sum(v for _, v in metrics.get(f"vllm:spec_decode_{n}_total", [])) for n in names}


def test_tree_outputs_equal_no_draft_outputs_and_vllms_counters_count_the_trees(
    server: tuple[str, str],
) -> None:
    url, model = server
    records = {r.id: r for r in load_corpus(DEMO)}
    before = _spec_counters(url)
    jobs = [(rid, drafts) for rid in RECORDS for drafts in (True, False)]
    with ThreadPoolExecutor(max_workers=4) as pool:  # up to 4 requests in one vLLM batch
        responses = list(pool.map(lambda job: _complete(url, _body(records[job[0]], model, job[1])), jobs))
    tokens: dict[tuple[str, bool], list[int]] = {}
    for job, resp in zip(jobs, responses, strict=True):
        assert resp.status_code == 200, resp.text
        tokens[job] = resp.json()["choices"][0]["token_ids"]
    for rid in RECORDS:
        assert tokens[(rid, True)] == tokens[(rid, False)], rid
        assert len(tokens[(rid, True)]) > 0
    after = _spec_counters(url)
    drafts = after["num_drafts"] - before["num_drafts"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    draft_tokens = after["num_draft_tokens"] - before["num_draft_tokens"]
    assert drafts > 0 and draft_tokens >= 10 * drafts  # trees (a chain MTP-5 event holds 5)
    assert accepted / drafts > 1.5  # accepted drafts per speculative event


def test_a_request_failing_inside_the_plugin_fails_alone(server: tuple[str, str]) -> None:
    url, model = server
    record = next(r for r in load_corpus(DEMO) if r.id == "chat-short")
    with ThreadPoolExecutor(max_workers=2) as pool:  # the failing request shares a batch with a good one
        failing = pool.submit(
            _complete, url, _body(record, model, True) | {"vllm_xargs": {"lumotree_drafts": "maybe"}}
        )
        good = pool.submit(_complete, url, _body(record, model, True))
        assert failing.result().status_code == 500  # the server log names it: lumotree_drafts must be ...
        assert good.result().status_code == 200
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    after = _complete(url, _body(record, model, True))
    assert after.status_code == 200 and after.json()["choices"][0]["token_ids"]
    refused = _complete(url, _body(record, model, True) | {"min_tokens": 4})
    assert refused.status_code == 400 and "does not support min_tokens" in refused.text
