"""GDN publication of an accepted path in segments, with the states at block boundaries on the way.

vLLM's prefix cache for hybrid models ("align" mamba cache mode) keeps, for mamba block j of a
request, the recurrent and conv state after exactly (j + 1) * block_size tokens. One tree cycle
publishes its whole accepted path at once, so when the path crosses a block boundary the boundary's
state exists only part-way through the replay. `boundary_cuts` says where a path crosses;
`publish_gdn_path` publishes the path segment by segment through the GDN core and hands the states
to `save` at each cut (in align mode `align.boundary_saver`; in mode "none" there are no cuts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

from torch import Tensor

from lumotree.vllm.gdn_core import GdnCore
from lumotree.vllm.steps import RequestStep


def boundary_cuts(prefix_len: int, path_len: int, block_size: int) -> list[int]:
    """The path lengths k in 1..path_len after which the sequence holds whole blocks.

    The path's root is token prefix_len (the pending token), so after its first k nodes the state
    holds prefix_len + k tokens: the state vLLM caches for block (prefix_len + k) // block_size - 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    first = block_size - prefix_len % block_size
    return list(range(first, path_len + 1, block_size))


def publish_gdn_path(
    core: GdnCore,
    req: RequestStep,
    names: Sequence[str],
    states: Sequence[Tensor],
    convs: Sequence[Tensor],
    accepted: Sequence[int],
    cuts: Sequence[int] = (),
    save: Callable[[int], None] | None = None,
) -> None:
    """Publish the accepted logical nodes (root first) of the request's tree into every GDN layer
    `names` in place (states[i] [HV, V, K] fp32 and convs[i] [C, W-1]: layer i's durable states).
    At each cut k (1 <= k <= len(accepted)) the states hold exactly the path's first k nodes when
    save(k) runs."""
    bounds = sorted({0, len(accepted), *cuts})
    if bounds[0] < 0 or bounds[-1] > len(accepted):
        raise ValueError(f"cuts {list(cuts)} outside the path of {len(accepted)} nodes")
    for start, end in pairwise(bounds):
        core.publish(req, names, states, convs, accepted[start:end])
        if save is not None and end in cuts:
            save(end)
