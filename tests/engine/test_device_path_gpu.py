"""The engine on a CUDA GPU (device path: triton kernels, one captured graph per cycle, device
walk, chained cycles launched ahead), with the shipped model: AR, chain MTP-5 and the paper tree
give identical outputs, one synchronisation per cycle and none hidden, the phases timed inside the
graph, forced acceptance as scheduled; random-weight presets build on the device.

Run on the GPU machine: TRITON_INTERPRET=0 pytest -m gpu tests/engine/test_device_path_gpu.py
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from lumotree.drafting.draft_vocab import corpus_texts, load_draft_vocab, most_frequent, save_draft_vocab
from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.model import default_model_path
from lumotree.sampling import SamplingParams
from lumotree.tree import TreeTopology
from tests.engine.conftest import DEMO
from tests.engine.helpers import output_tokens, run_requests

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
MAX_TOKENS = 48


def _requests(demo_prompts: list[GenerationRequest], n: int = 8) -> list[GenerationRequest]:
    """The first n demo requests (greedy and seeded ones), shortened."""
    return [
        GenerationRequest(r.request_id, r.prompt_token_ids, r.sampling, MAX_TOKENS, r.seed)
        for r in demo_prompts[:n]
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_drafters_give_identical_outputs_on_the_gpu(
    demo_prompts: list[GenerationRequest], dtype: str
) -> None:
    requests = _requests(demo_prompts)
    outputs, syncs, cycles = {}, {}, {}
    for drafter in ("ar", "mtp", "tree"):
        engine = LLMEngine(EngineConfig(drafter=drafter, dtype=dtype))
        assert engine.device.type == "cuda" and engine.config.kernels == "triton"
        assert engine.runner.graphs == ("cycle",)
        events = run_requests(engine, requests)
        outputs[drafter] = {rid: output_tokens(ev) for rid, ev in events.items()}
        m = engine.metrics()
        syncs[drafter], cycles[drafter] = m.device_syncs, m.spans["target"].count
        if drafter != "ar":
            assert m.spec.num_accepted_tokens > 0
        cycle = m.spans["cycle"]
        assert cycle.count == m.spans["target"].count and cycle.seconds > 0
        phases = sum(m.spans[p].seconds for p in ("target", "dispatch"))
        assert 0 < phases < cycle.seconds  # the drafting phase is the rest of the device cycle
    for drafter in ("mtp", "tree"):
        differing = [rid for rid in outputs["ar"] if outputs[drafter][rid] != outputs["ar"][rid]]
        assert not differing, f"{drafter} differs from AR ({dtype}) on {differing}"
        assert syncs[drafter] == cycles[drafter]


def test_trees_drafted_on_the_device_equal_the_hosts_on_the_gpu(
    demo_prompts: list[GenerationRequest],
) -> None:
    """bf16 paper tree, eight demo requests on one engine (the later ones find the earlier outputs
    in the suffix cache): drafted inside the cycle, every verified tree is the one the host drafter
    makes between cycles, and so are the outputs."""
    requests = _requests(demo_prompts)
    trees: dict[str, list[TreeTopology]] = {}
    outputs = {}
    for drafting in ("device", "host"):
        engine = LLMEngine(EngineConfig(drafter="tree", dtype="bfloat16", tree_drafting=drafting))  # type: ignore[arg-type]
        verified: list[TreeTopology] = []
        cycle = engine.runner.cycle

        def record(tree: TreeTopology, *args: object, cycle=cycle, verified=verified, **kw: object) -> object:
            verified.append(tree)
            return cycle(tree, *args, **kw)

        engine.runner.cycle = record  # type: ignore[method-assign]
        outputs[drafting] = {rid: output_tokens(ev) for rid, ev in run_requests(engine, requests).items()}
        trees[drafting] = verified
    assert outputs["device"] == outputs["host"]
    assert trees["device"] == trees["host"]
    assert sum(t.n_active > 16 for t in trees["device"]) > len(requests)  # suffix branches were drafted


def test_a_draft_vocabulary_keeps_the_outputs_and_drafts_inside_it_on_the_gpu(
    demo_prompts: list[GenerationRequest], tmp_path: Path
) -> None:
    """bf16 tree and MTP-5 with the 256 commonest demo-corpus tokens as the draft vocabulary: the
    outputs are AR's, and the device MTP passes' last proposals lie inside the vocabulary."""
    path = tmp_path / "top256.json"
    save_draft_vocab(path, most_frequent(_corpus_counts(), 256), 8192, "demo.jsonl")
    ids = set(load_draft_vocab(path, 8192).tolist())
    requests = _requests(demo_prompts)
    plain = LLMEngine(EngineConfig(drafter="ar", dtype="bfloat16"))
    expected = {rid: output_tokens(ev) for rid, ev in run_requests(plain, requests).items()}
    for drafter in ("mtp", "tree"):
        engine = LLMEngine(EngineConfig(drafter=drafter, dtype="bfloat16", draft_vocab=path))
        got = {rid: output_tokens(ev) for rid, ev in run_requests(engine, requests).items()}
        assert [rid for rid in expected if got[rid] != expected[rid]] == [], drafter
        mtp = engine.runner.device_mtp  # type: ignore[attr-defined]
        assert mtp is not None
        assert set(mtp.spine.tolist()) | set(mtp.topk.flatten().tolist()) <= ids
        assert engine.metrics().spec.num_accepted_tokens > 0


def _corpus_counts() -> Counter[int]:
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    counts: Counter[int] = Counter()
    for text in corpus_texts(DEMO):
        counts.update(tokenizer.encode(text, add_special_tokens=False).ids)
    return counts


def test_a_decode_cycle_synchronises_only_once(demo_prompts: list[GenerationRequest]) -> None:
    """After the first cycle (the first proposal is read right after prefill), decode cycles make
    no synchronising call but the one explicit event wait (torch's sync debug mode would raise) and
    allocate no device memory (the captured cycle's buffers are its graph pool's)."""
    engine = LLMEngine(EngineConfig(drafter="tree"))
    greedy = demo_prompts[0]
    sampled = GenerationRequest(
        "s", greedy.prompt_token_ids, SamplingParams(0.8, top_k=20, top_p=0.95, repetition_penalty=1.1), 32, 7
    )
    for request in (GenerationRequest("g", greedy.prompt_token_ids, SamplingParams(0.0), 32), sampled):
        engine.add_request(request)
        first = engine.metrics().spans["target"].count
        while engine.metrics().spans["target"].count == first:  # prefill, then the first cycle
            engine.step()
        before, allocated = engine.metrics().device_syncs, torch.cuda.memory_allocated()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert engine.metrics().device_syncs == before + 3
        assert torch.cuda.memory_allocated() == allocated  # no device memory allocated per cycle
        while engine.has_unfinished():
            engine.step()


def test_random_weight_preset_builds_on_the_device_in_seconds() -> None:
    start = time.perf_counter()
    engine = LLMEngine(
        EngineConfig(
            random_weights="qwen3.5-27b",
            dtype="bfloat16",
            drafter="ar",
            max_model_len=2048,
            prefix_cache=False,
        )
    )
    built = time.perf_counter() - start
    params = engine.model.num_parameters()
    assert 27.0e9 < params < 27.6e9
    assert built < 180, f"{built:.0f} s to build and capture"
    engine.add_request(GenerationRequest("r", list(range(1, 33)), SamplingParams(0.0), 4, ignore_eos=True))
    tokens: list[int] = []
    while engine.has_unfinished():
        for event in engine.step():
            tokens += event.token_ids
            assert event.finish_reason != "error", event.error
    assert len(tokens) == 4 and all(0 <= t < engine.vocab_size for t in tokens)


def test_forced_acceptance_accepts_the_schedule_on_the_gpu(demo_prompts: list[GenerationRequest]) -> None:
    """The paper tree with a forced schedule: every cycle accepts min(count, spine drafts)."""
    engine = LLMEngine(EngineConfig(drafter="tree", forced_acceptance="5"))
    request = GenerationRequest(
        "f", demo_prompts[0].prompt_token_ids, SamplingParams(0.0), 60, ignore_eos=True
    )
    assert len(output_tokens(run_requests(engine, [request])["f"])) == 60
    spec = engine.metrics().spec
    assert spec.num_accepted_tokens == 5 * spec.num_drafts  # the spine holds 5 MTP drafts at least
