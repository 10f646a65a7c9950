"""Chat-format fine-tuning data built from the training source files.

Turn kinds: explain a function (answer from its docstring), complete a function (signature + docstring
-> full code), fix a function (one planted operator bug -> the original), and tool-using agent
episodes (list_dir / grep / read_file calls with their tool responses, then an answer), some with a
<think> block. Tool names and schemas follow the demo corpus's coding-agent tools.
"""

from __future__ import annotations

import ast
import functools
import json
import multiprocessing
import os
import random
import re
import textwrap
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import jinja2
import numpy as np
from tokenizers import Tokenizer

from lumotree.model.chat_template import compile_chat_template
from lumotree.training.corpus import SourceFile
from lumotree.training.tokenizer import PAD, chat_template

SYSTEM_PROMPTS = (
    "You are a careful software engineering agent working in a Python repository. Use the tools to "
    "inspect files, run commands and edit code. Reply concisely.",
    "You are a helpful coding assistant.",
    "You are a patient senior engineer.",
)


def _tool(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    params = {"type": "object", "properties": props, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


TOOLS = [
    _tool("read_file", "Read a text file from the repository.", {"path": {"type": "string"}}, ["path"]),
    _tool("list_dir", "List the entries of a directory.", {"path": {"type": "string"}}, ["path"]),
    _tool(
        "grep",
        "Search files for a regular expression; returns matching lines with paths and numbers.",
        {"pattern": {"type": "string"}, "path": {"type": "string", "default": "."}},
        ["pattern"],
    ),
    _tool(
        "run_shell",
        "Run a shell command in the repository root.",
        {"command": {"type": "string"}},
        ["command"],
    ),
]

# (pattern, replacement, explanation) of planted bugs; the fix turn undoes one of them.
BUGS = (
    (" == ", " != ", "the comparison is inverted: `!=` should be `==`"),
    (" != ", " == ", "the comparison is inverted: `==` should be `!=`"),
    (" < ", " >= ", "the bound is wrong: `>=` should be `<`"),
    (" > ", " <= ", "the bound is wrong: `<=` should be `>`"),
    (" + 1", " - 1", "an off-by-one error: `- 1` should be `+ 1`"),
    (" - 1", " + 1", "an off-by-one error: `+ 1` should be `- 1`"),
    (" and ", " or ", "the condition uses `or` where it needs `and`"),
    (" is None", " is not None", "the None check is inverted"),
    ("return True", "return False", "it returns `False` where it should return `True`"),
)


@dataclass(frozen=True)
class Function:
    """A top-level or method definition cut from a source file."""

    file: SourceFile
    name: str
    source: str  # dedented
    header: str | None  # dedented signature (+ docstring): what a "complete this function" prompt shows
    lineno: int
    docstring: str | None


def extract_functions(file: SourceFile, max_lines: int = 40) -> list[Function]:
    """Functions of 3..max_lines lines in a file (none if it does not parse)."""
    try:
        tree = ast.parse(file.text)
    except (SyntaxError, ValueError):
        return []
    lines = file.text.splitlines()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if 3 <= node.end_lineno - start + 1 <= max_lines:
                doc = ast.get_docstring(node)
                body = node.body[1:] if doc is not None else node.body
                src = textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno]))
                header = None
                if body and body[0].lineno > node.lineno:
                    header = textwrap.dedent("\n".join(lines[start - 1 : body[0].lineno - 1])).rstrip()
                out.append(Function(file, node.name, src, header, start, doc))
    return out


def _summary(doc: str) -> str:
    first = doc.strip().split("\n\n")[0]
    return " ".join(first.split())


def _fence(code: str) -> str:
    return f"```python\n{code}\n```"


def explain_turn(fn: Function, rng: random.Random) -> list[dict[str, Any]] | None:
    summary = _summary(fn.docstring or "")
    if not summary:
        return None
    ask = rng.choice(("Explain what this function does:", "What does this code do?", "Briefly explain:"))
    answer = f"`{fn.name}`: {summary}"
    return [
        {"role": "user", "content": f"{ask}\n{_fence(fn.source)}"},
        {"role": "assistant", "content": answer},
    ]


def complete_turn(fn: Function, rng: random.Random) -> list[dict[str, Any]] | None:
    header = fn.header
    if not header or header.strip() == fn.source.strip():
        return None
    ask = rng.choice(("Complete this function:", "Write the body of this function:", "Implement:"))
    return [
        {"role": "user", "content": f"{ask}\n{_fence(header)}"},
        {"role": "assistant", "content": _fence(fn.source)},
    ]


def fix_turn(fn: Function, rng: random.Random) -> list[dict[str, Any]] | None:
    options = [b for b in BUGS if b[0] in fn.source]
    if not options:
        return None
    right, wrong, why = rng.choice(options)
    buggy = fn.source.replace(right, wrong, 1)
    ask = rng.choice(("This function has a bug. Fix it:", "Find and fix the bug:", "Why is this wrong?"))
    answer = f"In `{fn.name}`, {why}. Fixed version:\n{_fence(fn.source)}"
    return [{"role": "user", "content": f"{ask}\n{_fence(buggy)}"}, {"role": "assistant", "content": answer}]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def agent_episode(fn: Function, rng: random.Random) -> list[dict[str, Any]]:
    """A tool-using episode: find where fn is defined, read it, answer."""
    path = fn.file.name.split("/", 1)[1]
    folder = path.rsplit("/", 1)[0] if "/" in path else "."
    siblings = sorted({path.rsplit("/", 1)[-1], "__init__.py", "utils.py"})
    grep_hit = f"{path}:{fn.lineno}:{fn.source.splitlines()[0]}"
    user = rng.choice(
        (
            f"Where is `{fn.name}` defined and what does it do?",
            f"Find the implementation of `{fn.name}` and summarise it.",
            f"Show me how `{fn.name}` works.",
        )
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": user}]
    first: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("grep", pattern=f"def {fn.name}")],
    }
    if rng.random() < 0.5:
        first["reasoning_content"] = f"I should search the repository for the definition of {fn.name} first."
    messages += [first, {"role": "tool", "content": grep_hit}]
    if rng.random() < 0.3:
        messages += [
            {
                "role": "assistant",
                "content": "Let me look at the folder.",
                "tool_calls": [_call("list_dir", path=folder)],
            },
            {"role": "tool", "content": "\n".join(siblings)},
        ]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [_call("read_file", path=path)]},
        {"role": "tool", "content": fn.source},
    ]
    summary = _summary(fn.docstring or "") or f"It is a {len(fn.source.splitlines())}-line function."
    messages.append(
        {"role": "assistant", "content": f"`{fn.name}` is defined in `{path}` at line {fn.lineno}. {summary}"}
    )
    return messages


def build_conversations(files: list[SourceFile], count: int, seed: int) -> list[dict[str, Any]]:
    """`count` conversations {messages, tools|None} from functions of `files`, deterministic in seed."""
    rng = random.Random(seed)
    # spawn: workers must not inherit the parent's CUDA / OpenMP state
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1), mp_context=ctx) as pool:
        functions = [fn for fns in pool.map(extract_functions, files, chunksize=32) for fn in fns]
    rng.shuffle(functions)
    out: list[dict[str, Any]] = []
    makers = (explain_turn, complete_turn, fix_turn)
    for fn in functions:
        if len(out) >= count:
            break
        if rng.random() < 0.35:
            out.append({"messages": agent_episode(fn, rng), "tools": TOOLS})
            continue
        turns = rng.choice(makers)(fn, rng)
        if turns is None:
            continue
        if rng.random() < 0.6:
            turns = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}, *turns]
        out.append({"messages": turns, "tools": None})
    return out


@functools.cache
def _compiled_template() -> jinja2.Template:
    return compile_chat_template(chat_template())


def render(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
) -> str:
    """Render a conversation with the training recipe's chat template (the one it writes into the
    checkpoint's tokenizer_config.json), in the environment transformers uses."""
    return _compiled_template().render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
    )


ASSISTANT_SPAN = re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S)


def encode_conversations(
    tok: Tokenizer, conversations: list[dict[str, Any]]
) -> tuple[np.ndarray, np.ndarray]:
    """Token stream of rendered conversations (each followed by <|endoftext|>) and its loss mask
    (1 on assistant turns including their <|im_end|>, 0 elsewhere); int32 and uint8 arrays."""
    texts = [render(c["messages"], c["tools"], add_generation_prompt=False) for c in conversations]
    pad = tok.token_to_id(PAD)
    ids, mask = [], []
    for text, enc in zip(texts, tok.encode_batch(texts), strict=True):
        spans = [m.span(1) for m in ASSISTANT_SPAN.finditer(text)]
        keep = np.zeros(len(enc.ids), dtype=np.uint8)
        starts = np.array([o[0] for o in enc.offsets])
        for lo, hi in spans:
            keep[(starts >= lo) & (starts < hi)] = 1
        ids.append(np.array([*enc.ids, pad], dtype=np.int32))
        mask.append(np.append(keep, 0).astype(np.uint8))
    if not ids:
        return np.zeros(0, np.int32), np.zeros(0, np.uint8)
    return np.concatenate(ids), np.concatenate(mask)
