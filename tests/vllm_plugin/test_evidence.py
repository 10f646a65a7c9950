"""The plugin's evidence on the whole demo corpus, through `lumobench replay` as a user runs it (slow:
each replay boots its arms; minutes on 2 cores). Measured results: results/cpu/vllm-lumotree.md.

- tree (`vllm-cpu-lumotree`) against the plugin with no drafts (`vllm-cpu-lumotree-ar`, its own
  sampler on root-only trees): the same tokens for all 22 requests, greedy and seeded, at
  concurrency 1 and 4;
- greedy requests against vLLM's own plain decoding (`vllm-cpu-ar-f32`: vLLM's sampler and attention,
  float32, the GDN core the plugin's since vLLM's is bf16 only): the whole corpus made greedy;
- accepted drafts per event within 10 % of the project engine's `lumotree` arm on the same model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness.helpers import DEMO, free_port, lumobench

from lumobench.vllm_cpu import SHIPPED_EXPORT_DIR
from lumobench.vllm_cpu.export import export_qwen3_next

REPLAY_TIMEOUT_S = 3600
pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.timeout(2 * REPLAY_TIMEOUT_S),
]


@pytest.fixture(autouse=True, scope="module")
def _built(vllm_python: Path) -> None:
    """What `python -m lumobench.vllm_cpu` builds: the venv with the plugin, and the export the arms serve."""
    export_qwen3_next(SHIPPED_EXPORT_DIR)


def _replay(corpus: Path, arms: list[str], out: Path, *extra: str) -> list[dict]:
    """`lumobench replay` of the arms (compared in one table), then `lumobench report --format json`."""
    args = [a for arm in arms for a in ("--arm", arm)]
    args += ["--port", str(free_port())]  # arms run one after another; their own ports may be taken
    proc = lumobench("replay", corpus, *args, "--out", out, *extra, timeout=REPLAY_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # in the arms' order: the report compares every arm's outputs with the first arm's
    by_name = {
        json.loads((p / "run.json").read_text())["arm"]["name"]: p
        for p in out.iterdir()
        if (p / "run.json").is_file()
    }
    runs = [by_name[arm] for arm in arms]
    report = lumobench("report", *runs, "--format", "json", timeout=300)
    assert report.returncode == 0, report.stderr
    by_arm = {row["arm"]: row for row in json.loads(report.stdout)["arms"]}
    return [by_arm[arm] for arm in arms]


def _greedy_corpus(tmp_path: Path) -> Path:
    """The demo corpus with every request greedy (temperature 0, no sampling filters)."""
    out = tmp_path / "demo-all-greedy.jsonl"  # not demo-greedy: that name has a manifest
    drop = ("top_k", "top_p", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty")
    rows = []
    for line in DEMO.read_text().splitlines():
        record = {k: v for k, v in json.loads(line).items() if k not in drop}
        rows.append(json.dumps(record | {"temperature": 0.0}))
    out.write_text("\n".join(rows) + "\n")
    return out


@pytest.mark.parametrize("concurrency", [1, 4])
def test_tree_outputs_equal_no_draft_outputs_on_the_demo_corpus(tmp_path: Path, concurrency: int) -> None:
    reference, tree = _replay(
        DEMO, ["vllm-cpu-lumotree-ar", "vllm-cpu-lumotree"], tmp_path, "--concurrency", str(concurrency)
    )
    assert reference["completed"] == tree["completed"] == 22
    assert (tree["same_output"], tree["same_output_compared"]) == (22, 22), tree["differing_outputs"]
    assert tree["accepted_per_event"] > 2.0


def test_greedy_outputs_equal_vllms_plain_decoding(tmp_path: Path) -> None:
    plain, tree = _replay(
        _greedy_corpus(tmp_path), ["vllm-cpu-ar-f32", "vllm-cpu-lumotree"], tmp_path / "runs"
    )
    assert plain["completed"] == tree["completed"] == 22
    assert tree["same_output"] == tree["same_output_compared"] == 22, tree["differing_outputs"]


def test_acceptance_is_within_ten_percent_of_the_project_engines_tree(tmp_path: Path) -> None:
    engine, plugin = _replay(DEMO, ["lumotree", "vllm-cpu-lumotree"], tmp_path)
    assert engine["completed"] == plugin["completed"] == 22
    ratio = plugin["accepted_per_event"] / engine["accepted_per_event"]
    assert 0.9 <= ratio <= 1.1, (plugin["accepted_per_event"], engine["accepted_per_event"])
