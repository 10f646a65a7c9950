"""Tiny random configs and checkpoints shared by the model tests, and the native forward's ISA paths."""

from __future__ import annotations

import platform
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from lumotree.model import FULL, LINEAR, HybridConfig, HybridLM, ModelState
from lumotree.model.native import build, remote
from lumotree.model.native.model import NativeModel


def tiny_config(**changes) -> HybridConfig:
    """4 layers [GDN x3, attention], GQA in both mixers, MTP on; small enough for millisecond forwards."""
    base = HybridConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        layer_types=(LINEAR, LINEAR, LINEAR, FULL),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        tie_word_embeddings=False,
        mtp_num_hidden_layers=1,
    )
    return base.replace(**changes)


def perturbed_model(config: HybridConfig, seed: int = 0) -> HybridLM:
    """Random model whose norm weights are non-trivial too (zero-centred norms start at 0)."""
    model = HybridLM.random(config, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1 and "A_log" not in name and "dt_bias" not in name:
                param.add_(0.2 * torch.randn(param.shape, generator=gen))
    return model.eval()


@pytest.fixture(name="tiny_config")
def _tiny_config_factory():
    """Factory fixture: tiny_config(**changes) -> HybridConfig."""
    return tiny_config


@pytest.fixture(name="perturbed_model")
def _perturbed_model_factory():
    """Factory fixture: perturbed_model(config, seed=0) -> HybridLM."""
    return perturbed_model


@pytest.fixture
def tiny_model() -> HybridLM:
    return perturbed_model(tiny_config())


# ---- the native forward's ISA paths --------------------------------------------------------------
# native_path runs a test on each: the host's own build (-march=native), the AVX2 + FMA build
# (-march=haswell, on any x86-64 machine: what an AVX2-only CPU runs) and the ARM64 NEON build,
# cross-compiled and run under qemu-user through remote.py (skipped, saying so, where the cross
# compiler or qemu is missing; .ci/run installs them).
PATHS = ("host", "avx2", "neon-qemu")
CROSS_CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
NativeFactory = Callable[..., NativeModel]


def _is_x86() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


@pytest.fixture(scope="session")
def neon_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """driver.c built for ARM64 (static, so qemu-user needs no ARM libraries)."""
    missing = [tool for tool in (CROSS_CC, QEMU) if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    return remote.build_driver(CROSS_CC, "armv8-a", tmp_path_factory.mktemp("neon") / "driver", static=True)


@pytest.fixture(params=PATHS)
def native_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[NativeFactory]:
    """native_path(model, state, **kwargs) -> a NativeModel on this test's ISA path."""
    path = request.param
    driver: Path | None = None
    if path == "avx2":
        if not _is_x86():
            pytest.skip("the AVX2 path builds on x86-64 only")
        monkeypatch.setenv(build.MARCH_ENV, "haswell")
    elif path == "neon-qemu":
        driver = request.getfixturevalue("neon_driver")

    def make(model: HybridLM, state: ModelState, **kwargs: object) -> NativeModel:
        native = NativeModel(model, state, **kwargs)  # type: ignore[arg-type]
        if driver is not None:
            remote.attach(native, [QEMU, str(driver)])
        return native

    yield make
