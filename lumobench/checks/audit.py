"""Monte-Carlo audit of the acceptance walk (paper §VII-F), and the greedy-walk check.

A sampler under audit turns a step's raw logits into walks (logits processing + walk). The audit
is black-box on the emitted tokens: a walk visits node u when its first depth(u) emitted tokens are
u's path drafts; single-row decoding then says the next emitted token is distributed as p_u, the
row decoded with u's own history. Per visited node with enough visits, a G-test compares the
observed next tokens with p_u (expected counts below 5 pooled; an observation in a zero-probability
bucket, or a missing next token, rejects outright), Bonferroni-adjusted over the step's tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.stats import chi2
from torch import Tensor

from lumobench.checks.random_trees import SHAPES, paper_tree, random_tree
from lumobench.checks.result import CheckResult
from lumotree.sampling.logits import (
    SamplingParams,
    apply_penalties,
    probabilities,
    row_penalized_logits,
    tree_penalized_logits,
    tree_probabilities,
)
from lumotree.sampling.rng import uniform_coins
from lumotree.sampling.walk import WalkResult, greedy_walk, sample_walk
from lumotree.tree import TreeDescriptor

AUDIT_PARAMS = SamplingParams(temperature=0.6, top_k=20, top_p=0.95, presence_penalty=1.0)
ALPHA = 1e-3  # per-step family-wise level
MIN_EXPECTED = 5.0


@dataclass(frozen=True, eq=False)
class AuditStep:
    """One captured-like step: the tree, raw logits [R, V], the request history, and the output
    position the root row samples (the index after the pending root)."""

    tree: TreeDescriptor
    logits: Tensor
    prompt: list[int]
    generated: list[int]
    position: int


def make_step(rng: random.Random, gen: torch.Generator, vocab: int, step: int) -> AuditStep:
    """LM-like rows: a shared base plus per-row noise, with each node's draft children placed near the
    row's top (the spine child above it) so walks go deep; random histories so penalties matter."""
    prompt = [rng.randrange(vocab) for _ in range(24)]
    generated = [rng.randrange(vocab) for _ in range(8)]
    tree = paper_tree(rng, vocab, prefix_len=len(prompt) + len(generated))
    generated.append(int(tree.tokens[0]))
    base = 1.5 * torch.randn(vocab, generator=gen)
    logits = base + torch.randn(tree.rows, vocab, generator=gen)
    for u in range(tree.n_active):
        top = float(logits[u].max())
        children = [int(c) for c in tree.child_nodes[u] if c >= 0]
        for rank, c in enumerate(children):
            logits[u, int(tree.tokens[c])] = top + (0.8 if rank == 0 else -0.4 * rank)
    # each audit step stands for a different point of a request: its own output position
    return AuditStep(tree, logits, prompt, generated, position=1000 * step + len(generated))


def expected_rows(s: AuditStep, params: SamplingParams) -> Tensor:
    """p_u for every active node by single-row decoding with history prompt + generated + path."""
    rows = []
    for u in range(s.tree.n_active):
        history = s.generated + s.tree.tokens[s.tree.path_to(u)[1:]].tolist()
        rows.append(
            probabilities(row_penalized_logits(s.logits[u], s.prompt, history, params)[None], params)[0]
        )
    return torch.stack(rows)


Sampler = Callable[[AuditStep, Tensor], WalkResult]


def correct_sampler(s: AuditStep, seeds: Tensor, params: SamplingParams = AUDIT_PARAMS) -> WalkResult:
    """The deployed path: per-path tree processing, then the Philox target-only walk."""
    probs = tree_probabilities(s.logits, s.tree, s.prompt, s.generated, params)
    return sample_walk(probs, s.tree, seeds, s.position)


def _child_ignored(s: AuditStep, seeds: Tensor) -> WalkResult:
    # The walk's child table loses the root's most probable child.
    probs = tree_probabilities(s.logits, s.tree, s.prompt, s.generated, AUDIT_PARAMS)
    child_tokens = s.tree.child_tokens.clone()
    valid = child_tokens[0] >= 0
    reach = torch.where(valid, probs[0, child_tokens[0].clamp(min=0)], -1.0)
    child_tokens[0, int(reach.argmax())] = -1
    return sample_walk(probs, replace(s.tree, child_tokens=child_tokens), seeds, s.position)


def _parent_row(s: AuditStep, seeds: Tensor) -> WalkResult:
    # Every child node is sampled from its parent's row.
    probs = tree_probabilities(s.logits, s.tree, s.prompt, s.generated, AUDIT_PARAMS)
    return sample_walk(probs[s.tree.parent.clamp(min=0)], s.tree, seeds, s.position)


def _flattened_history(s: AuditStep, seeds: Tensor) -> WalkResult:
    # Row j's penalty history is the first j drafts in logical order (the chain combiner).
    vocab, tokens = s.logits.shape[-1], s.tree.tokens.tolist()
    counts = torch.stack(
        [
            torch.bincount(torch.tensor(s.generated + tokens[1 : j + 1]), minlength=vocab).float()
            for j in range(s.tree.rows)
        ]
    )
    prompt_seen = torch.bincount(torch.tensor(s.prompt), minlength=vocab) > 0
    probs = probabilities(apply_penalties(s.logits, prompt_seen, counts, AUDIT_PARAMS), AUDIT_PARAMS)
    return sample_walk(probs, s.tree, seeds, s.position)


def _reused_coins(s: AuditStep, seeds: Tensor) -> WalkResult:
    # The position counter is dropped: every depth of a walk reuses the same coins.
    probs = tree_probabilities(s.logits, s.tree, s.prompt, s.generated, AUDIT_PARAMS)
    return sample_walk(
        probs,
        s.tree,
        seeds,
        s.position,
        coins=lambda sd, positions, v: uniform_coins(sd, torch.zeros_like(positions), v),
    )


def _wrong_temperature(s: AuditStep, seeds: Tensor) -> WalkResult:
    return correct_sampler(s, seeds, replace(AUDIT_PARAMS, temperature=1.0))


SAMPLER_FAULTS: dict[str, Sampler] = {
    "a child ignored": _child_ignored,
    "parent's row used for a child": _parent_row,
    "flattened-chain penalty history": _flattened_history,
    "reused coins": _reused_coins,
    "wrong temperature": _wrong_temperature,
}


def g_tests(s: AuditStep, walks: WalkResult, expected: Tensor, min_visits: int) -> list[float]:
    """p-values of the per-node G-tests for every active node with >= min_visits visits."""
    emitted = walks.emitted
    vocab = expected.shape[-1]
    pvalues = []
    for u in range(s.tree.n_active):
        path = s.tree.path_to(u)
        depth = len(path) - 1
        prefix = s.tree.tokens[path[1:]]
        visits = (emitted[:, :depth] == prefix).all(dim=1)
        n = int(visits.sum())
        if n < min_visits:
            continue
        nxt = emitted[visits, depth]
        observed = torch.bincount(torch.where(nxt >= 0, nxt, vocab), minlength=vocab + 1).double().numpy()
        exp = np.append(n * expected[u].double().numpy(), 0.0)
        rare = exp < MIN_EXPECTED
        obs_b = np.append(observed[~rare], observed[rare].sum())
        exp_b = np.append(exp[~rare], exp[rare].sum())
        if obs_b[-1] > 0 and exp_b[-1] == 0:
            pvalues.append(0.0)
            continue
        keep = exp_b > 0
        o, e = obs_b[keep], exp_b[keep]
        with np.errstate(divide="ignore", invalid="ignore"):
            g = 2.0 * float(np.sum(np.where(o > 0, o * np.log(o / e), 0.0)))
        pvalues.append(float(chi2.sf(g, max(1, len(o) - 1))))
    return pvalues


def audit_step(
    s: AuditStep, sampler: Sampler, walks: int, min_visits: int, chunk: int = 32768
) -> tuple[int, int]:
    """(node tests, Bonferroni rejections) of one sampler on one step."""
    seeds = torch.arange(walks, dtype=torch.long) + 1_000_003 * (s.position + 1)
    parts = [sampler(s, seeds[i : i + chunk]) for i in range(0, walks, chunk)]
    merged = WalkResult(
        *(torch.cat([getattr(p, f) for p in parts]) for f in ("accepted", "path_len", "emitted", "final_row"))
    )
    pvalues = g_tests(s, merged, expected_rows(s, AUDIT_PARAMS), min_visits)
    return len(pvalues), sum(p < ALPHA / max(1, len(pvalues)) for p in pvalues)


def check_sampler_audit(
    steps: int, walks: int, min_visits: int, seed: int = 0, vocab: int = 48
) -> CheckResult:
    """The correct walk must not be rejected on any step; every planted fault must be rejected on one."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    audit = [make_step(rng, gen, vocab, step) for step in range(steps)]
    result = CheckResult("Sampler audit (G-test)")
    tests = 0
    for s in audit:
        n, rejected = audit_step(s, correct_sampler, walks, min_visits)
        tests += n
        result.case(rejected == 0 and n > 0)
    for sampler in SAMPLER_FAULTS.values():
        result.fault(any(audit_step(s, sampler, walks, min_visits)[1] > 0 for s in audit))
    result.detail = (
        f"{steps} steps x {walks} walks, {tests} node tests, alpha {ALPHA:g}/step (Bonferroni); "
        f"faults: {', '.join(SAMPLER_FAULTS)}"
    )
    return result


def stepwise_greedy(s: AuditStep, params: SamplingParams) -> list[int]:
    """Greedy decoding one row at a time: argmax of each row decoded with its own history."""
    tree, node, out = s.tree, 0, []
    while True:
        history = s.generated + tree.tokens[tree.path_to(node)[1:]].tolist()
        row = row_penalized_logits(s.logits[node], s.prompt, history, params)
        x = int(torch.nonzero(row == row.max())[0])
        out.append(x)
        children = {int(tree.tokens[c]): int(c) for c in tree.child_nodes[node] if c >= 0}
        if x not in children:
            return out
        node = children[x]


def check_greedy_walk(cases: int, seed: int = 0, vocab: int = 48) -> CheckResult:
    """The greedy walk emits exactly what step-by-step greedy decoding of the same rows emits,
    including rows whose maximum is tied (quantised logits)."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0.0, presence_penalty=0.5, repetition_penalty=1.2)
    result = CheckResult("Greedy walk vs stepwise")
    ties = 0
    for i in range(cases):
        s = make_step(rng, gen, vocab, i)
        if i % 2:
            # Quantise so that maxima tie: the lowest index must win in both.
            s = replace(s, logits=torch.round(s.logits))
            tree = random_tree(SHAPES[i % len(SHAPES)], rng, vocab=vocab)
            s = replace(s, tree=tree, generated=[*s.generated[:-1], int(tree.tokens[0])])
        pen = tree_penalized_logits(s.logits, s.tree, s.prompt, s.generated, params)
        ties += int(((pen == pen.amax(-1, keepdim=True)).sum(-1) > 1).any())
        walk = greedy_walk(pen, s.tree)
        n = int(walk.path_len[0])
        result.case(walk.emitted[0, :n].tolist() == stepwise_greedy(s, params))
    result.detail = f"{ties} of {cases} cases contain tied row maxima"
    return result
