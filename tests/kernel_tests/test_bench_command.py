"""`lumobench bench kernels`: the CPU smoke path (--tiny, interpreter) and its user errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lumobench.cli import app


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the no-GPU paths")
def test_tiny_run_writes_json_and_markdown_tables(tmp_path: Path) -> None:
    args = ["bench", "kernels", "--tiny", "--suites", "selection,walk", "--iters", "2", "--warmup", "0"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "kernels.json").read_text())
    methods = [row["method"] for suite in ("selection", "walk") for row in data[suite]]
    assert "lumotree fused selection" in methods and "device sampling walk (Philox race)" in methods
    assert all(row["eager"]["median_ms"] > 0 for suite in ("selection", "walk") for row in data[suite])
    assert "### Draft selection" in (tmp_path / "kernels.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the no-GPU paths")
def test_full_run_without_a_gpu_exits_with_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "kernels", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "no CUDA device" in result.output and "Traceback" not in result.output


def test_unknown_suite_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "kernels", "--suites", "gdn,bogus", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "bogus" in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the no-GPU paths")
def test_methods_filter_keeps_only_matching_gdn_methods(tmp_path: Path) -> None:
    args = ["bench", "kernels", "--tiny", "--no-fla", "--suites", "gdn", "--iters", "1", "--warmup", "0"]
    result = CliRunner().invoke(
        app, [*args, "--eager-iters", "1", "--methods", "native", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "kernels.json").read_text())["gdn"]["methods"]
    assert rows and all("native" in row["method"] for row in rows)
    value_major = CliRunner().invoke(
        app, [*args, "--eager-iters", "1", "--methods", "value-major", "--out", str(tmp_path / "vm")]
    )
    assert value_major.exit_code == 0, value_major.output
    rows = json.loads((tmp_path / "vm" / "kernels.json").read_text())["gdn"]["methods"]
    assert len(rows) == 2 and all("value-major" in row["method"] for row in rows)  # one launch, per layer
    assert not [row for row in rows if "error" in row], rows
    missing = CliRunner().invoke(app, [*args, "--methods", "no-such-method", "--out", str(tmp_path / "none")])
    assert missing.exit_code == 0  # the suite's error is reported in the table, the run goes on
    assert (
        "no GDN method label contains"
        in json.loads((tmp_path / "none" / "kernels.json").read_text())["gdn"]["error"]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises the no-GPU paths")
@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["cycle"], "the cycle benchmark"),
        (["cycle-profile", "--random-weights", "qwen3.5-27b"], "the cycle profile"),
        (["gdn-forms"], "the GDN forms bench"),
        (["read-floor"], "the read-floor benchmark"),
        (["attention"], "the attention benchmark"),
        (["skinny-gemm"], "the skinny GEMM benchmark"),
        (["row-invariance"], "the row-invariance check"),
    ],
)
def test_gpu_benchmarks_without_a_gpu_exit_with_one_clear_line(
    tmp_path: Path, args: list[str], what: str
) -> None:
    result = CliRunner().invoke(app, ["bench", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"error: {what} needs a CUDA GPU" in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir()), "nothing written"


@pytest.mark.parametrize("option", ["--paths-registers", "--block-v", "--conv-warps"])
def test_gdn_forms_refuses_a_list_that_is_not_integers(tmp_path: Path, option: str) -> None:
    result = CliRunner().invoke(app, ["bench", "gdn-forms", option, "4,x", "--out", str(tmp_path / "f")])
    assert result.exit_code == 2, result.output
    assert "take comma-separated integers" in result.output and "Traceback" not in result.output


def test_ab_cycle_script_without_a_staged_baseline_says_how_to_stage_one(tmp_path: Path) -> None:
    script = Path(__file__).parents[2] / "lumobench/bench/device/ab_cycle_h200.sh"
    result = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env={"OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "no revision staged under .stage/base/serving" in result.stderr
    assert not (tmp_path / "out").exists(), "nothing runs without a baseline"


def _staged_device_copy(tmp_path: Path, staged: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """tmp_path as the device's copy of the repository: each staged revision NAME (with its COMMIT
    label) under .stage, a scripted `python3` on PATH standing for the benchmarks (it appends what
    each call was given to the returned file), and the environment to run an A/B script in."""
    for name, commit in staged.items():
        (tmp_path / f".stage/{name}/serving").mkdir(parents=True)
        (tmp_path / f".stage/{name}/COMMIT").write_text(f"{commit}\n")
    (tmp_path / "lumobench/bench/device").mkdir(parents=True)
    (tmp_path / "lumobench/bench/device/carried_wheels.sh").write_text("")
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/bash\necho "${{LUMOBENCH_COMMIT:-none}} $PYTHONPATH $*" >> {calls}\n')
    fake.chmod(0o755)
    env = {"OUT": str(tmp_path / "out"), "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": "/site",
           "LUMOBENCH_COMMIT": "def5678"}  # fmt: skip
    return calls, env


def _run_script(name: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = Path(__file__).parents[2] / "lumobench/bench/device" / name
    return subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )


def test_ab_cycle_script_names_each_runs_commit(tmp_path: Path) -> None:
    """The base run's results name the staged baseline's commit (.stage/base/COMMIT), the head
    run's the caller's LUMOBENCH_COMMIT; the base imports the staged serving/ first."""
    calls, env = _staged_device_copy(tmp_path, {"base": "abc1234"})
    result = _run_script("ab_cycle_h200.sh", tmp_path, env)
    assert result.returncode == 0, result.stderr
    benches = [line.split() for line in calls.read_text().splitlines() if "lumobench.bench.cycle" in line]
    assert [b[0] for b in benches] == ["abc1234", "def5678"]
    assert benches[0][1] == f"{tmp_path}/.stage/base/serving:/site" and benches[1][1] == "/site"


def test_ab_attention_script_runs_staged_revisions_and_the_head_by_name(tmp_path: Path) -> None:
    """Each named revision runs from .stage/NAME/serving with its COMMIT as the label, "head" from
    the working tree with the caller's LUMOBENCH_COMMIT, in ORDER; an unstaged name stops the run
    before any arm runs."""
    calls, env = _staged_device_copy(tmp_path, {"base": "abc1234", "v2": "bcd2345"})
    env |= {"ORDER": "v2 head base", "ATTN_ARGS": "--no-drafter"}
    result = _run_script("ab_attention_h200.sh", tmp_path, env)
    assert result.returncode == 0, result.stderr
    benches = [line.split() for line in calls.read_text().splitlines() if "lumobench.bench.attention" in line]
    assert [b[0] for b in benches] == ["bcd2345", "def5678", "abc1234"]
    assert [b[1] for b in benches] == [
        f"{tmp_path}/.stage/v2/serving:/site",
        "/site",
        f"{tmp_path}/.stage/base/serving:/site",
    ]
    assert all(b[-1] == "--no-drafter" and f"{tmp_path}/out/attention-" in " ".join(b) for b in benches)
    calls.unlink()
    env["ORDER"] = "v2 head missing"
    result = _run_script("ab_attention_h200.sh", tmp_path, env)
    assert result.returncode == 2 and "no revision staged under .stage/missing/serving" in result.stderr
    assert not calls.exists(), "an unstaged arm stops the run before any arm runs"
