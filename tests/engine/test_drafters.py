"""Drafters: the suffix index and drafter (matching, ranking, bounded global cache), the MTP drafter
(proposals from the MTP head, cache rollback), and the tree drafter's paper geometry."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.drafting.draft_vocab import draft_head
from lumotree.drafting.drafter import paper_topology
from lumotree.drafting.geometry import GeometryConfig, RescueBranch, build_paper_tree
from lumotree.drafting.mtp import MTPDrafter, MTPProposal
from lumotree.drafting.selection import argmax_lowest_index, ordered_topk
from lumotree.drafting.suffix import SuffixDrafter, SuffixIndex
from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.model import HybridLM
from lumotree.sampling import SamplingParams
from lumotree.tree import TreeTopology

from .helpers import run_requests


def test_suffix_index_ranks_occurrences_latest_first_with_full_match_length() -> None:
    index = SuffixIndex(key_len=2)
    a = index.add([1, 2, 3, 4, 9, 2, 3, 5])
    b = index.add([7, 1, 2, 3, 6])
    found = index.matches([8, 1, 2, 3], max_match=10)
    assert found == [(3, b, 4), (2, a, 7), (3, a, 3)]  # latest first; (match length, sequence, start)
    assert index.matches([0, 4], max_match=10) == []  # no continuation indexed for (0, 4)
    index.remove(b)
    assert [m[1] for m in index.matches([1, 2, 3], max_match=10)] == [a, a]


def test_suffix_drafter_prefers_longer_matches_then_this_request_then_recency() -> None:
    drafter = SuffixDrafter(min_match=2, cache_tokens=100)
    drafter.begin([5, 6, 7, 8])
    drafter.extend([11, 12, 13])
    drafter.finish()  # the output [11, 12, 13] joins the global cache
    drafter.begin([20, 11, 12, 40, 41, 5, 11, 12])
    conts = [m.continuation for m in drafter.continuations((), length=2, limit=5)]
    assert conts == [(40, 41), (13,)]  # this request's occurrence of (11, 12) first
    assert drafter.continuations((99,), length=2, limit=5) == []
    longer = drafter.continuations((), length=1, limit=1)[0]
    assert longer.match_len == 2


def test_suffix_global_cache_evicts_the_oldest_outputs_beyond_its_budget() -> None:
    drafter = SuffixDrafter(min_match=2, cache_tokens=8)
    for output in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        drafter.begin([0])
        drafter.extend(output)
        drafter.finish()
    drafter.begin([0, 1, 2])
    assert drafter.continuations((), 2, 3) == []  # [1, 2, 3, 4] was evicted
    drafter.begin([0, 9, 10])
    assert [m.continuation for m in drafter.continuations((), 2, 3)] == [(11, 12)]


def test_mtp_drafter_proposes_the_mtp_heads_chain_and_rolls_its_cache_back(model: HybridLM) -> None:
    ids = torch.randint(9, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        hidden = model(ids)[0]
        drafter = MTPDrafter(model, depth=3, topk=3, capacity=128)
        drafter.commit(hidden[:30], ids[0, 1:31].tolist())
        proposal = drafter.propose(hidden[30:39], ids[0, 31:40].tolist())
        full = model.compute_logits(model.mtp_forward(hidden[None, :39], ids[:, 1:40]))[0, -1]
        # depth 2 by hand: the MTP row of depth 1's output hidden and its spine token, at position 39
        first_hidden = model.mtp_forward(hidden[None, :39], ids[:, 1:40])[0, -1:]
        state = model.new_mtp_state(128)
        model.mtp_step(hidden[:39], ids[0, 1:40], state)
        clean = state.layers[0].key[:39].clone()
        depth2, _ = model.mtp_step(first_hidden, torch.tensor([proposal.spine[0]]), state, step_idx=1)
    assert drafter.committed == 39  # the queued true rows were committed, the chain rolled back
    torch.testing.assert_close(drafter.state.layers[0].key[:39], clean, atol=1e-5, rtol=1e-5)
    assert proposal.spine[0] == int(argmax_lowest_index(full))
    assert proposal.topk[0] == ordered_topk(full, 3).tolist()
    assert proposal.spine[1] == int(argmax_lowest_index(depth2[-1]))
    assert all(row[0] == s for row, s in zip(proposal.topk, proposal.spine, strict=True))


def test_tree_drafter_hangs_rescue_branches_where_a_continuation_leaves_the_tree() -> None:
    geometry = GeometryConfig(rows=28)
    suffix = SuffixDrafter(min_match=2)
    suffix.begin([1, 2, 50, 51, 60, 61, 62, 63, 1, 2, 50, 70, 71, 72, 73, 74, 1, 2])
    spine, topk = [50, 51, 52, 53, 54], [[50, 55, 56], [51, 57, 58], [52, 0, 3], [53, 4, 5], [54, 6, 7]]
    tree = paper_topology(suffix, geometry, 9, MTPProposal(spine, topk))
    # continuations of (1, 2): [50, 70, 71, ...] leaves after 50; [50, 51, 60, ...] leaves after 51
    rescues = [RescueBranch((50,), (70, 71, 72, 73)), RescueBranch((50, 51), (60, 61))]
    want = build_paper_tree(9, spine, topk, (), rescues, prefix_len=0, config=geometry).topology()
    assert _token_paths(tree) == _token_paths(want) and tree.n_active == want.n_active
    assert {(50, 70, 71, 72, 73), (50, 51, 60, 61)} <= _token_paths(tree)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_tree_drafter_builds_the_paper_tree_of_its_proposals(data: st.DataObject) -> None:
    """Against `build_paper_tree` with the rescue branches placed by a plain reference (where each
    continuation leaves the tree built so far): the same root-to-node token paths, under every row
    budget, with histories that repeat (so tails and rescues exist)."""
    vocab = data.draw(st.integers(4, 12))
    history = data.draw(st.lists(st.integers(0, vocab - 1), min_size=2, max_size=60))
    spine = data.draw(st.lists(st.integers(0, vocab - 1), min_size=5, max_size=5))
    topk = [
        [s, *data.draw(st.lists(st.integers(0, vocab - 1), min_size=2, max_size=2, unique=True))]
        for s in spine
    ]
    geometry = GeometryConfig(rows=data.draw(st.integers(3, 32)))
    suffix = SuffixDrafter(min_match=2)
    suffix.begin(history)
    got = paper_topology(suffix, geometry, 0, MTPProposal(spine, topk))
    tails = suffix.continuations(spine, geometry.tail_len, 1)
    tail = tails[0].continuation if tails else ()
    mirror = build_paper_tree(0, spine, topk, tail, [], prefix_len=0, config=geometry).topology()
    rescues: list[RescueBranch] = []
    for match in suffix.continuations((), geometry.max_depth, 2 * len(geometry.rescue_lens)):
        paths = _token_paths(mirror)
        cont = match.continuation
        at = next((i for i in range(len(cont), -1, -1) if tuple(cont[:i]) in paths | {()}), 0)
        branch = tuple(cont[at : at + geometry.rescue_lens[len(rescues)]])
        if not branch:
            continue
        rescues.append(RescueBranch(tuple(cont[:at]), branch))
        mirror = build_paper_tree(0, spine, topk, tail, rescues, prefix_len=0, config=geometry).topology()
        if len(rescues) == len(geometry.rescue_lens):
            break
    assert _token_paths(got) == _token_paths(mirror)


def _token_paths(tree: TreeTopology) -> set[tuple[int, ...]]:
    """Every node's tokens from below the root to itself (a tree whatever its node order)."""
    paths: set[tuple[int, ...]] = set()
    for node in range(1, tree.n_active):
        path = []
        while node > 0:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        paths.add(tuple(reversed(path)))
    return paths


def test_tree_cycles_use_the_paper_geometry(demo_prompts: list[GenerationRequest]) -> None:
    engine = LLMEngine(EngineConfig(drafter="tree", max_model_len=8192, tree_shape="paper"))
    trees = []
    real_topology = engine.drafter.topology

    def record(root: int, proposal: MTPProposal | None) -> TreeTopology:
        tree = real_topology(root, proposal)
        trees.append(tree.descriptor(prefix_len=0, rows=engine.geometry.rows))
        return tree

    engine.drafter.topology = record
    prompt = next(p for p in demo_prompts if p.request_id == "wal-t04")
    run_requests(engine, [GenerationRequest("g", prompt.prompt_token_ids, SamplingParams(0.0), 48)])
    assert trees and all(t.rows == 28 and t.n_active <= 28 and t.max_depth == 11 for t in trees)
    assert all(len(t.spine) >= 6 for t in trees)  # root + 5 MTP spine drafts at least
    assert max(int(t.depth.max()) for t in trees) > 5  # the suffix tail deepened some spines
    assert max(t.n_active for t in trees) >= 22  # 15 MTP candidates + tail + rescues


def test_bf16_draft_head_keeps_the_mtp_heads_choices(model: HybridLM) -> None:
    """Drafting with a bfloat16 copy of the vocabulary projection: logits within bf16 rounding,
    and nearly always the same spine token (verification, in fp32, decides what is emitted)."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(400, model.config.hidden_size, generator=g)
    head = draft_head(model.lm_head.weight, "bfloat16", None)
    assert head is not None and draft_head(model.lm_head.weight, "float32", None) is None
    with torch.inference_mode():
        exact = model.compute_logits(hidden)
        approx = torch.stack([head(h) for h in hidden])
    assert approx.dtype == torch.float32
    scale = exact.abs().amax(dim=-1, keepdim=True)
    assert float(((approx - exact).abs() / scale).max()) < 2**-6
    agree = (approx.argmax(-1) == exact.argmax(-1)).float().mean()
    assert agree > 0.95
