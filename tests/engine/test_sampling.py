"""Sampled decoding: a fixed seed reproduces exactly, and the tree's sampled tokens follow the
autoregressive distribution (chi-square over many seeds).

Coins are keyed by (seed, output position, token), never by the tree: the token at output index i
is drawn with the same coins whatever the drafter proposed. So a seeded request repeats exactly on a
warm engine (whose suffix cache and prefix cache changed the trees), and AR, chain MTP and the tree
give the same tokens wherever their target rows agree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from scipy.stats import chi2_contingency

from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.sampling import SamplingParams

from .helpers import output_tokens, run_requests

SAMPLES = 160
POSITION = 2  # the third token: the first one a tree row below the root can produce


def _sampled_requests(prompts: list[GenerationRequest]) -> list[GenerationRequest]:
    """The corpus requests with their seeds, sampled (the greedy ones at temperature 0.8)."""
    hot = SamplingParams(0.8, top_k=30)
    return [replace(p, sampling=hot if p.sampling.greedy else p.sampling, max_tokens=24) for p in prompts]


def test_fixed_seed_sampling_reproduces_across_runs(
    demo_prompts: list[GenerationRequest],
) -> None:
    prompts = demo_prompts[::3]
    requests = _sampled_requests(prompts)
    engine = LLMEngine(EngineConfig(drafter="tree", max_model_len=8192))
    first = run_requests(engine, requests)
    fresh = run_requests(LLMEngine(EngineConfig(drafter="tree", max_model_len=8192)), requests)
    # the same engine again: its suffix cache now holds the first outputs, so the trees differ
    warm = run_requests(engine, [replace(r, request_id=r.request_id + "-again") for r in requests])
    tokens = {k: output_tokens(v) for k, v in first.items()}
    assert tokens == {k: output_tokens(v) for k, v in fresh.items()}
    assert tokens == {k.removesuffix("-again"): output_tokens(v) for k, v in warm.items()}
    assert all(len(t) >= 2 for t in tokens.values())
    assert len({tuple(t) for t in tokens.values()}) == len(requests)


def test_seeded_sampling_gives_the_same_tokens_under_every_drafter(
    demo_prompts: list[GenerationRequest],
) -> None:
    requests = _sampled_requests(demo_prompts[::2])
    outputs = {
        kind: {
            k: output_tokens(v)
            for k, v in run_requests(
                LLMEngine(EngineConfig(drafter=kind, max_model_len=8192)), requests
            ).items()
        }
        for kind in ("ar", "mtp", "tree")
    }
    assert outputs["mtp"] == outputs["ar"]
    assert outputs["tree"] == outputs["ar"]


def test_seedless_requests_report_the_seed_that_reproduces_them(
    demo_prompts: list[GenerationRequest],
) -> None:
    prompt = demo_prompts[-1]
    engine = LLMEngine(EngineConfig(drafter="tree", max_model_len=8192))
    params = SamplingParams(1.0, top_k=50)
    events = run_requests(engine, [GenerationRequest("a", prompt.prompt_token_ids, params, 16)])["a"]
    seed = events[-1].seed
    assert seed is not None and all(e.seed == seed for e in events)
    fresh = LLMEngine(EngineConfig(drafter="tree", max_model_len=8192))  # same drafter state as the first run
    again = run_requests(fresh, [GenerationRequest("b", prompt.prompt_token_ids, params, 16, seed=seed)])["b"]
    assert output_tokens(again) == output_tokens(events)


def _token_counts(kind: str, prompt: list[int], params: SamplingParams, seeds: range) -> Counter[int]:
    engine = LLMEngine(EngineConfig(drafter=kind, max_model_len=2048))
    requests = [GenerationRequest(f"s{s}", prompt, params, POSITION + 1, seed=s) for s in seeds]
    outputs = [output_tokens(ev) for ev in run_requests(engine, requests).values()]
    return Counter(out[POSITION] for out in outputs if len(out) > POSITION)


def _homogeneity_p(a: Counter[int], b: Counter[int]) -> float:
    """Chi-square test that two samples share one categorical distribution (rare tokens pooled)."""
    common = [t for t in a.keys() | b.keys() if a[t] + b[t] >= 10]
    table = [[a[t] for t in common] + [sum(a.values()) - sum(a[t] for t in common)]]
    table.append([b[t] for t in common] + [sum(b.values()) - sum(b[t] for t in common)])
    if table[0][-1] + table[1][-1] == 0:
        table = [row[:-1] for row in table]
    return float(chi2_contingency(table).pvalue)


def test_tree_sampled_tokens_follow_the_autoregressive_distribution(
    demo_prompts: list[GenerationRequest],
) -> None:
    prompt = next(p for p in demo_prompts if p.request_id == "chat-short").prompt_token_ids
    params = SamplingParams(1.0, top_k=6)
    # disjoint seeds: independent samples of each engine's distribution
    tree = _token_counts("tree", prompt, params, range(SAMPLES))
    ar = _token_counts("ar", prompt, params, range(SAMPLES, 2 * SAMPLES))
    assert len(tree) >= 3 and sum(tree.values()) == sum(ar.values()) == SAMPLES
    assert _homogeneity_p(tree, ar) > 1e-3
    # the test can fail: a colder autoregressive sampler is a different distribution
    colder = _token_counts("ar", prompt, SamplingParams(0.5, top_k=6), range(SAMPLES, 2 * SAMPLES))
    assert _homogeneity_p(tree, colder) < 1e-3


def test_logit_bias_is_applied_identically_under_every_drafter(
    demo_prompts: list[GenerationRequest],
) -> None:
    engines = {
        kind: LLMEngine(EngineConfig(drafter=kind, max_model_len=8192)) for kind in ("ar", "mtp", "tree")
    }

    def outputs(kind: str, params: SamplingParams, tag: str) -> dict[str, list[int]]:
        # seeded coins are keyed by output position, so a warm engine gives the same tokens
        requests = [
            replace(p, request_id=p.request_id + tag, sampling=params, max_tokens=20, seed=7)
            for p in demo_prompts[:2]
        ]
        return {
            k.removesuffix(tag): output_tokens(v) for k, v in run_requests(engines[kind], requests).items()
        }

    plain = outputs("ar", SamplingParams(0.0), "-plain")
    # ban the two tokens the unbiased answers use most, lift another one
    common = [t for t, _ in Counter(t for out in plain.values() for t in out).most_common(3)]
    bias = ((common[0], -100.0), (common[1], -100.0), (common[2], 2.5))
    for tag, params in (
        ("-greedy", SamplingParams(0.0, logit_bias=bias)),
        ("-sampled", SamplingParams(0.8, top_k=20, logit_bias=bias)),
    ):
        by_kind = {kind: outputs(kind, params, tag) for kind in engines}
        assert by_kind["mtp"] == by_kind["ar"] and by_kind["tree"] == by_kind["ar"]
        assert not {common[0], common[1]} & {t for out in by_kind["ar"].values() for t in out}
        assert by_kind["ar"] != plain
