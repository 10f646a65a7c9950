"""The device path (`kernels="triton"`: DeviceRunner, device MTP, device walk, DeviceTree) runs the
whole engine cycle on the CPU under TRITON_INTERPRET=1 and must give the reference engine's
outputs, on a tiny fp32 model (the interpreter costs ~0.1 s per kernel program, so shapes and
token counts stay small). The GPU runs of the same path are in test_device_path_gpu.py.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lumobench.checks.random_trees import random_tree
from lumotree.drafting.draft_vocab import save_draft_vocab
from lumotree.drafting.mtp import MTPProposal
from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.model import save_checkpoint
from lumotree.model.tree_mode import GdnRecord, TreeForward, publish_path_, tree_forward
from lumotree.sampling import SamplingParams
from lumotree.tree import MAX_DEPTH, TreeTopology
from lumotree.verify import device_ops
from lumotree.verify.device_ops import stacked_view
from lumotree.verify.device_tree import DeviceTree
from lumotree.verify.kernel_sets import triton_kernels
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


@pytest.mark.parametrize(("drafter", "replays"), [("ar", False), ("mtp", True)])
def test_an_ar_step_advances_its_gdn_states_as_it_verifies(
    checkpoint: Path, drafter: str, replays: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The AR arm's root is always accepted: its row scans advance the GDN states in place and
    publication replays nothing (its outputs still the reference engine's: the test above); MTP's
    chain publishes by the replay."""
    calls: list[int] = []
    original = device_ops.replay

    def counted(*args: object) -> None:
        calls.append(1)
        original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(device_ops, "replay", counted)
    engine = _engine(checkpoint, "triton", drafter)
    run_requests(engine, [_request(SamplingParams(temperature=0.0), max_tokens=4)])
    assert engine.metrics().spans["target"].count >= 2
    assert bool(calls) == replays


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


def test_replay_finds_the_stacked_state_bank(checkpoint: Path) -> None:
    engine = _engine(checkpoint, "reference", "ar")
    states = [s.recurrent for s in engine.runner.state.layers if hasattr(s, "recurrent")]
    bank = engine.runner.state.gdn_bank
    view = stacked_view(states)
    assert view is not None and view.shape == bank.shape and view.data_ptr() == bank.data_ptr()
    assert stacked_view([s.clone() for s in states]) is None
    assert stacked_view(states[::-1]) is None


def test_the_device_forward_keeps_the_gdn_records_in_banks_that_publish_in_place() -> None:
    """The Triton set's forward writes every GDN layer's conv inputs and operands into slices of
    stacked banks (publication then reads them without stacking), and publishing from the banks
    gives the bits of publishing from per-layer copies of the same records."""
    model = perturbed_model(tiny_config(vocab_size=64), seed=2)
    kernels = triton_kernels()
    tree = random_tree("deep_and_wide", random.Random(4), prefix_len=6, rows=16)
    with torch.inference_mode():
        start = model.new_state(32)
        model.prefill(torch.tensor(PROMPT[:6]), start)
        tables = DeviceTree(tree.rows, MAX_DEPTH, "cpu").load_(tree)
        forward = tree_forward(model, start, tables, kernels)
        records = forward.gdn
        assert len(records) >= 2
        assert stacked_view([r.x for r in records]) is not None
        for field in ("q", "k", "v", "g", "beta"):
            assert stacked_view([getattr(r.operands, field) for r in records]) is not None, field
        copies = TreeForward(
            forward.tree,
            forward.hidden,
            [GdnRecord(r.x.clone(), r.operands.map(torch.clone)) for r in records],
        )
        assert stacked_view([r.x for r in copies.gdn]) is None
        node = max(range(tree.n_active), key=lambda n: len(tree.path_to(n)))
        path = tree.path_to(node)
        accepted = tree.padded_path(path)
        banked, copied = model.new_state(32), model.new_state(32)
        for state in (banked, copied):
            model.prefill(torch.tensor(PROMPT[:6]), state)
        publish_path_(banked, forward, accepted, len(path), kernels)
        publish_path_(copied, copies, accepted, len(path), kernels)
    for a, b in zip(banked.layers, copied.layers, strict=True):
        for name in ("recurrent", "conv", "key", "value"):
            if hasattr(a, name):
                assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_device_tree_applies_the_logit_bias_like_the_reference_engine(
    checkpoint: Path, penalty: float
) -> None:
    """The bias alone, and the bias under a repetition penalty (both must reach the walk)."""
    bias = ((5, 6.0), (17, -100.0), (33, 3.5))
    params = SamplingParams(0.8, top_k=20, logit_bias=bias, repetition_penalty=penalty)
    request = _request(params, max_tokens=4, seed=99)
    ref = output_tokens(run_requests(_engine(checkpoint, "reference", "tree"), [request])["r"])
    unbiased = output_tokens(
        run_requests(
            _engine(checkpoint, "reference", "tree"),
            [replace(request, sampling=replace(params, logit_bias=()))],
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
        topology = engine.drafter.topology

        def record(
            root: int, proposal: MTPProposal | None, topology=topology, proposed=proposed
        ) -> TreeTopology:
            tree = topology(root, proposal)
            proposed.append(list(tree.tokens[1:]))
            return tree

        engine.drafter.topology = record  # type: ignore[method-assign]
        assert output_tokens(run_requests(engine, [request])["r"]) == plain
        drafts[kernels] = proposed
    assert drafts["triton"] == drafts["reference"] and len(drafts["triton"]) >= 2
    assert {t for spine in drafts["triton"] for t in spine} <= set(ids)


def test_chained_cycles_launched_ahead_survive_requests_that_end_early(checkpoint: Path) -> None:
    """AR and chain MTP launch the next cycle before reading this one's results. A request that
    ends on a stop token leaves such a cycle in flight: it is dropped, and the next requests on the
    same engine still give the reference engine's tokens."""
    greedy = SamplingParams(temperature=0.0)
    probe = GenerationRequest("a", PROMPT, greedy, 10, ignore_eos=True)
    stop = output_tokens(run_requests(_engine(checkpoint, "reference", "ar"), [probe])["a"])[3]
    requests = [
        replace(probe, stop_token_ids=(stop,)),
        GenerationRequest("b", PROMPT[::-1], SamplingParams(0.7, top_k=10), 5, seed=3, ignore_eos=True),
        GenerationRequest("c", PROMPT[2:], greedy, 2, ignore_eos=True),
    ]
    for drafter in ("ar", "mtp"):
        ref = run_requests(_engine(checkpoint, "reference", drafter), requests)
        engine = _engine(checkpoint, "triton", drafter)
        launched = 0
        launch = engine.runner._launch  # type: ignore[attr-defined]

        def counting(topology: object, launch=launch) -> object:
            nonlocal launched
            launched += 1
            return launch(topology)

        engine.runner._launch = counting  # type: ignore[attr-defined]
        got = run_requests(engine, requests)
        assert {r: output_tokens(e) for r, e in got.items()} == {r: output_tokens(e) for r, e in ref.items()}
        assert output_tokens(got["a"])[-1] == stop
        cycles = engine.metrics().spans["cycle"].count
        assert engine.metrics().device_syncs == cycles
        assert launched == cycles + 1, drafter  # request a's cycle in flight at its stop was dropped


def test_forced_acceptance_on_the_device_equals_the_host_forced_cycle(checkpoint: Path) -> None:
    """A forced schedule accepts exactly its counts of spine drafts on both paths, with the same
    tokens (drafts, then the last accepted row's own choice)."""
    request = _request(SamplingParams(temperature=0.0), max_tokens=8)
    results = {}
    for kernels in ("reference", "triton"):
        engine = _engine(checkpoint, kernels, "tree", forced_acceptance="0,2,5")
        tokens = output_tokens(run_requests(engine, [request])["r"])
        spec = engine.metrics().spec
        results[kernels] = (tokens, spec.num_accepted_tokens, spec.num_drafts)
    assert results["triton"] == results["reference"]
    _, accepted, events = results["triton"]
    schedule = [(0, 2, 5)[i % 3] for i in range(events)]
    # the spine holds the 2 MTP drafts at least (and the suffix tail when there is one)
    assert events >= 3 and sum(min(c, 2) for c in schedule) <= accepted <= sum(schedule)


@pytest.mark.parametrize("drafting", ["device", "host"])
def test_the_next_tree_is_started_before_the_results_are_emitted(checkpoint: Path, drafting: str) -> None:
    """The tree's next cycle starts before the step returns its event: drafted on the device it is
    launched with this cycle, before its results are read; drafted on the host, as soon as they are
    in (`follow`)."""
    request = _request(SamplingParams(temperature=0.0), max_tokens=5)
    engine = _engine(checkpoint, "triton", "tree", tree_drafting=drafting)
    engine.add_request(request)
    started = 0
    while engine.has_unfinished():
        events = engine.step()
        ahead = engine.runner._ahead  # type: ignore[attr-defined]
        if events and not events[-1].finished and engine.metrics().spans["cycle"].count:
            assert ahead is not None and ahead.tokens == engine._next_tree.tokens  # type: ignore[union-attr]
            started += 1
    assert started >= 2 and engine.runner._ahead is None  # type: ignore[attr-defined]


def test_trees_drafted_on_the_device_are_the_host_drafters_trees(checkpoint: Path) -> None:
    """Two requests, the second after the first's output joined the suffix cache (primed with part
    of the first's output beforehand, so the lookups find continuations): the device tree
    drafter verifies the same trees as the host drafter, cycle by cycle, and the host drafts only
    each request's first tree."""
    first = _request(SamplingParams(temperature=0.0), max_tokens=6)
    second = replace(first, request_id="s", prompt_token_ids=[*PROMPT[3:], 3, 9], max_tokens=5)
    ref = output_tokens(run_requests(_engine(checkpoint, "reference", "tree"), [first])["r"])
    trees: dict[str, list[TreeTopology]] = {}
    outputs = {}
    for drafting in ("device", "host"):
        engine = _engine(checkpoint, "triton", "tree", tree_drafting=drafting)
        _prime_suffix_cache(engine, ref[:5])  # an earlier output: the suffix lookups find it
        verified: list[TreeTopology] = []
        cycle, topology = engine.runner.cycle, engine.drafter.topology
        host_drafted = 0

        def record(tree: TreeTopology, *args: object, cycle=cycle, verified=verified, **kw: object) -> object:
            verified.append(tree)
            return cycle(tree, *args, **kw)

        def count(*args: object, topology=topology) -> TreeTopology:
            nonlocal host_drafted
            host_drafted += 1
            return topology(*args)

        engine.runner.cycle = record  # type: ignore[method-assign]
        engine.drafter.topology = count  # type: ignore[method-assign]
        got = run_requests(engine, [first])
        got |= run_requests(engine, [second])
        outputs[drafting] = {r: output_tokens(e) for r, e in got.items()}
        trees[drafting] = verified
        assert host_drafted == (2 if drafting == "device" else len(verified)), drafting
        drafter = engine.metrics().spans["drafter"]  # a span a cycle: its mean is per cycle
        assert drafter.count == len(verified), (drafting, drafter.count)
    assert outputs["device"] == outputs["host"]
    assert trees["device"] == trees["host"] and len(trees["device"]) >= 4
    assert any(len(t.tokens) > 1 + 2 * 2 for t in trees["device"])  # suffix branches in the trees
