"""Publication vs step-by-step decoding on the toy hybrid stack, with planted publication faults.

Each run does several tree cycles (paper geometry, accepted paths from a fixed schedule: an MTP
sibling leaf, a spine prefix, a rescue-branch end, the root alone). After every cycle the verify
outputs of the accepted nodes and the published GDN states, conv states and KV rows are compared
with step-by-step decoding of the same tokens (native working precision and float64) under the
paired rule's end-to-end form (the run's native envelope). A fault is planted at one mutation
cycle and counts as detected if any later comparison fails; the fault-free run must pass every
comparison.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable

import torch

from lumobench.checks.paired import PairedResult, paired_check_envelope
from lumobench.checks.random_trees import paper_tree
from lumobench.checks.result import CheckResult
from lumobench.checks.toy import (
    Publication,
    StepOutputs,
    ToyDims,
    ToyHybrid,
    decode_step,
    make_state,
    make_toy,
    toy_publish,
    toy_verify,
)
from lumotree.tree import TreeDescriptor

MUTATION_CYCLE = 1


def scheduled_path(tree: TreeDescriptor, cycle: int) -> list[int]:
    """The accepted path of a cycle: sibling leaf, spine prefix, deepest off-spine node, root only."""
    spine = tree.spine.tolist()
    off_spine = [i for i in range(tree.n_active) if i not in spine]
    kind = cycle % 4
    if kind == 0 and off_spine:
        leaf = max(
            (i for i in off_spine if int(tree.parent[i]) in spine),
            key=lambda i: (int(tree.depth[i]) <= 3, int(tree.depth[i])),
        )
        return tree.path_to(leaf)
    if kind == 1:
        return spine[: min(len(spine), 6)]
    if kind == 2 and off_spine:
        return tree.path_to(max(off_spine, key=lambda i: int(tree.depth[i])))
    return [0]


def _sibling_swapped(tree: TreeDescriptor, path: list[int]) -> list[int]:
    last = path[-1]
    parent = int(tree.parent[last])
    siblings = [int(c) for c in tree.child_nodes[parent] if c >= 0 and int(c) != last]
    return [*path[:-1], siblings[0]]


def _stale_metadata(tree: TreeDescriptor, pub: Publication, prev: Publication | None) -> Publication:
    # The previous cycle's accepted indices and length, never refreshed.
    if prev is None:
        raise ValueError("the stale-metadata fault needs an earlier cycle")
    return Publication(prev.accepted, prev.path_len)


PublicationFault = Callable[[TreeDescriptor, Publication, Publication | None], Publication]

PUBLICATION_FAULTS: dict[str, PublicationFault] = {
    "sibling substitution": lambda tree, pub, prev: Publication(
        pub.accepted,
        pub.path_len,
        gdn_accepted=tree.padded_path(_sibling_swapped(tree, pub.accepted[: pub.path_len].tolist())),
    ),
    "swapped operand rings": lambda tree, pub, prev: Publication(
        pub.accepted, pub.path_len, ring_order=(1, 0)
    ),
    "stale publication metadata": _stale_metadata,
    "omitted conv gather": lambda tree, pub, prev: Publication(
        pub.accepted, pub.path_len, conv_accepted=tree.padded_path(list(range(pub.path_len)))
    ),
    "omitted recurrent replay": lambda tree, pub, prev: Publication(pub.accepted, pub.path_len, replay=False),
    "wrong KV remap": lambda tree, pub, prev: Publication(
        pub.accepted, pub.path_len, kv_slot_map=torch.arange(tree.rows)
    ),
}
STALE_ROOT = "stale root input"
FAULTS = (*PUBLICATION_FAULTS, STALE_ROOT)


def _stack(outs: list[StepOutputs], layer: int | None) -> torch.Tensor:
    return torch.stack([o.attn if layer is None else o.gdn[layer] for o in outs])


def run_continuation(
    base: ToyHybrid, dtype: torch.dtype, cycles: int, seed: int, fault: str | None = None
) -> list[PairedResult]:
    """Run `cycles` tree cycles against step-by-step decoding; one PairedResult per cycle."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    model = base.to(dtype)
    truth_model = model.to(torch.float64)
    start = make_state(model.dims, prefix_len=8, gen=gen)
    impl, native = start.to(model), start.to(model)
    truth = impl.to(truth_model)
    # The root row is the pending token: emitted last cycle, materialised by this cycle's forward.
    pending = fed_root = rng.randrange(model.dims.vocab)
    prev: Publication | None = None
    quantities: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = defaultdict(list)
    lengths_agree: list[bool] = []
    for cycle in range(cycles):
        tree = paper_tree(rng, model.dims.vocab, impl.length, root=fed_root)
        verified = toy_verify(model, impl, tree)
        path = scheduled_path(tree, cycle)
        pub = Publication(tree.padded_path(path), len(path))
        if fault in PUBLICATION_FAULTS and cycle == MUTATION_CYCLE:
            pub = PUBLICATION_FAULTS[fault](tree, pub, prev)
        toy_publish(model, impl, tree, verified, pub)
        tokens = [pending, *tree.tokens[path[1:]].tolist()]
        nat = [decode_step(model, native, t) for t in tokens]
        tru = [decode_step(truth_model, truth, t) for t in tokens]

        # Snapshots: publication keeps updating the durable tensors in place in later cycles.
        n = min(impl.length, native.length)
        lengths_agree.append(impl.length == native.length)
        for layer in range(len(model.gdn)):
            quantities[f"gdn{layer} outputs"].append(
                (verified.gdn[layer].o[path], _stack(nat, layer), _stack(tru, layer))
            )
            quantities[f"gdn{layer} state"].append(
                (impl.gdn[layer].clone(), native.gdn[layer].clone(), truth.gdn[layer].clone())
            )
            quantities[f"conv{layer} state"].append(
                (impl.conv[layer].clone(), native.conv[layer].clone(), truth.conv[layer].clone())
            )
        quantities["attention outputs"].append((verified.attn[path], _stack(nat, None), _stack(tru, None)))
        for name, got, nat_t, tru_t in (
            ("k", impl.k_cache, native.k_cache, truth.k_cache),
            ("v", impl.v_cache, native.v_cache, truth.v_cache),
        ):
            quantities[f"{name} cache"].append((got[:n].clone(), nat_t[:n].clone(), tru_t[:n].clone()))

        # The sampled token b* (emitted, pending); drawn unequal to the root so that a stale root differs.
        pending = rng.choice([t for t in range(model.dims.vocab) if t != int(tree.tokens[0])])
        # The stale-root fault feeds the next root row with this cycle's root token instead of b*.
        fed_root = int(tree.tokens[0]) if fault == STALE_ROOT and cycle == MUTATION_CYCLE else pending
        prev = pub

    # Cells: value heads of outputs and states, channels of conv states, (token, head) of KV rows.
    # The GDN state is fp32, but its operands were rounded to the model dtype upstream, so that
    # dtype's rounding sets its floor too.
    per_cycle = [PairedResult(0, int(not same), 0.0, 0.0) for same in lengths_agree]
    for name, triples in quantities.items():
        cell_dims = 1 if name.endswith("state") else 2
        for cycle, r in enumerate(paired_check_envelope(triples, cell_dims, dtype)):
            per_cycle[cycle] = per_cycle[cycle] + r
    return per_cycle


def check_continuation(runs: int, cycles: int = 4, seed: int = 0) -> CheckResult:
    """Fault-free runs pass every cycle in fp32 and bf16; each planted fault is caught in every run."""
    result = CheckResult("Publication vs stepwise")
    worst = 0.0
    for run in range(runs):
        model = make_toy(ToyDims(), torch.Generator().manual_seed(seed + run))
        for dtype in (torch.float32, torch.bfloat16):
            for r in run_continuation(model, dtype, cycles, seed + 1000 + run):
                worst = max(worst, r.worst_ratio)
                result.case(r.ok)
            for fault in FAULTS:
                found = run_continuation(model, dtype, MUTATION_CYCLE + 2, seed + 1000 + run, fault)
                result.fault(any(not r.ok for r in found))
    result.detail = (
        f"toy hybrid (2 GDN + 1 attention layer), {cycles} cycles/run, fp32 + bf16, worst ratio {worst:.2f}; "
        f"faults: {', '.join(FAULTS)}"
    )
    return result
