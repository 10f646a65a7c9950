"""The plugin with vLLM's prefix caching (the "align" mamba cache mode) in a real vLLM CPU server.

`vllm-cpu-lumotree` is booted with prefix caching on (the arm's LUMOTREE_VLLM_PREFIX_CACHING), then
without. A first request with a ~4.3k-token prompt decodes 300 tokens with trees; a request
repeating its prompt and output (greedy) and one repeating its prompt (seeded) must hit vLLM's
prefix cache (its `prefix_cache_hits` counter) and give the same tokens as under another
`cache_salt` (no hit, align mode computing everything), also sent 4 at once, and as the server
without prefix caching.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from harness.helpers import free_port

from lumobench.arms import load_arm, resolve_arm
from lumobench.errors import LumobenchError
from lumobench.launch import launched
from lumobench.metrics import parse_prometheus
from lumobench.vllm_cpu import SHIPPED_EXPORT_DIR
from lumobench.vllm_cpu.export import export_qwen3_next

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]
BLOCK = 128  # vLLM's mamba block size for this model in float32, align mode (log: "kv lcm block sizes")
PREFIX = "\n".join(
    f"def helper_{i}(items, key={i}):\n    return sorted(items)[{i} % len(items)]" for i in range(160)
)


@pytest.fixture(scope="module")
def checkpoint(vllm_python: Path) -> Path:
    try:
        return export_qwen3_next(SHIPPED_EXPORT_DIR)
    except LumobenchError as exc:
        pytest.fail(f"exporting the shipped model for vLLM failed: {exc}")


@contextmanager
def _server(checkpoint: Path, log: Path, caching: bool) -> Iterator[tuple[str, str]]:
    config, source = load_arm("vllm-cpu-lumotree")
    with pytest.MonkeyPatch.context() as env:  # the arm's option
        if caching:
            env.setenv("LUMOTREE_VLLM_PREFIX_CACHING", "--enable-prefix-caching")
        else:
            env.delenv("LUMOTREE_VLLM_PREFIX_CACHING", raising=False)
        arm = resolve_arm(config, source, port=free_port(), model=str(checkpoint))
    assert ("--enable-prefix-caching" in arm.argv) is caching
    with launched(arm, log) as running:
        yield arm.base_url, running.served_model or ""


def _counter(url: str, name: str) -> float:
    metrics = parse_prometheus(httpx.get(url + "/metrics", timeout=30).text)
    return sum(v for _, v in metrics.get(name, []))


def _complete(url: str, body: dict) -> tuple[list[int], list[int], float]:
    """(prompt ids, output ids, prefix-cache hits the request added)."""
    before = _counter(url, "vllm:prefix_cache_hits_total")
    resp = httpx.post(url + "/v1/completions", json={"return_token_ids": True, **body}, timeout=900)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    hits = _counter(url, "vllm:prefix_cache_hits_total") - before
    return choice["prompt_token_ids"], choice["token_ids"], hits


def _salted(body: dict, model: str, name: str, salt: str) -> dict:
    return {**body, "model": model} | ({"cache_salt": f"{salt}-{name}"} if salt else {})


def test_cached_prefixes_are_not_prefilled_again_and_outputs_equal_uncached_ones(
    checkpoint: Path, tmp_path: Path
) -> None:
    greedy = {"temperature": 0, "ignore_eos": True}
    seeded = {"temperature": 0.8, "top_p": 0.95, "seed": 7, "ignore_eos": True}
    with _server(checkpoint, tmp_path / "cached.log", caching=True) as (url, model):
        prompt, output, hits = _complete(url, {**greedy, "model": model, "prompt": PREFIX, "max_tokens": 300})
        assert len(prompt) > 4000 and len(output) == 300 and hits == 0
        requests = {  # repeats of the first request's prompt (and output)
            "greedy": {**greedy, "prompt": prompt + output + prompt[:24], "max_tokens": 48},
            "seeded": {**seeded, "prompt": prompt + prompt[-40:], "max_tokens": 48},
        }
        cached = {}
        for name, body in requests.items():
            _, cached[name], hits = _complete(url, {**body, "model": model})
            _, fresh, fresh_hits = _complete(url, {**body, "model": model, "cache_salt": f"fresh-{name}"})
            print(f"{name}: prompt {len(prompt)}, prefix-cache hits {hits}, under another salt {fresh_hits}")
            assert hits >= len(prompt) // BLOCK * BLOCK and fresh_hits == 0
            assert cached[name] == fresh, name
        assert _counter(url, "vllm:spec_decode_num_accepted_tokens_total") > 100  # trees ran throughout
        jobs = [(name, salt) for name in requests for salt in ("", "batched")]  # 4 in one vLLM batch
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            batched = list(pool.map(lambda job: _complete(url, _salted(requests[job[0]], model, *job)), jobs))
        for (name, salt), (_, tokens, _) in zip(jobs, batched, strict=True):
            assert tokens == cached[name], (name, salt)
    with _server(checkpoint, tmp_path / "uncached.log", caching=False) as (url, model):
        _, first, _ = _complete(url, {**greedy, "model": model, "prompt": PREFIX, "max_tokens": 300})
        assert first == output
        for name, body in requests.items():
            _, uncached, _ = _complete(url, {**body, "model": model})
            assert cached[name] == uncached, name
