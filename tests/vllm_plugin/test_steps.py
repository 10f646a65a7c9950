"""How a vLLM step becomes LumoTree work: trees cut to what vLLM scheduled, the request's stop rule,
the sampling settings, the sampled-token tensor vLLM parses, and tree attention over the paged KV."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from lumotree.drafting.geometry import GeometryConfig, RescueBranch, build_paper_tree
from lumotree.verify.kernel_sets import TreeKernels
from lumotree.vllm.requests import (
    StopRule,
    UnsupportedRequest,
    core_sampling,
    drafting,
    unsupported_parameters,
)
from lumotree.vllm.sampler import PLACEHOLDER, StepSamples
from lumotree.vllm.settings import PluginSettings
from lumotree.vllm.steps import RequestStep, physical_prefix, physical_tokens, scheduled_tree
from lumotree.vllm.tree_attention import tree_attention_rows
from lumotree.vllm.worker import LumoTreeWorker

from .fake_vllm import attention_layer, plan
from .trees import tree_from_paths


def _paper_tree(prefix: int = 40):
    spine = [11, 12, 13, 14, 15]
    topk = [[t, t + 100, t + 200] for t in spine]
    rescues = [RescueBranch((), (50, 51, 52, 53)), RescueBranch((11,), (60, 61))]
    return build_paper_tree(
        7, spine, topk, [16, 17, 18, 19, 20, 21], rescues, prefix_len=prefix, config=GeometryConfig()
    )


@pytest.mark.parametrize("rows", [1, 2, 6, 12, 13, 20, 28])
def test_a_physical_prefix_of_a_tree_is_a_tree_with_the_same_rows(rows: int) -> None:
    tree = _paper_tree()
    assert tree.n_active == 28
    cut = physical_prefix(tree, rows)
    assert cut.n_active == rows == cut.rows  # no padding
    assert physical_tokens(cut) == physical_tokens(tree)[:rows]  # vLLM's flat tokens, unchanged
    for node in range(rows):  # every kept node keeps its whole root path, tokens and depth
        assert [int(cut.tokens[i]) for i in cut.path_to(node)] == [
            int(tree.tokens[i]) for i in tree.path_to(_same_node(tree, cut, node))
        ]


def _same_node(tree, cut, node: int) -> int:
    slot = int(cut.slot_map[node])
    return int((tree.slot_map == slot).nonzero())


def test_the_scheduled_tree_is_the_proposal_or_else_the_scheduled_chain() -> None:
    tree = _paper_tree(prefix=40)
    tokens = physical_tokens(tree)
    same = scheduled_tree(tokens[0], tokens[1:16], tree, prefix_len=40)  # the 12-row spine + 4 branches
    assert physical_tokens(same) == tokens[:16] and same.n_active == 16
    assert same.parent.tolist() != [-1, *range(15)]  # a tree, not a chain
    # zero-filled drafts (vLLM near the context limit) or a stale proposal: verified as a chain
    for drafts, pending, prefix in ([0, 0, 0], tree, 40), (tokens[1:4], tree, 41), (tokens[1:4], None, 40):
        chain = scheduled_tree(tokens[0], drafts, pending, prefix_len=prefix)
        assert physical_tokens(chain) == [tokens[0], *drafts]
        assert chain.parent.tolist() == [-1, *range(len(drafts))]


def test_the_stop_rule_keeps_what_vllm_keeps() -> None:
    rule = StopRule(eos=2, stop_ids=frozenset({9}), max_tokens=6, max_model_len=30)
    assert rule.kept([5, 6, 7], prompt_len=10, output_len=0) == ([5, 6, 7], False)
    assert rule.kept([5, 2, 7], prompt_len=10, output_len=0) == ([5, 2], True)  # EOS ends it
    assert rule.kept([5, 9, 7], prompt_len=10, output_len=0) == ([5, 9], True)  # a stop id
    assert rule.kept([5, 6, 7], prompt_len=10, output_len=4) == ([5, 6], True)  # max_tokens
    assert rule.kept([5, 6, 7], prompt_len=27, output_len=1) == ([5, 6], True)  # context limit
    assert StopRule(None, frozenset(), 6, 30).kept([2, 2], 10, 0) == ([2, 2], False)  # ignore_eos


def _params(**kw):
    base = dict(temperature=0.6, top_k=20, top_p=0.95, min_p=0.05, presence_penalty=1.0,
                frequency_penalty=0.0, repetition_penalty=1.0, seed=1, logit_bias=None,
                allowed_token_ids=None, bad_words=None, min_tokens=0, structured_outputs=None,
                logprobs=None, logprob_token_ids=None)  # fmt: skip
    return SimpleNamespace(**(base | kw))


def test_sampling_settings_map_to_the_cores_and_unsupported_ones_are_named() -> None:
    core = core_sampling(_params())
    assert (core.temperature, core.top_k, core.top_p, core.min_p, core.presence_penalty) == (
        0.6,
        20,
        0.95,
        0.05,
        1.0,
    )
    greedy = core_sampling(_params(temperature=1e-6, top_k=-1))
    assert greedy.greedy and greedy.top_k == 0 and greedy.top_p == 1.0
    assert core_sampling(_params(logit_bias={9: -2.0, 3: 1.0})).logit_bias == ((3, 1.0), (9, -2.0))
    asked = _params(logit_bias={3: 1.0}, allowed_token_ids=[3], bad_words=["x"], logprobs=2, min_tokens=4)
    assert unsupported_parameters(asked) == ["min_tokens"]
    with pytest.raises(UnsupportedRequest, match="logprob_token_ids"):
        core_sampling(_params(logprob_token_ids=[1, 2]))


def test_sampled_tokens_are_padded_so_vllm_drops_the_padding() -> None:
    samples = StepSamples(tokens=[[5], [], [1, 2, 3]])
    out = samples.as_tensor()
    assert out.shape == (3, 3) and out.dtype == torch.int32
    assert out.tolist() == [[5, PLACEHOLDER, PLACEHOLDER], [PLACEHOLDER] * 3, [1, 2, 3]]
    assert StepSamples(tokens=[[4], [5]]).as_tensor().shape == (2, 2)  # always parsed as speculative


def test_drafts_switch_takes_0_1_true_false_and_names_anything_else() -> None:
    assert drafting(_params()) and drafting(_params(extra_args={"lumotree_drafts": "True"}))
    assert not drafting(_params(extra_args={"lumotree_drafts": 0}))
    with pytest.raises(UnsupportedRequest, match="lumotree_drafts must be"):
        drafting(_params(extra_args={"lumotree_drafts": "maybe"}))


def test_tree_rows_attend_to_the_prefix_their_ancestors_and_themselves(tree_kernels: TreeKernels) -> None:
    heads, kv_heads, dim, block_size, prefix = 4, 2, 64, 16, 19
    attn = attention_layer(blocks=4, heads=kv_heads, block_size=block_size, dim=dim)
    tree = tree_from_paths(3, [[1, 2, 3], [1, 4], [5]], prefix_len=prefix)
    n = tree.rows
    req = RequestStep("r", 0, 2, n, [0] * n, prefix, prefix, tree=tree)
    req.rows = 2 + tree.slot_map
    step = plan([req], [[[2, 0, 3]]], [block_size])
    gen = torch.Generator().manual_seed(0)
    prefix_k, prefix_v = (
        torch.randn(prefix, kv_heads, dim, generator=gen),
        torch.randn(prefix, kv_heads, dim, generator=gen),
    )
    attn.impl.do_kv_cache_update(
        attn, prefix_k, prefix_v, attn.kv_cache, step.kv_slots(req, 0, torch.arange(prefix))
    )
    flat = 2 + n
    query = torch.randn(flat, heads, dim, generator=gen)
    key, value = (
        torch.randn(flat, kv_heads, dim, generator=gen),
        torch.randn(flat, kv_heads, dim, generator=gen),
    )
    output = torch.zeros(flat, heads, dim)
    tree_attention_rows(step, 0, tree_kernels, query, key, value, attn.kv_cache, output, attn.isa)
    for node in range(n):  # dense reference: softmax over the prefix and the node's own path
        seen = req.rows[torch.as_tensor(tree.path_to(node))]
        ks, vs = torch.cat([prefix_k, key[seen]]), torch.cat([prefix_v, value[seen]])
        q = query[req.rows[node]]
        for h in range(heads):
            w = torch.softmax(ks[:, h // 2] @ q[h] / math.sqrt(dim), dim=0)
            torch.testing.assert_close(output[req.rows[node], h], w @ vs[:, h // 2], rtol=1e-5, atol=1e-5)
    assert torch.equal(output[:2], torch.zeros(2, heads, dim))  # other requests' rows untouched


def test_random_trees_cut_anywhere_stay_closed_under_parents() -> None:
    rnd = random.Random(5)
    for _ in range(30):
        paths = [
            [rnd.randrange(1, 6) for _ in range(rnd.randrange(1, 6))] for _ in range(rnd.randrange(1, 6))
        ]
        tree = tree_from_paths(0, paths, prefix_len=3)
        rows = rnd.randrange(1, tree.n_active + 1)
        cut = physical_prefix(tree, rows)
        assert physical_tokens(cut) == physical_tokens(tree)[:rows]


def test_vllms_attention_is_skipped_only_in_a_step_of_trees_only() -> None:
    worker = LumoTreeWorker(PluginSettings())
    assert not worker.recomputes_every_row()  # no step
    tree = _paper_tree(prefix=40)
    trees = [RequestStep(f"r{i}", i, 28 * i, 28, physical_tokens(tree), 40, 30, tree=tree) for i in range(2)]
    chunk = RequestStep("c", 2, 56, 5, [1, 2, 3, 4, 5], 0, 5)
    worker.plan = plan(trees, [[[1], [2]]], [16])
    assert worker.recomputes_every_row()
    worker.plan = plan([*trees, chunk], [[[1], [2], [3]]], [16])
    assert not worker.recomputes_every_row()  # the chunk's rows are vLLM's causal attention
    worker.plan = plan([], [[]], [16])
    assert not worker.recomputes_every_row()
