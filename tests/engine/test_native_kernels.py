"""The engine's choice of kernel set on a CPU: the native forward by default ("auto"), the cpu-fast
PyTorch kernels when the native library cannot be built (said in the log), an error when cpu-native
is asked for and cannot run; and the native library's build cache (one build per source, a clear
error without a working compiler)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.engine.config import SHAPE_COUNTS
from lumotree.model.native import build
from lumotree.sampling import SamplingParams

from .helpers import output_tokens, run_requests


def _cannot_build() -> None:
    raise build.NativeBuildError("no C compiler found (set CC or install gcc)")


def test_auto_runs_the_native_forward_and_falls_back_to_cpu_fast_when_it_cannot_build(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, demo_prompts: list[GenerationRequest]
) -> None:
    prompt = demo_prompts[0]
    request = GenerationRequest("r", prompt.prompt_token_ids, SamplingParams(0.0), 12)
    native = LLMEngine(EngineConfig(drafter="tree", max_model_len=4096))
    assert native.config.kernels == "cpu-native" and native.runner.native is not None
    assert native.config.tree_shape == "compact"
    monkeypatch.setattr("lumotree.engine.llm_engine.load_library", _cannot_build)
    with caplog.at_level(logging.WARNING, logger="lumotree.engine.llm_engine"):
        fallback = LLMEngine(EngineConfig(drafter="tree", max_model_len=4096))
    assert fallback.config.kernels == "cpu-fast" and fallback.runner.native is None
    assert fallback.config.tree_shape == "paper"  # rows are cheap for the PyTorch kernels
    assert "no C compiler" in caplog.text
    got = [output_tokens(run_requests(e, [request])["r"]) for e in (native, fallback)]
    assert got[0] == got[1] and len(got[0]) == 12
    with pytest.raises(ValueError, match="cpu-native kernels cannot run: no C compiler"):
        LLMEngine(EngineConfig(kernels="cpu-native", max_model_len=4096))


def test_the_tree_shape_follows_the_kernels_unless_counts_were_given() -> None:
    paper, compact = SHAPE_COUNTS["paper"], SHAPE_COUNTS["compact"]

    def counts(config: EngineConfig) -> tuple[int, int, int, tuple[int, ...]]:
        return (config.mtp_depth, config.siblings, config.tail_len, config.rescue_lens)

    assert counts(EngineConfig(kernels="cpu-native").shaped()) == compact
    assert EngineConfig(kernels="cpu-native").shaped().geometry().rows == 1 + 2 + 4 + 2
    assert counts(EngineConfig(kernels="cpu-fast").shaped()) == paper
    assert counts(EngineConfig(kernels="cpu-native", tree_shape="paper").shaped()) == paper
    assert counts(EngineConfig(kernels="cpu-fast", tree_shape="compact").shaped()) == compact
    custom = EngineConfig(kernels="cpu-native", mtp_depth=3, siblings=1)
    assert counts(custom.shaped()) == (3, 1, 6, (4, 2))  # counts given: kept
    chain = EngineConfig(kernels="cpu-native", drafter="mtp")
    assert chain.shaped() == chain
    with pytest.raises(ValueError, match="tree_shape must be one of"):
        EngineConfig(tree_shape="huge")  # type: ignore[arg-type]


def test_the_library_is_built_once_per_source_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    first = build.library_path()
    assert first.parent == tmp_path and first.is_file()
    stamp = first.stat().st_mtime_ns
    assert build.library_path() == first and first.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left behind


def test_a_missing_compiler_is_a_clear_build_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(build.NativeBuildError, match="does not run"):
        build.library_path()
