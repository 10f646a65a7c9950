"""Row invariance of the device verification on a CUDA GPU: in every op family, a chain row verified
with others (6 and 32 rows) has the bits of the one-row step for its token at its position, in the
engine's forms (`lumobench.bench.row_invariance`, bfloat16, the shipped model's and the 27B's shapes).

Run on the device machine with: TRITON_INTERPRET=0 pytest -m gpu tests/kernel_tests/test_gpu_row_invariance.py
"""

from __future__ import annotations

import pytest
import torch

from lumobench.bench import row_invariance as ri
from lumotree.model import default_model_path, load_checkpoint

from .helpers import GPU_ONLY

pytestmark = GPU_ONLY


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return load_checkpoint(default_model_path(), dtype=torch.bfloat16, device=torch.device("cuda"))


@pytest.mark.parametrize("family", ["gemm", "logits", "attention", "gdn"])
def test_the_engine_forms_give_a_row_the_one_row_steps_bits(model: torch.nn.Module, family: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    cases = {
        "gemm": lambda: ri.gemm_cases(model, torch.bfloat16, gen),
        "logits": lambda: ri.logits_cases(model, gen),
        "attention": lambda: ri.attention_cases(model, torch.bfloat16, gen),
        "gdn": lambda: ri.gdn_cases(model, torch.bfloat16, gen),
    }[family]
    with torch.inference_mode():
        engine = [c for c in cases() if "(engine)" in c["form"]]
    assert engine, "no engine form checked"
    parted = [c for c in engine if c["rows_equal"] != c["rows"]]
    assert not parted, parted
