"""The paper tree drafted on the device (`DeviceTreeDrafter`, under TRITON_INTERPRET=1 here) equals
the host drafter's (`paper_topology` over `SuffixDrafter`) for the same request tokens, earlier
outputs and MTP proposal: random histories over small vocabularies (many repeated keys, so the
per-key limit, the match lengths, the ranking and the distinct-continuation rule all decide),
caches that evicted outputs, and geometries whose row budget or depth cuts the tree."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.drafting.device_tree_drafter import DeviceTreeDrafter, topology_from_feed
from lumotree.drafting.drafter import paper_topology
from lumotree.drafting.geometry import GeometryConfig
from lumotree.drafting.mtp import MTPProposal
from lumotree.drafting.suffix import SuffixDrafter, SuffixIndex

GEOMETRIES = {
    "paper": GeometryConfig(),
    "cut by rows": GeometryConfig(3, 2, 4, (5, 3), rows=12, max_depth=11),
    "cut by depth": GeometryConfig(2, 1, 3, (6,), rows=16, max_depth=5),
    "no rescues": GeometryConfig(2, 1, 2, (), rows=8, max_depth=6),
    "no tail": GeometryConfig(3, 1, 0, (2, 2, 1), rows=20, max_depth=6),
}


def _case(rng: random.Random, geo: GeometryConfig, vocab: int, per_key: int) -> tuple:
    suffix = SuffixDrafter(min_match=rng.choice([1, 2, 3]), max_match=rng.choice([4, 24]),
                           cache_tokens=rng.choice([0, 20, 200]), per_key=per_key)  # fmt: skip
    pattern = [rng.randrange(vocab) for _ in range(rng.randrange(3, 9))]
    edits = rng.choice([0.0, 0.1, 0.3])  # without edits, many occurrences continue alike

    def tokens(n: int) -> list[int]:  # a repeating pattern with random edits: keys recur
        return [rng.randrange(vocab) if rng.random() < edits else pattern[i % len(pattern)] for i in range(n)]

    for _ in range(rng.randrange(0, 5)):  # earlier requests: their outputs join the cache
        suffix.begin(tokens(rng.randrange(1, 12)))
        suffix.extend(tokens(rng.randrange(0, 30)))
        suffix.finish()
    prompt, output = tokens(rng.randrange(1, 50)), tokens(rng.randrange(1, 30))
    emitted = tokens(rng.randrange(1, min(geo.max_depth, 4) + 1))
    k = 1 + geo.siblings_per_depth
    spine = [rng.randrange(vocab) for _ in range(geo.depth_mtp)]
    topk = [[s, *rng.sample([t for t in range(vocab) if t != s], k - 1)] for s in spine]
    for row in topk:
        rng.shuffle(row)  # the spine token is not always first (a draft vocabulary's ties)
    return suffix, prompt, output, emitted, MTPProposal(spine, topk)


def _device_tree(
    suffix: SuffixDrafter, geo: GeometryConfig, prompt: list[int], output: list[int], emitted: list[int],
    proposal: MTPProposal,
) -> tuple:  # fmt: skip
    drafter = DeviceTreeDrafter(geo, suffix, geo.depth_mtp, len(proposal.topk[0]), 160, "cpu", block=16)
    drafter.load([*prompt, *output[:-1]], suffix)
    drafter.push(output[-1])
    feed = torch.full((2 * geo.rows + 1,), -7, dtype=torch.int64)  # poisoned: every entry is written
    width = geo.max_depth + 1
    emitted_t = torch.tensor(emitted + [-1] * (width - len(emitted)))
    drafter.draft_(
        emitted_t,
        torch.tensor([len(emitted)]),
        torch.tensor(proposal.spine),
        torch.tensor(proposal.topk),
        feed,
    )
    assert (feed != -7).all()
    hist = drafter.hist[: int(drafter.hist_len)].tolist()
    return topology_from_feed(feed.tolist(), geo.rows, int(drafter.merges)), hist


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_device_tree_equals_the_host_drafters_tree(name: str) -> None:
    geo = GEOMETRIES[name]
    rng = random.Random(name)
    shapes = set()
    for trial in range(6):
        suffix, prompt, output, emitted, proposal = _case(rng, geo, vocab=rng.choice([3, 5, 9]),
                                                          per_key=rng.choice([2, 3, 32]))  # fmt: skip
        suffix.begin(prompt)
        suffix.extend(output + emitted)
        want = paper_topology(suffix, geo, emitted[-1], proposal)
        got, hist = _device_tree(suffix, geo, prompt, output, emitted, proposal)
        assert hist == prompt + output + emitted
        assert got == want, (name, trial)
        shapes.add((want.n_active, max(want.depths)))
    assert len(shapes) > 1  # the cases made trees of different sizes


def test_device_tree_finds_the_tail_and_rescues_in_earlier_outputs_only() -> None:
    """A continuation that only the cache of earlier outputs holds reaches the device tree."""
    geo = GeometryConfig(2, 1, 3, (3,), rows=10, max_depth=6)
    suffix = SuffixDrafter(min_match=2, cache_tokens=100)
    suffix.begin([1])
    suffix.extend([40, 41, 42, 43, 44, 45])
    suffix.finish()
    prompt, output, emitted = [7, 8], [9], [40, 41]
    proposal = MTPProposal([42, 43], [[42, 50], [43, 51]])
    suffix.begin(prompt)
    suffix.extend(output + emitted)
    want = paper_topology(suffix, geo, 41, proposal)
    got, _ = _device_tree(suffix, geo, prompt, output, emitted, proposal)
    assert got == want and 44 in got.tokens and 45 in got.tokens  # the tail came from the cache


def test_a_continuation_that_repeats_a_better_ranked_one_is_not_placed_again() -> None:
    """In a periodic history most occurrences continue alike: the rescue branches take the distinct
    continuations only (placing a repeat would hang its cut-off rest below the first copy)."""
    geo = GeometryConfig(1, 0, 0, (2, 2, 1), rows=12, max_depth=6)
    suffix = SuffixDrafter(min_match=2, cache_tokens=0)
    prompt, output, emitted = [1, 2, 3] * 9, [1, 2], [3]
    proposal = MTPProposal([9], [[9]])
    suffix.begin(prompt)
    suffix.extend(output + emitted)
    want = paper_topology(suffix, geo, 3, proposal)
    conts = [m.continuation for m in suffix.continuations((), geo.max_depth, 6)]
    assert conts == [(1, 2, 3), (1, 2, 3, 1, 2, 3)]  # the later occurrences repeat the second
    got, _ = _device_tree(suffix, geo, prompt, output, emitted, proposal)
    assert got == want and want.n_active == 6  # root, the MTP draft, then 1 -> 2 -> 3 -> 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=8), st.integers(1, 4))
def test_removing_the_oldest_sequences_leaves_the_index_of_the_live_ones(
    seqs: list[list[int]], per_key: int
) -> None:
    """Occurrences are the latest `per_key` among the live sequences: after the oldest sequences
    are removed, every lookup equals that of an index built from the live ones alone."""
    index, fresh = SuffixIndex(2, per_key), SuffixIndex(2, per_key)
    ids = [index.add(s) for s in seqs]
    keep = len(seqs) // 2
    for sid in ids[:keep]:
        index.remove(sid)
    renamed = {fresh.add(s): sid for s, sid in zip(seqs[keep:], ids[keep:], strict=True)}
    for a in range(4):
        for b in range(4):
            got = index.matches([a, b], 6)
            want = [(n, renamed[sid], start) for n, sid, start in fresh.matches([a, b], 6)]
            assert got == want
