"""The engine's choice of kernel set on a CPU: the native forward by default ("auto"), the cpu-fast
PyTorch kernels when the native library cannot be built (said in the log), an error when cpu-native
is asked for and cannot run; the native library's build cache (one build per source, a clear
error without a working compiler); and its ISA paths ($LUMOTREE_NATIVE_MARCH): the AVX2 build on
any x86-64 machine decodes losslessly, a target without AVX2 fails with one line and the engine
says which kernels run instead, a target this CPU cannot run is refused before it runs."""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import pytest

from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.engine.config import NATIVE_TREE_SHAPE, SHAPE_COUNTS
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
    assert native.config.tree_shape == NATIVE_TREE_SHAPE[build.isa()]
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


def test_the_tree_shape_follows_the_kernels_unless_counts_were_given(monkeypatch: pytest.MonkeyPatch) -> None:
    paper, compact = SHAPE_COUNTS["paper"], SHAPE_COUNTS["compact"]

    def counts(config: EngineConfig) -> tuple[int, int, int, tuple[int, ...]]:
        return (config.mtp_depth, config.siblings, config.tail_len, config.rescue_lens)

    assert counts(EngineConfig(kernels="cpu-native", tree_shape="compact").shaped()) == compact
    assert EngineConfig(kernels="cpu-native", tree_shape="compact").shaped().geometry().rows == 1 + 2 + 4 + 2
    assert counts(EngineConfig(kernels="cpu-fast").shaped()) == paper
    assert counts(EngineConfig(kernels="cpu-native", tree_shape="paper").shaped()) == paper
    assert counts(EngineConfig(kernels="cpu-fast", tree_shape="compact").shaped()) == compact
    custom = EngineConfig(kernels="cpu-native", mtp_depth=3, siblings=1)
    assert counts(custom.shaped()) == (3, 1, 6, (4, 2))  # counts given: kept
    chain = EngineConfig(kernels="cpu-native", drafter="mtp")
    assert chain.shaped() == chain
    # the native forward's shape is the one measured fastest on this machine's ISA path
    for isa in NATIVE_TREE_SHAPE:
        monkeypatch.setattr("lumotree.engine.config.native_isa", lambda isa=isa: isa)
        chosen = EngineConfig(kernels="cpu-native").shaped()
        assert chosen.tree_shape == NATIVE_TREE_SHAPE[isa]
        assert counts(chosen) == SHAPE_COUNTS[NATIVE_TREE_SHAPE[isa]]
    monkeypatch.setattr("lumotree.engine.config.NATIVE_TREE_SHAPE", {"avx2": "small"})
    monkeypatch.setattr("lumotree.engine.config.native_isa", lambda: "avx2")
    assert counts(EngineConfig(kernels="cpu-native").shaped()) == SHAPE_COUNTS["small"]
    assert counts(EngineConfig(kernels="cpu-native", tree_shape="paper").shaped()) == paper  # asked for: kept
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


x86_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 -march targets")


@x86_only
def test_the_avx2_path_builds_on_any_x86_machine_and_decodes_losslessly(
    monkeypatch: pytest.MonkeyPatch, demo_prompts: list[GenerationRequest]
) -> None:
    """-march=haswell gives the AVX2 kernels; AR, chain MTP-5 and the tree give the same tokens there."""
    monkeypatch.setenv(build.MARCH_ENV, "haswell")
    assert build.isa() == "avx2"
    requests = [
        GenerationRequest(p.request_id, p.prompt_token_ids, SamplingParams(0.0), 24) for p in demo_prompts[:4]
    ]
    outputs = []
    for kind in ("ar", "mtp", "tree"):
        engine = LLMEngine(EngineConfig(drafter=kind, max_model_len=4096))  # type: ignore[arg-type]
        assert engine.config.kernels == "cpu-native"
        outputs.append({rid: output_tokens(ev) for rid, ev in run_requests(engine, requests).items()})
    assert outputs[0] == outputs[1] == outputs[2]
    assert all(len(tokens) == 24 for tokens in outputs[0].values())


@x86_only
def test_a_target_without_avx2_fails_in_one_line_and_the_engine_says_what_runs_instead(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(build.MARCH_ENV, "x86-64")  # SSE2 only
    with pytest.raises(build.NativeBuildError) as err:
        build.load_library()
    message = str(err.value)
    assert (
        "\n" not in message
        and "-march=x86-64" in message
        and "needs AVX2+FMA, AVX-512 or ARM64 NEON" in message
    )
    assert list(tmp_path.iterdir()) == []  # no half-built library left behind
    with caplog.at_level(logging.WARNING, logger="lumotree.engine.llm_engine"):
        engine = LLMEngine(EngineConfig(drafter="ar", max_model_len=512))
    assert engine.config.kernels == "cpu-fast"
    (line,) = [r.getMessage() for r in caplog.records if "native" in r.getMessage()]
    assert "needs AVX2+FMA" in line and "using the cpu-fast kernels" in line


@x86_only
def test_a_target_whose_vector_extensions_this_cpu_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """An AVX-512 build on an AVX2-only CPU would die of an illegal instruction: it is refused."""
    monkeypatch.setattr(build, "_cpu_flags", lambda: "flags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2")
    monkeypatch.setenv(build.MARCH_ENV, "skylake-avx512")
    with pytest.raises(
        build.NativeBuildError, match=r"-march=skylake-avx512 uses .*avx512f.*which this CPU lacks"
    ):
        build.load_library()
    monkeypatch.setenv(build.MARCH_ENV, "haswell")
    assert build.isa() == "avx2"


def test_a_march_value_that_is_no_target_name_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.MARCH_ENV, "haswell -O0")
    with pytest.raises(build.NativeBuildError, match="is not a -march value"):
        build.load_library()
