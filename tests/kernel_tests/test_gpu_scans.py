"""The GDN paths scan on a CUDA GPU, both decompositions: every output and record of random trees of
every shape bit for bit the row scan's, at the shipped model's and Qwen3.5-27B's GDN shapes, in bf16,
with the default path programs (so trees with more walks take the loop) (compiled kernels: the
interpreter's test cannot vouch for the GPU's layouts).

Run on the device machine with: TRITON_INTERPRET=0 pytest -m gpu tests/kernel_tests/test_gpu_scans.py
"""

from __future__ import annotations

import pytest
import torch

from lumobench.bench.gdn_forms import SCANS, scans_match_rows
from lumotree.model import default_model_path
from lumotree.model.config import HybridConfig
from lumotree.model.random_weights import preset_config
from lumotree.verify.gdn.plan import DEFAULT_PATHS

from .helpers import GPU_ONLY

pytestmark = GPU_ONLY


@pytest.mark.parametrize("shapes", ["lumo-tiny-coder", "qwen3.5-27b"])
def test_the_scans_give_every_row_the_row_scans_bits(shapes: str) -> None:
    tiny = shapes == "lumo-tiny-coder"
    cfg = HybridConfig.from_file(default_model_path()) if tiny else preset_config(shapes)
    with torch.inference_mode():
        cases = scans_match_rows(cfg, torch.bfloat16, torch.device("cuda"), seed=11)
    parted = [c for c in cases if not all(c[f"{form}_equal"] for form in SCANS)]
    assert len(cases) >= 7 and not parted, parted
    assert any(c["paths"] > DEFAULT_PATHS for c in cases), "no tree took the loop over paths"
