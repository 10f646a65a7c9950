"""Run inside the vLLM CPU environment (by test_vllm_internals.py): what the plugin finds in vLLM.

Prints one JSON object: whether loading vLLM's general plugins (what every vLLM process does at
start-up) patched anything without LUMOTREE_VLLM=1, whether activating then patched vLLM, whether
the pins hold, the error a changed pinned function gets, and whether the plugin's KV reader sees
what vLLM's own CPU KV writer writes.
"""

from __future__ import annotations

import json
import os

import torch
from vllm.plugins import load_general_plugins

os.environ.pop("LUMOTREE_VLLM", None)
load_general_plugins()

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

import lumotree.vllm as plugin  # noqa: E402
from lumotree.vllm import pins  # noqa: E402
from lumotree.vllm.paged_kv import check_layout  # noqa: E402
from lumotree.vllm.worker import vllm_kv_writer  # noqa: E402

result: dict[str, object] = {
    "inert": not plugin._active and not hasattr(GPUModelRunner._prepare_inputs, "__wrapped__"),
}
os.environ["LUMOTREE_VLLM"] = "1"
plugin.register()
result["activated"] = plugin._active and hasattr(GPUModelRunner._prepare_inputs, "__wrapped__")
try:
    pins.check_functions()
    result["pins"] = "ok"
except pins.PinError as exc:
    result["pins"] = str(exc)

layouts = {}
isas = [("vec", torch.float32), ("vec", torch.bfloat16), ("vec16", torch.float32), ("vec16", torch.bfloat16)]
if torch.cpu._is_amx_tile_supported():  # vLLM's bf16 layout on AMX CPUs
    isas.append(("amx", torch.bfloat16))
for isa, dtype in isas:
    try:
        check_layout(vllm_kv_writer(), isa, dtype)
        layouts[f"{isa}/{dtype}"] = "ok"
    except RuntimeError as exc:
        layouts[f"{isa}/{dtype}"] = str(exc)
result["layouts"] = layouts


def update_draft_token_ids(self, draft_token_ids):  # a vLLM release that changed this function
    self.spec = draft_token_ids


Scheduler.update_draft_token_ids = update_draft_token_ids
try:
    pins.check_functions()
    result["changed"] = None
except pins.PinError as exc:
    result["changed"] = str(exc)
print(json.dumps(result))
