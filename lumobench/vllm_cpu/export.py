"""The shipped model in the layout vLLM's CPU build serves: Qwen3-Next, MTP weights included.

vLLM's Qwen3-Next loader requires sparse-MoE layers, so the dense MLPs of `lumo-tiny-coder` are written as
exactly equivalent one-expert MoE blocks (`--dense-mlp-as-moe`). The export is the documented command

    python -m lumotree.training export --model M --out D --format qwen3_next --dense-mlp-as-moe

run in a subprocess (lumobench drives LumoTree as a user would). A marker records a digest of the source
checkpoint and the export flags, so a complete export is reused and a stale or partial one rewritten.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from lumobench.arms import REPO_ROOT
from lumobench.errors import LumobenchError

SHIPPED_MODEL_DIR = REPO_ROOT / "serving" / "models" / "lumo-tiny-coder"
EXPORT_FLAGS = ("--format", "qwen3_next", "--dense-mlp-as-moe")
MARKER = ".lumobench-export"
# what the export reads: weights and config, and the tokenizer files it copies
SOURCE_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
)


def export_recipe(model: Path) -> str:
    """Digest of the source checkpoint's files and the export flags: the marker's content."""
    digest = hashlib.sha256(" ".join(EXPORT_FLAGS).encode())
    for name in SOURCE_FILES:
        path = model / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<absent>")
    return digest.hexdigest()


def is_exported(dest: Path, model: Path = SHIPPED_MODEL_DIR) -> bool:
    marker = dest / MARKER
    return marker.is_file() and marker.read_text().strip() == export_recipe(model)


def export_qwen3_next(dest: Path, model: Path = SHIPPED_MODEL_DIR, python: str = sys.executable) -> Path:
    """Write `model` (default: the shipped lumo-tiny-coder) to `dest` as a Qwen3-Next checkpoint with its
    MTP weights, for vLLM; reuse `dest` when its marker matches. Returns `dest`.

    Raises `LumobenchError` with the export's output tail when the export fails.
    """
    if is_exported(dest, model):
        return dest
    if not (model / "config.json").is_file():
        raise LumobenchError(f"no checkpoint to export at {model} (config.json missing)")
    shutil.rmtree(dest, ignore_errors=True)
    argv = [
        python,
        "-m",
        "lumotree.training",
        "export",
        "--model",
        str(model),
        "--out",
        str(dest),
        *EXPORT_FLAGS,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise LumobenchError(f"exporting {model} for vLLM failed (exit {proc.returncode}):\n{tail}")
    (dest / MARKER).write_text(export_recipe(model) + "\n")
    return dest
