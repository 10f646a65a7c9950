"""Where the project's shipped small model lives."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "lumo-tiny-coder"
MODEL_ENV = "LUMOTREE_MODEL"


def models_dir() -> Path:
    """`serving/models/` of this checkout (the package is installed editable from `serving/`)."""
    return Path(__file__).resolve().parents[2] / "models"


def default_model_path() -> Path:
    """The embedded default checkpoint folder: $LUMOTREE_MODEL if set, else serving/models/lumo-tiny-coder.

    Raises FileNotFoundError with a clear message if the folder has no config.json.
    """
    path = Path(os.environ.get(MODEL_ENV) or models_dir() / DEFAULT_MODEL_NAME)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no model at {path} (set {MODEL_ENV} to a checkpoint folder)")
    return path
