"""Engine configuration: the model, the drafter kind and its geometry, limits and CPU settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from lumotree.drafting.geometry import GeometryConfig
from lumotree.model.native.build import isa as native_isa
from lumotree.tree import DEFAULT_ROWS, MAX_DEPTH

DrafterKind = Literal["ar", "mtp", "tree"]
DRAFTER_KINDS: tuple[str, ...] = ("ar", "mtp", "tree")
KernelSet = Literal["auto", "cpu-native", "cpu-fast", "reference", "triton"]
KERNEL_SETS: tuple[str, ...] = ("auto", "cpu-native", "cpu-fast", "reference", "triton")
CPU_KERNEL_SETS: tuple[str, ...] = ("auto", "cpu-native", "cpu-fast", "reference")
TreeShape = Literal["auto", "paper", "compact", "small", "medium"]
TREE_SHAPES: tuple[str, ...] = ("auto", "paper", "compact", "small", "medium")
#: (mtp_depth, siblings, tail_len, rescue_lens) of the named tree shapes
SHAPE_COUNTS: dict[str, tuple[int, int, int, tuple[int, ...]]] = {
    # the paper's geometry, 28 rows: on a GPU the extra verification rows are nearly free
    "paper": (5, 2, 6, (4, 2)),
    # 9 rows for the native CPU forward, where each extra row costs about a fifth of an AR step's
    # forward (paper tree: 10.5 ms target span against 1.6 ms for AR, 0.84x AR overall; this shape
    # was the fastest tried: results/cpu/tree-shapes.md)
    "compact": (2, 0, 4, (2,)),
    # the compact tree's neighbours in the sweep behind NATIVE_TREE_SHAPE (7 and 13 rows)
    "small": (2, 0, 4, ()),
    "medium": (3, 1, 4, (2,)),
}
#: the shape `auto` picks on the native CPU forward, by its ISA path: the fastest tree of an
#: interleaved sweep on each (results/cpu/cpu-classes.md); NEON (not measured on ARM hardware: qemu
#: times nothing) takes the AVX2 choice, the narrower of the two measured
NATIVE_TREE_SHAPE: dict[str, str] = {"avx512": "compact", "avx2": "compact", "neon": "compact"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass(frozen=True)
class EngineConfig:
    """How to build an LLMEngine.

    drafter: "ar" (no drafts), "mtp" (chain of `mtp_depth` MTP spine drafts) or "tree" (the paper
    geometry: MTP spine + `siblings` runner-ups per depth + suffix tail + rescue branches).
    tree_shape: the tree's counts. "paper" (5-depth spine, 2 siblings, tail 6, rescues 4 and 2),
    "compact", "small" or "medium" (SHAPE_COUNTS) replace mtp_depth/siblings/tail_len/rescue_lens;
    "auto" keeps the counts given, except that the paper's counts become NATIVE_TREE_SHAPE's for the
    native CPU forward's ISA path on this machine.
    rows: verification rows of a tree (None: on a CPU exactly the geometry's capacity, 1 + max
    drafts; with the triton kernels the paper's 32, fixed shapes for GPU tiles and CUDA graphs).
    max_model_len: prompt + output tokens of one request (None: the model's max_position_embeddings).
    device: "auto" (CUDA when present, else CPU), "cpu", "cuda" or "cuda:N".
    kernels: "auto" (triton on CUDA, cpu-native on a CPU), "cpu-native" (the model's native C
    forward, `lumotree.model.native`: every row bitwise independent of the other rows, so AR, chain
    and tree agree bit for bit; the engine falls back to cpu-fast, saying why, when "auto" meets a
    machine without a C compiler or a model it does not support), "cpu-fast" (vectorised PyTorch
    variants, tested equal to the references), "reference", or "triton" (the device cycle; on a CPU
    only under TRITON_INTERPRET=1, for tests).
    eager: no CUDA graphs on the device path (debugging; slower).
    random_weights: a shape preset (`lumotree.model.random_weights`, e.g. "qwen3.5-27b") built on
    the device from `seed` instead of loading `model` (whose tokenizer the server still uses).
    draft_head_dtype: precision of the vocabulary projection in MTP drafting passes (drafts only;
    bfloat16 halves the bytes each pass streams, measured ~10% faster cycles at equal acceptance).
    draft_vocab: a draft vocabulary file (`python -m lumotree.drafting.draft_vocab`): the token ids
    MTP drafting passes may propose, so each pass reads only those rows of the vocabulary
    projection; verification still scores every token (outputs unchanged, acceptance may drop).
    threads: torch intra-op threads (1 is fastest for this model size on CPU: measured).
    overlap_prompt_mtp: the host runner writes the prompt's MTP rows on a worker thread while the
        target prefills and the first token goes out (False: inside each prefill step, as the
        device runner does; for one-core machines and A/B timing).
    forced_acceptance: speed work only (`lumotree.sampling.forced`): every drafting cycle accepts a
    spine prefix of lengths from this schedule ("paper", a mean, counts, "hist:FILE") instead of
    the walk's, so a random-weight model's cycles publish realistic paths; outputs are not a
    model's. Ignored by the "ar" drafter (nothing to accept).
    tree_drafting: with the triton kernels, where the tree's next topology is drafted: "device"
    (inside the cycle, `DeviceTreeDrafter`, so the next cycle starts before the host reads the
    results) or "host" (the engine's drafter between two cycles; for A/B timing). The same trees.
    """

    model: Path | str | None = None  # None: lumotree.model.default_model_path()
    drafter: DrafterKind = "tree"
    mtp_depth: int = 5
    siblings: int = 2
    tail_len: int = 6
    rescue_lens: tuple[int, ...] = (4, 2)
    tree_shape: TreeShape = "auto"
    max_depth: int = MAX_DEPTH
    rows: int | None = None
    max_model_len: int | None = None
    dtype: str = "float32"
    threads: int = 1
    overlap_prompt_mtp: bool = True
    device: str = "auto"
    kernels: KernelSet = "auto"
    eager: bool = False
    random_weights: str | None = None
    draft_head_dtype: Literal["float32", "bfloat16"] = "bfloat16"
    draft_vocab: Path | str | None = None
    prefill_chunk: int = 512
    prefix_cache: bool = True
    cache_block: int = 64
    prefix_cache_tokens: int = 65_536
    suffix_min_match: int = 2
    suffix_cache_tokens: int = 65_536
    seed: int | None = None  # seeds drawn for seedless requests come from this (None: os entropy)
    forced_acceptance: str | None = None
    tree_drafting: Literal["device", "host"] = "device"

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTER_KINDS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTER_KINDS)}, got {self.drafter!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.drafter != "ar" and not 1 <= self.mtp_depth <= self.max_depth:
            raise ValueError(f"mtp_depth must be in 1..{self.max_depth}, got {self.mtp_depth}")
        if self.tree_shape not in TREE_SHAPES:
            raise ValueError(f"tree_shape must be one of {', '.join(TREE_SHAPES)}, got {self.tree_shape!r}")
        if self.kernels not in KERNEL_SETS:
            raise ValueError(f"kernels must be one of {', '.join(KERNEL_SETS)}, got {self.kernels!r}")
        if self.device != "auto" and self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.tree_drafting not in ("device", "host"):
            raise ValueError(f"tree_drafting must be device or host, got {self.tree_drafting!r}")
        if self.prefill_chunk < 1 or self.cache_block < 1 or self.prefill_chunk % self.cache_block:
            raise ValueError("prefill_chunk must be a positive multiple of cache_block")
        self.geometry()  # validates the tree counts

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def resolved(self) -> EngineConfig:
        """This config with `device` and `kernels` made concrete for this machine (ValueError when
        they cannot run here) and the device path's tree padded to the paper's 32 rows."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
        kernels = self.kernels
        if kernels == "auto":
            kernels = "triton" if device.startswith("cuda") else "cpu-native"
        if device.startswith("cuda") and kernels != "triton":
            raise ValueError(f"the {kernels} kernels run on a CPU only; on CUDA use the triton kernels")
        if kernels == "triton" and device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("the triton kernels on a CPU need TRITON_INTERPRET=1 (tests only: slow)")
        rows = self.rows
        if kernels == "triton" and self.drafter == "tree" and rows is None:
            rows = DEFAULT_ROWS
        return replace(self, device=device, kernels=kernels, rows=rows)

    def shaped(self) -> EngineConfig:
        """This config with the tree's counts set by `tree_shape` for the kernels it runs on (call it
        once the kernel set is final: the native CPU forward's fallback can change it)."""
        if self.drafter != "tree":
            return self
        shape = self.tree_shape
        if shape == "auto":
            if (self.mtp_depth, self.siblings, self.tail_len, self.rescue_lens) != SHAPE_COUNTS["paper"]:
                return self  # counts were given: they are kept
            shape = NATIVE_TREE_SHAPE[native_isa()] if self.kernels == "cpu-native" else "paper"
        depth, siblings, tail, rescues = SHAPE_COUNTS[shape]
        return replace(
            self, tree_shape=shape, mtp_depth=depth, siblings=siblings, tail_len=tail, rescue_lens=rescues
        )

    def geometry(self) -> GeometryConfig:
        """The draft geometry of this drafter kind (AR: the root alone; MTP: a chain)."""
        if self.drafter == "ar":
            return GeometryConfig(0, 0, 0, (), rows=1, max_depth=self.max_depth)
        if self.drafter == "mtp":
            return GeometryConfig(self.mtp_depth, 0, 0, (), rows=1 + self.mtp_depth, max_depth=self.max_depth)
        capacity = (
            GeometryConfig(
                self.mtp_depth, self.siblings, self.tail_len, self.rescue_lens, max_depth=self.max_depth
            ).max_drafts
            + 1
        )
        return GeometryConfig(
            self.mtp_depth,
            self.siblings,
            self.tail_len,
            self.rescue_lens,
            rows=self.rows or capacity,
            max_depth=self.max_depth,
        )
