"""transformers' Qwen3-Next gated-delta-rule recurrence, run in float64, as an independent reference.

`torch_recurrent_gated_delta_rule` hard-casts its inputs to float32. To use the same code in float64
we rebind the module's `torch` name, for the duration of one call, to a view of torch whose
`float32` attribute is float64; nothing else about the function changes. transformers is a
test-only dependency: `available()` says whether it can be imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch
from torch import Tensor

_MODULE = "transformers.models.qwen3_next.modeling_qwen3_next"


def available() -> bool:
    """True when transformers (with Qwen3-Next) is importable."""
    try:
        importlib.import_module(_MODULE)
    except ImportError:
        return False
    return True


class _TorchWithFloat64As32:
    float32 = torch.float64

    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)


@contextmanager
def _float32_means_float64(module: ModuleType) -> Iterator[None]:
    # transformers also warns on every call that flash-linear-attention is absent; that is expected.
    logging = importlib.import_module("transformers.utils.logging")
    saved, verbosity = module.torch, logging.get_verbosity()
    module.torch = _TorchWithFloat64As32()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        module.torch = saved
        logging.set_verbosity(verbosity)


def hf_recurrent_gdn_float64(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """One chain through transformers' recurrence in float64, with q/k L2 norm in the kernel.

    q, k [T, H, K] raw; v [T, HV, V]; g (log-decay), beta [T, HV]; state [HV, V, K] (V-first).
    Returns o [T, HV, V] and the final state [HV, V, K] (V-first), float64.
    """
    module = importlib.import_module(_MODULE)
    args = [x[None].double() for x in (q, k, v, g, beta)]
    initial = state.transpose(-1, -2)[None].double()  # transformers keeps the state K-first
    with _float32_means_float64(module):
        o, final = module.torch_recurrent_gated_delta_rule(
            *args, initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=True
        )
    return o[0], final[0].transpose(-1, -2)
