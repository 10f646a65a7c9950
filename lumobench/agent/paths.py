"""Where the agent driver finds shipped files (agent settings, task lists) and keeps its caches."""

from __future__ import annotations

from pathlib import Path

#: The repository root (the package is installed editable from it).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Shipped agent settings templates and task lists.
AGENTS_DIR = REPO_ROOT / "agents"
#: Git-ignored caches: Qwen Code installs (`qwen-code/<version>`) and repository mirrors (`repos/`).
CACHE_DIR = REPO_ROOT / ".cache"
