"""The plugin against the installed vLLM 0.32 (CPU build): inert unless asked, activated by
LUMOTREE_VLLM=1, its pins holding (and a changed vLLM function refused by name), its KV reader
agreeing with vLLM's own writer in every layout (slow: one vLLM import, ~20-40 s; the default run's
server test, test_server.py, activates the plugin, which checks the pins and its KV layout at
start-up); any other vLLM version refused with one line, and the pin check itself (on functions of
this environment) refusing a changed or missing function by name."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lumotree.vllm.pins import PINNED_VERSION, PinError, check_functions, check_version, digest

PROBE = Path(__file__).with_name("vllm_probe.py")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.vllm
def test_inert_unless_asked_pins_hold_a_changed_function_is_refused_and_the_kv_reader_agrees(
    vllm_python: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LUMOTREE_VLLM"} | {"HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [str(vllm_python), str(PROBE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["inert"] is True  # loaded by vLLM, touched nothing
    assert found["activated"] is True
    assert found["pins"] == "ok"
    assert len(found["layouts"]) >= 4 and set(found["layouts"].values()) == {"ok"}, found["layouts"]
    assert found["changed"].startswith(
        "lumotree.vllm: vLLM function vllm.v1.core.sched.scheduler.Scheduler.update_draft_token_ids changed"
    )


def test_another_vllm_version_is_refused_with_one_line() -> None:
    check_version(PINNED_VERSION)
    with pytest.raises(PinError) as err:
        check_version("0.33.0")
    assert str(err.value) == f"lumotree.vllm supports vLLM {PINNED_VERSION} only; this is vLLM 0.33.0"


def test_a_changed_or_missing_pinned_function_is_refused_by_name() -> None:
    target = ("lumotree.vllm.pins", "check_version")
    check_functions({target: digest(target)})
    with pytest.raises(PinError, match=r"vLLM function lumotree\.vllm\.pins\.check_version changed"):
        check_functions({target: "0" * 16})
    with pytest.raises(PinError, match=r"vLLM function lumotree\.vllm\.pins\.gone is missing"):
        check_functions({("lumotree.vllm.pins", "gone"): "0" * 16})
