"""The device path (`kernels="triton"`: DeviceRunner, device MTP, device walk, DeviceTree) runs the
whole engine cycle on the CPU under TRITON_INTERPRET=1 and must give the reference engine's
outputs, on a tiny fp32 model (the interpreter costs ~0.1 s per kernel program, so shapes and
token counts stay small). The GPU runs of the same path are in test_device_path_gpu.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lumotree.drafting.draft_vocab import save_draft_vocab
from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.model import save_checkpoint
from lumotree.sampling import SamplingParams
from lumotree.tree import TreeDescriptor, build_tree
from lumotree.verify.device_ops import stacked_base
from lumotree.verify.device_tree import DeviceTree
from tests.engine.helpers import output_tokens, run_requests
from tests.model.conftest import perturbed_model, tiny_config

GEOMETRY = dict(mtp_depth=2, siblings=1, tail_len=2, rescue_lens=(3,))  # 10 rows at most
PROMPT = [3, 9, 4, 7, 3, 9, 4, 7, 3, 9]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = perturbed_model(tiny_config(vocab_size=256), seed=0)
    return save_checkpoint(model, tmp_path_factory.mktemp("tiny"), dtype=torch.float32)


def _engine(checkpoint: Path, kernels: str, drafter: str, **changes: object) -> LLMEngine:
    rows = None if kernels != "triton" or drafter != "tree" else 1 + 2 * 2 + 2 + 3  # no padding rows
    config = EngineConfig(
        model=checkpoint, drafter=drafter, kernels=kernels, device="cpu", prefix_cache=False,
        max_model_len=128, rows=rows, **GEOMETRY,
    )  # fmt: skip
    return LLMEngine(replace(config, **changes))


def _request(sampling: SamplingParams, max_tokens: int, seed: int | None = None) -> GenerationRequest:
    return GenerationRequest("r", PROMPT, sampling, max_tokens, seed=seed, ignore_eos=True)


def _prime_suffix_cache(engine: LLMEngine, continuation: list[int]) -> None:
    """Put `continuation` in the tree drafter's cache of earlier outputs, as a finished earlier
    request with this prompt would: its rescue branches and tail then propose it."""
    suffix = engine.drafter.suffix  # type: ignore[attr-defined]
    suffix.begin(PROMPT)
    suffix.extend(continuation)
    suffix.finish()


@pytest.mark.parametrize("drafter", ["ar", "mtp"])
def test_device_cycle_greedy_output_equals_the_reference_engine(checkpoint: Path, drafter: str) -> None:
    request = _request(SamplingParams(temperature=0.0), max_tokens=4)
    ref = output_tokens(run_requests(_engine(checkpoint, "reference", drafter), [request])["r"])
    engine = _engine(checkpoint, "triton", drafter)
    out = output_tokens(run_requests(engine, [request])["r"])
    assert out == ref
    # one synchronisation per decode cycle (the first token comes from the prefill)
    cycles = engine.metrics().spans["target"].count
    assert cycles >= 1 and engine.metrics().device_syncs == cycles


def test_metrics_read_mid_request_report_the_device_state_in_use(checkpoint: Path) -> None:
    """/metrics is scraped while a request runs: the KV usage comes from the device runner's state."""
    engine = _engine(checkpoint, "triton", "ar")
    engine.add_request(_request(SamplingParams(temperature=0.0), max_tokens=3))
    engine.step()  # the prefill
    assert engine.metrics().kv_cache_usage == pytest.approx(len(PROMPT) / engine.runner.capacity)
    while engine.has_unfinished():
        engine.step()
    assert engine.metrics().kv_cache_usage == 0.0


def test_device_tree_accepts_drafts_and_publishes_them_like_the_reference(checkpoint: Path) -> None:
    """Greedy, with the suffix cache primed by the reference output: the tree accepts drafts off
    the spine (rescue branches hang off the root), so publication must remap KV rows and replay
    multi-node paths; the output still equals the reference engine's token for token."""
    request = _request(SamplingParams(temperature=0.0), max_tokens=8)
    reference = _engine(checkpoint, "reference", "tree")
    ref = output_tokens(run_requests(reference, [request])["r"])
    engine = _engine(checkpoint, "triton", "tree")
    _prime_suffix_cache(engine, ref)
    out = output_tokens(run_requests(engine, [request])["r"])
    assert out == ref
    spec = engine.metrics().spec
    assert spec.num_accepted_tokens >= 3, spec  # multi-node paths were published
    assert engine.metrics().device_syncs == engine.metrics().spans["target"].count


def test_device_tree_seeded_sampling_equals_the_reference_engine(checkpoint: Path) -> None:
    """Seeded sampling with penalties: the device walk's coins and per-path histories are the
    host sampler's, so the tokens match the reference engine's."""
    sampling = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, repetition_penalty=1.2)
    request = _request(sampling, max_tokens=6, seed=1234)
    ref = output_tokens(run_requests(_engine(checkpoint, "reference", "tree"), [request])["r"])
    engine = _engine(checkpoint, "triton", "tree")
    _prime_suffix_cache(engine, ref)
    assert output_tokens(run_requests(engine, [request])["r"]) == ref
    assert engine.metrics().spec.num_accepted_tokens >= 1


def test_device_tree_holds_every_descriptor_table_after_one_load() -> None:
    tree = build_tree([5, 6, 7, 8, 9, 10], [-1, 0, 1, 0, 3, 1], prefix_len=17, rows=8, max_depth=4)
    tables = DeviceTree(8, 4, "cpu")
    tables._device.fill_(-7)  # poison: every table must be rewritten by load_
    tables.load_(tree)
    tables.cast_()
    assert torch.equal(tables.tokens, tree.tokens)
    assert torch.equal(tables.position, tree.position)
    assert torch.equal(tables.depth, tree.depth)
    assert torch.equal(tables.slot_map, tree.slot_map)
    assert torch.equal(tables.conv_gather, tree.conv_gather)
    assert torch.equal(tables.ancestry.bool(), tree.ancestry)
    assert torch.equal(tables.gdn.ancestry, tree.ancestry.to(torch.int32))
    cmax = tree.child_nodes.shape[1]
    assert torch.equal(tables.child_nodes[:, :cmax], tree.child_nodes)
    assert bool((tables.child_nodes[:, cmax:] == -1).all())
    assert torch.equal(tables.child_tokens[:, :cmax], tree.child_tokens)
    assert int(tables.n_active) == 6 and int(tables.prefix_len) == 17 and int(tables.gdn.n_active) == 6
    # bit j of row r: row r sees physical tree slot j (its ancestors and itself)
    for r in range(6):
        seen = {int(tree.slot_map[a]) for a in range(6) if tree.ancestry[r, a]}
        assert {j for j in range(8) if int(tables.bits[r]) >> j & 1} == seen


def test_replay_finds_the_stacked_state_bank(checkpoint: Path) -> None:
    engine = _engine(checkpoint, "reference", "ar")
    states = [s.recurrent for s in engine.runner.state.layers if hasattr(s, "recurrent")]
    assert stacked_base(states) is engine.runner.state.gdn_bank
    assert stacked_base([s.clone() for s in states]) is None
    assert stacked_base(states[::-1]) is None


def test_device_tree_applies_the_logit_bias_like_the_reference_engine(checkpoint: Path) -> None:
    bias = ((5, 6.0), (17, -100.0), (33, 3.5))
    request = _request(SamplingParams(0.8, top_k=20, logit_bias=bias), max_tokens=4, seed=99)
    ref = output_tokens(run_requests(_engine(checkpoint, "reference", "tree"), [request])["r"])
    unbiased = output_tokens(
        run_requests(
            _engine(checkpoint, "reference", "tree"),
            [replace(request, sampling=SamplingParams(0.8, top_k=20))],
        )["r"]
    )
    assert ref != unbiased  # the bias changes this request's tokens
    engine = _engine(checkpoint, "triton", "tree")
    _prime_suffix_cache(engine, ref)
    assert output_tokens(run_requests(engine, [request])["r"]) == ref


def test_device_mtp_drafts_from_the_draft_vocabulary_as_the_reference_drafter_does(
    checkpoint: Path, tmp_path: Path
) -> None:
    """With a draft vocabulary the device MTP passes rank its rows only: every proposal equals the
    reference drafter's (whole-vocabulary logits, -inf outside the subset), every draft is in the
    subset, and the output is the one without a draft vocabulary (verification scores every token)."""
    ids = list(range(1, 256, 3))
    path = tmp_path / "draft-vocab.json"
    save_draft_vocab(path, ids, 256, "every third id")
    request = _request(SamplingParams(temperature=0.0), max_tokens=5)
    plain = output_tokens(run_requests(_engine(checkpoint, "reference", "mtp"), [request])["r"])
    drafts: dict[str, list[list[int]]] = {}
    for kernels in ("reference", "triton"):
        engine = _engine(checkpoint, kernels, "mtp", draft_vocab=path, draft_head_dtype="float32")
        proposed: list[list[int]] = []
        propose = engine.drafter.propose

        def record(root: int, prefix_len: int, propose=propose, proposed=proposed) -> TreeDescriptor:
            tree = propose(root, prefix_len)
            proposed.append(tree.tokens[1 : tree.n_active].tolist())
            return tree

        engine.drafter.propose = record  # type: ignore[method-assign]
        assert output_tokens(run_requests(engine, [request])["r"]) == plain
        drafts[kernels] = proposed
    assert drafts["triton"] == drafts["reference"] and len(drafts["triton"]) >= 2
    assert {t for spine in drafts["triton"] for t in spine} <= set(ids)
