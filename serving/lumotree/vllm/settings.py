"""The plugin's options, read from the environment of the vLLM processes (vLLM's own config has no
room for them): which drafter, its MTP depth and the op set (LUMOTREE_VLLM=1 activates the plugin).

    LUMOTREE_VLLM_DRAFTER=tree        tree (paper geometry) | mtp (chain MTP-k) | ar (root-only trees)
    LUMOTREE_VLLM_MTP_DEPTH=5         MTP passes per cycle (the spine depth)
    LUMOTREE_VLLM_KERNELS=cpu-native  cpu-native | cpu-fast | reference (on the CPU: the GDN core on the
                                      native forward's kernels, or the op set's in PyTorch; tree
                                      attention runs the named op set, cpu-fast for cpu-native)

A tree never has more rows than vLLM schedules for a request (1 + num_speculative_tokens).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from lumotree.engine.config import DRAFTER_KINDS, EngineConfig

ENV_DRAFTER = "LUMOTREE_VLLM_DRAFTER"
ENV_DEPTH = "LUMOTREE_VLLM_MTP_DEPTH"
ENV_KERNELS = "LUMOTREE_VLLM_KERNELS"
KERNEL_SETS = ("cpu-native", "cpu-fast", "reference")


class SettingsError(ValueError):
    """A plugin option the plugin cannot use (the message is one line for the user)."""


@dataclass(frozen=True)
class PluginSettings:
    """drafter: "tree", "mtp" or "ar"; mtp_depth: spine depth; kernels: the CPU GDN core and op set."""

    drafter: str = "tree"
    mtp_depth: int = 5
    kernels: str = "cpu-native"

    @property
    def full_rows(self) -> int:
        """Rows of a full tree (root + drafts): num_speculative_tokens should be full_rows - 1."""
        return EngineConfig(drafter=self.drafter, mtp_depth=self.mtp_depth).geometry().rows  # type: ignore[arg-type]

    def engine_config(self, max_rows: int) -> EngineConfig:
        """The project engine's config of this drafter with trees of at most `max_rows` rows."""
        if self.drafter == "mtp" and 1 + self.mtp_depth > max_rows:
            raise SettingsError(
                f"chain MTP-{self.mtp_depth} needs num_speculative_tokens >= {self.mtp_depth}, "
                f"vLLM schedules {max_rows - 1}"
            )
        rows = min(self.full_rows, max_rows) if self.drafter == "tree" else None
        return EngineConfig(drafter=self.drafter, mtp_depth=self.mtp_depth, rows=rows)  # type: ignore[arg-type]


def from_env() -> PluginSettings:
    """The settings in the environment; SettingsError naming the variable on a bad value."""
    drafter = os.environ.get(ENV_DRAFTER, "tree")
    if drafter not in DRAFTER_KINDS:
        raise SettingsError(f"{ENV_DRAFTER} must be one of {', '.join(DRAFTER_KINDS)}, got {drafter!r}")
    raw_depth = os.environ.get(ENV_DEPTH, "5")
    try:
        depth = int(raw_depth)
        EngineConfig(drafter=drafter, mtp_depth=depth)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SettingsError(f"{ENV_DEPTH}={raw_depth!r}: {exc}") from None
    kernels = os.environ.get(ENV_KERNELS, "cpu-native")
    if kernels not in KERNEL_SETS:
        raise SettingsError(f"{ENV_KERNELS} must be one of {', '.join(KERNEL_SETS)}, got {kernels!r}")
    return PluginSettings(drafter=drafter, mtp_depth=depth, kernels=kernels)
