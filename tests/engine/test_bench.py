"""`lumobench bench engine`: the engine benchmark runs end to end from the harness's command line."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lumobench.cli import app
from lumotree.engine.config import NATIVE_TREE_SHAPE
from lumotree.model.native import build

from .conftest import DEMO


def test_bench_engine_writes_every_arm_and_its_own_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tmp_path / "two.jsonl"
    corpus.write_text("".join(DEMO.read_text().splitlines(keepends=True)[:2]))
    out = tmp_path / "engine.json"
    args = ["bench", "engine", str(corpus), "--runs", "1", "--max-tokens", "6", "--out", str(out),
            "--kernels", "cpu-native", "--kernels", "cpu-fast",
            "--tree-shape", "compact", "--tree-shape", "paper"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", [".venv/bin/lumobench", *args])  # what the console script sees
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert written["command"] == "lumobench bench engine " + " ".join(args[2:])
    names = ["lumotree-ar", "lumotree-mtp5", "lumotree[compact]", "lumotree[paper]"]
    assert [a["arm"] for a in written["arms"]] == [
        f"{n}[{k}]" for k in ("cpu-native", "cpu-fast") for n in names
    ]
    assert [a["kernels"] for a in written["arms"]] == ["cpu-native"] * 4 + ["cpu-fast"] * 4
    assert [a["rows"] for a in written["arms"]] == [1, 6, 9, 28] * 2
    assert written["requests"] == 2 and all(a["pooled_tokens_per_s"] > 0 for a in written["arms"])
    assert written["same_output_requests"] == {"cpu-native": 2, "cpu-fast": 2}  # lossless in each set
    assert "lumotree-mtp5[cpu-fast]" in result.output  # the table names the arms as the JSON does


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 -march targets")
def test_bench_engine_runs_every_arm_on_each_isa_path_side_by_side(tmp_path: Path) -> None:
    corpus = tmp_path / "two.jsonl"
    corpus.write_text("".join(DEMO.read_text().splitlines(keepends=True)[:2]))
    out = tmp_path / "engine.json"
    args = ["bench", "engine", str(corpus), "--runs", "1", "--max-tokens", "6", "--out", str(out),
            "--march", "native", "--march", "haswell"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    host = build.isa()  # what -march=native gives here (avx512 or avx2)
    assert [(a["march"], a["native_isa"]) for a in written["arms"]] == [("native", host)] * 3 + [
        ("haswell", "avx2")
    ] * 3
    assert (
        written["arms"][3]["arm"] == "lumotree-ar[avx2]"
        and written["arms"][5]["tree_shape"] == NATIVE_TREE_SHAPE["avx2"]
    )
    assert written["same_output_requests"] == {"auto[native]": 2, "auto[haswell]": 2}
    assert written["host"]["cpu_model"]
    bad = CliRunner().invoke(app, ["bench", "engine", str(corpus), "--march", "x86-64"])
    assert bad.exit_code == 2 and "needs AVX2+FMA, AVX-512 or ARM64 NEON" in " ".join(bad.output.split())


def test_bench_engine_refuses_a_missing_corpus(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "engine", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2 and "no corpus" in result.output


def test_bench_engine_refuses_an_unknown_kernel_set(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "engine", str(DEMO), "--kernels", "triton"])
    assert result.exit_code == 2 and "--kernels takes" in result.output
    result = CliRunner().invoke(app, ["bench", "engine", str(DEMO), "--tree-shape", "huge"])
    assert result.exit_code == 2 and "--tree-shape takes" in result.output


def test_bench_engine_runs_the_drafting_arms_once_per_draft_vocabulary(tmp_path: Path) -> None:
    corpus = tmp_path / "two.jsonl"
    corpus.write_text("".join(DEMO.read_text().splitlines(keepends=True)[:2]))
    vocab, out = tmp_path / "top512.json", tmp_path / "engine.json"
    build = ["-m", "lumotree.drafting.draft_vocab", str(DEMO), "--out", str(vocab), "--size", "512"]
    subprocess.run([sys.executable, *build], check=True, capture_output=True, timeout=120)
    args = ["bench", "engine", str(corpus), "--runs", "1", "--max-tokens", "6", "--out", str(out),
            "--kernels", "cpu-fast", "--draft-vocab", "none", "--draft-vocab", str(vocab)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert [(a["arm"], a["draft_vocab"]) for a in written["arms"]] == [
        ("lumotree-ar", None),
        ("lumotree-mtp5[full vocab]", None),
        ("lumotree-mtp5[dv top512]", str(vocab)),
        ("lumotree[full vocab]", None),
        ("lumotree[dv top512]", str(vocab)),
    ]
    assert written["same_output_requests"] == {"cpu-fast": 2}  # the draft vocabulary keeps outputs
    missing = str(tmp_path / "no.json")
    bad = CliRunner().invoke(app, ["bench", "engine", str(corpus), "--draft-vocab", missing])
    assert bad.exit_code == 2 and "--draft-vocab takes" in bad.output


def test_bench_prefill_times_every_arm_against_ar(tmp_path: Path) -> None:
    out = tmp_path / "prefill.json"
    args = ["bench", "prefill", str(DEMO), "--tokens", "200", "--reps", "2", "--inline-mtp"]
    args += ["--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert written["prompt_tokens"] == 200
    arms = [(a["arm"], a["overlap_prompt_mtp"]) for a in written["arms"]]
    spec = [("lumotree-mtp5", True), ("lumotree", True), ("lumotree-mtp5", False), ("lumotree", False)]
    assert arms == [("lumotree-ar", True), *spec]
    for name in ("ttft", "decode"):
        assert all(len(a[f"{name}_seconds"]) == 2 and a[f"{name}_min_s"] > 0 for a in written["arms"])
        assert written["arms"][0][f"{name}_min_vs_ar"] == 1.0
