"""A checkpoint's chat template, rendered as transformers renders it: the one template engine that
the server, the training recipe and the benchmarks share.

The template is the Jinja source in the model folder's `tokenizer_config.json` (`chat_template`).
It is compiled in the sandboxed environment transformers uses (trim_blocks, lstrip_blocks, loop
controls, a `tojson` filter without HTML escaping), so a prompt rendered here equals
`tokenizer.apply_chat_template(..., tokenize=False)`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2.sandbox


def _tojson(value: Any, indent: int | None = None) -> str:
    # As transformers' chat-template `tojson` (no HTML escaping, non-ASCII kept).
    return json.dumps(value, ensure_ascii=False, indent=indent)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment transformers renders chat templates in."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def model_chat_template(model_dir: Path) -> jinja2.Template | None:
    """The compiled chat template of a model folder (None when its tokenizer_config.json has none)."""
    config_file = Path(model_dir) / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    source = config.get("chat_template")
    return compile_chat_template(source) if source else None
