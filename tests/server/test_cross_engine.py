"""The same checkpoint served by vLLM (CPU build) and by this server: greedy outputs and log-probabilities
agree within bf16 noise.

lumo-tiny-coder is exported to the Qwen3-Next layout with its dense MLPs written as exact one-expert MoE
blocks (vLLM's Qwen3-Next refuses a model without MoE layers); both servers load that folder. vLLM's CPU
GDN kernel runs bf16 only, so our engine runs bf16 too. bf16 noise is measured, not assumed: both
engines' log-probabilities are compared with a float32 evaluation of the same weights along vLLM's greedy
path (our model code, which tests/model checks against transformers), and our error must be of the
same size as vLLM's (the paired rule of DESIGN §8). Where the greedy paths part, the float32 reference
must see the two candidates as a tie at that noise level.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from harness.helpers import DEMO, free_port

from lumobench.arms import load_arm, resolve_arm
from lumobench.corpus import load_corpus
from lumobench.errors import LumobenchError
from lumobench.launch import launched
from lumobench.vllm_cpu import VENV_DIR
from lumobench.vllm_cpu.env import build_vllm_cpu_env
from lumotree.model import HybridLM, default_model_path, load_checkpoint

from .live import lumotree_server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
MAX_TOKENS = 32
PAIRED_FACTOR = 2.0  # our bf16 error may be at most this multiple of vLLM's (max and mean)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lumo-next") / "lumo-tiny-coder-qwen3-next"
    export = [sys.executable, "-m", "lumotree.training", "export", "--model", str(default_model_path())]
    argv = [*export, "--out", str(out), "--format", "qwen3_next", "--dense-mlp-as-moe"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def vllm(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """vLLM's CPU build (the harness's cached environment) serving the exported checkpoint."""
    try:
        build_vllm_cpu_env(VENV_DIR)
    except LumobenchError as exc:
        pytest.fail(f"the vLLM CPU environment could not be built: {exc}")
    config, source = load_arm("vllm-cpu-tiny")
    arm = resolve_arm(config, source, port=free_port(), model=str(checkpoint))
    with launched(arm, tmp_path_factory.mktemp("vllm") / "vllm.log") as server:
        yield arm.base_url, server.served_model or ""


@pytest.fixture(scope="module")
def ours(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("ours") / "server.log"
    with lumotree_server(
        log, "--model", str(checkpoint), "--dtype", "bfloat16", "--max-model-len", "8192"
    ) as url:
        yield url


def greedy(url: str, model: str | None, ids: list[int]) -> dict:
    body = {
        "prompt": ids,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": 5,
        "return_token_ids": True,
    }
    resp = httpx.post(url + "/v1/completions", json=body | ({"model": model} if model else {}), timeout=300)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return {
        "ids": choice["token_ids"],
        "lp": choice["logprobs"]["token_logprobs"],
        "top": choice["logprobs"]["top_logprobs"],
    }


def reference_logprobs(model: HybridLM, prompt: list[int], path: list[int]) -> torch.Tensor:
    """float32 log-probabilities [len(path), vocab] at each position of `path` after `prompt`."""
    with torch.no_grad():
        hidden = model.prefill(torch.tensor(prompt + path), model.new_state(len(prompt) + len(path) + 1))
        logits = model.compute_logits(hidden[len(prompt) - 1 : len(prompt) + len(path) - 1])
        return torch.log_softmax(logits.float(), dim=-1)


def test_greedy_outputs_and_logprobs_agree_with_vllm(
    vllm: tuple[str, str], ours: str, checkpoint: Path, tmp_path: Path
) -> None:
    vllm_url, vllm_model = vllm
    reference = load_checkpoint(checkpoint, dtype=torch.float32)
    rows, err_ours, err_vllm, dual = [], [], [], []
    for rec in load_corpus(DEMO)[::3]:  # 8 requests: tool-using agent turns and plain chats
        dumped = rec.model_dump(mode="json", exclude_none=True)
        body = {"messages": dumped["messages"], "tools": dumped.get("tools")}
        ids = httpx.post(ours + "/tokenize", json=body).json()["tokens"]
        a, b = greedy(ours, None, ids), greedy(vllm_url, vllm_model, ids)
        ref = reference_logprobs(reference, ids, b["ids"])
        common = next(
            (i for i, (x, y) in enumerate(zip(a["ids"], b["ids"], strict=False)) if x != y),
            min(len(a["ids"]), len(b["ids"])),
        )
        exact = [float(ref[i, t]) for i, t in enumerate(b["ids"])]
        err_vllm += [abs(x - y) for x, y in zip(b["lp"], exact, strict=True)]
        err_ours += [abs(x - y) for x, y in zip(a["lp"][:common], exact[:common], strict=True)]
        dual += [abs(x - y) for x, y in zip(a["lp"][:common], b["lp"][:common], strict=True)]
        row = {
            "id": rec.id,
            "prompt_tokens": len(ids),
            "same_tokens": common,
            "ours": len(a["ids"]),
            "vllm": len(b["ids"]),
        }
        if common < min(len(a["ids"]), len(b["ids"])):
            # float32 gap between the token we chose and the one vLLM chose
            row["fp32_gap_at_divergence"] = abs(
                float(ref[common, a["ids"][common]] - ref[common, b["ids"][common]])
            )
        rows.append(row)
    noise = max(err_vllm)
    summary = {
        "tokens_compared": len(dual),
        "max_abs_dlogprob_ours_vs_vllm": max(dual),
        "mean_abs_dlogprob_ours_vs_vllm": sum(dual) / len(dual),
        "max_err_vs_fp32": {"ours_bf16": max(err_ours), "vllm_bf16": noise},
        "mean_err_vs_fp32": {
            "ours_bf16": sum(err_ours) / len(err_ours),
            "vllm_bf16": sum(err_vllm) / len(err_vllm),
        },
        "requests": rows,
    }
    (tmp_path / "cross-engine.json").write_text(json.dumps(summary, indent=1))
    print("\n" + json.dumps(summary, indent=1))
    assert max(err_ours) <= PAIRED_FACTOR * noise
    assert (
        summary["mean_err_vs_fp32"]["ours_bf16"] <= PAIRED_FACTOR * summary["mean_err_vs_fp32"]["vllm_bf16"]
    )
    assert all(r.get("fp32_gap_at_divergence", 0.0) <= 2 * noise for r in rows), rows
    assert sum(r["same_tokens"] for r in rows) >= 0.5 * sum(r["vllm"] for r in rows)  # mostly identical paths
