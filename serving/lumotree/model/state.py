"""Per-request decode state: GDN recurrent + conv state per linear layer, KV cache per attention layer.

Layouts are pinned for the core and the engine (no batch dimension: one request):
- `GDNState.recurrent`: fp32 `[HV, V, K]` (V-first), `GDNState.conv`: `[C, W-1]` (oldest input first);
- `KVCache.key` / `.value`: `[T_max, Hkv, D]` token-major; rows `[0, length)` are the committed prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class GDNState:
    """Durable state of one Gated DeltaNet layer."""

    recurrent: torch.Tensor  # fp32 [HV, V, K]
    conv: torch.Tensor  # [C, W-1]

    def clone(self) -> GDNState:
        return GDNState(self.recurrent.clone(), self.conv.clone())


@dataclass
class KVCache:
    """Key/value rows of one attention layer."""

    key: torch.Tensor  # [T_max, Hkv, D]
    value: torch.Tensor  # [T_max, Hkv, D]

    def clone(self) -> KVCache:
        return KVCache(self.key.clone(), self.value.clone())


@dataclass
class ModelState:
    """All layers' state of one request; `length` = tokens already folded into it (next position)."""

    layers: list[GDNState | KVCache] = field(default_factory=list)
    length: int = 0
    gdn_bank: torch.Tensor | None = None  # fp32 [L_gdn, HV, V, K] whose views are the GDN states

    @property
    def capacity(self) -> int:
        """Maximum tokens the KV caches hold (unbounded when there is no attention layer)."""
        caps = [s.key.shape[0] for s in self.layers if isinstance(s, KVCache)]
        return min(caps) if caps else 1 << 62

    def clone(self) -> ModelState:
        """A deep copy (a snapshot, e.g. for a prefix-cache entry)."""
        return ModelState([s.clone() for s in self.layers], self.length)
