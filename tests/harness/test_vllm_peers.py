"""The vLLM CPU peer arms end to end: vLLM's CPU build serving the shipped model's Qwen3-Next export with
its own MTP-5, interleaved with the embedded LumoTree AR arm on greedy demo requests.

Slow (one vLLM boot, 1-3 minutes on 2 cores): `pytest -m slow tests/harness/test_vllm_peers.py`. The
environment is built (or reused) under .cache/; if it cannot be built the test FAILS.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumobench.errors import LumobenchError
from lumobench.vllm_cpu import SHIPPED_EXPORT_DIR, VENV_DIR
from lumobench.vllm_cpu.env import build_vllm_cpu_env
from lumobench.vllm_cpu.export import export_qwen3_next

from .helpers import DEMO, REPO, lumobench

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def peers_built() -> None:
    try:
        build_vllm_cpu_env(VENV_DIR)
        export_qwen3_next(SHIPPED_EXPORT_DIR)
    except LumobenchError as exc:
        pytest.fail(f"the vLLM CPU peer environment could not be built: {exc}")


def test_vllm_mtp_arm_interleaved_with_lumotree_ar(peers_built: None, tmp_path: Path) -> None:
    lines = (
        (REPO / "corpora" / "demo-greedy.jsonl").read_text().splitlines()[::5]
    )  # 5 requests, tools and not
    corpus = tmp_path / "greedy.jsonl"
    corpus.write_text("".join(json.dumps(json.loads(x) | {"max_tokens": 48}) + "\n" for x in lines))
    # the sampled demo is refused up front, naming the greedy variant
    refused = lumobench("replay", DEMO, "--arm", "vllm-cpu-mtp5", "--out", tmp_path / "no")
    assert refused.returncode == 2 and "serves greedy requests only" in refused.stderr
    assert "corpora/demo-greedy.jsonl" in refused.stderr
    out = tmp_path / "r"
    proc = lumobench(
        "replay", corpus, "--arm", "lumotree-ar", "--arm", "vllm-cpu-mtp5", "--interleaved", "--out", out,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirs = sorted(out.iterdir())
    ar, mtp = json.loads(lumobench("report", *dirs, "--format", "json").stdout)["arms"]
    assert (ar["arm"], mtp["arm"]) == ("lumotree-ar", "vllm-cpu-mtp5")
    assert ar["completed"] == mtp["completed"] == mtp["matched"] == 5 and mtp["interleaved"]
    assert mtp["accepted_per_event"] > 1.0  # vLLM's own MTP head drafts from the exported weights
    assert mtp["same_output_compared"] == 5 and mtp["ratio_vs_first"] > 0
    # idle arms stayed idle while the other was timed (vLLM busy-polls ~1 s after each request;
    # the replay waits that out before sending the next arm its request)
    assert ar["others_cpu_per_s"] < 0.05 and mtp["others_cpu_per_s"] < 0.05
