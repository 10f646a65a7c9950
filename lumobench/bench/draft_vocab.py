"""Held-out acceptance of draft vocabularies on the CPU engine (`lumotree/drafting/draft_vocab.py`).

    lumobench bench draft-vocab --out results/cpu/draft-vocab     (or python -m lumobench.bench.draft_vocab)

The corpus's records split into a build half (even positions) and an evaluation half (odd). The
build half's prompt tokens and the model's own greedy AR output tokens on it are counted; each
--size keeps the most frequent ids (and EOS) as a draft vocabulary, written as dv-<size>.json.
Then `lumobench bench engine` runs the evaluation half, greedy, with the MTP-5 and tree arms for
the whole vocabulary and for each draft vocabulary side by side, under each --kernels set
(default: the native CPU forward and the PyTorch one), and this adds each vocabulary's coverage of
the evaluation half's AR output tokens. Writes engine.json (the bench's own result) and summary.json.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from lumobench.bench.engine import engine_command, load_requests, timed_request
from lumotree.drafting.draft_vocab import most_frequent, save_draft_vocab
from lumotree.engine import EngineConfig, GenerationRequest, LLMEngine
from lumotree.model import default_model_path

DEFAULT_CORPUS = Path("corpora/demo-greedy.jsonl")
DEFAULT_SIZES = "256,512,1024"


def ar_outputs(engine: LLMEngine, requests: list[GenerationRequest]) -> list[list[int]]:
    """The engine's greedy AR tokens for each request."""
    return [timed_request(engine, req)[0] for req in requests]


def draft_vocab_command(
    out: Annotated[Path, typer.Option(help="Folder for the vocabularies, engine.json and summary.json.")],
    corpus: Annotated[Path, typer.Option(help="Request corpus (JSONL).")] = DEFAULT_CORPUS,
    sizes: Annotated[str, typer.Option(help="Draft vocabulary sizes, comma-separated.")] = DEFAULT_SIZES,
    model: Annotated[Path | None, typer.Option(help="Checkpoint folder (default: the shipped one).")] = None,
    kernels: Annotated[
        list[str] | None, typer.Option(help="CPU kernel sets to run the arms under (repeatable).")
    ] = None,
) -> None:
    """Build draft vocabularies on half a corpus and measure acceptance on the other half."""
    folder = model or default_model_path()
    if not corpus.is_file():
        typer.echo(f"error: no corpus at {corpus}", err=True)
        raise typer.Exit(2)
    try:
        wanted = sorted({int(s) for s in sizes.split(",") if s.strip()})
    except ValueError:
        typer.echo(f"error: --sizes takes comma-separated integers, got {sizes!r}", err=True)
        raise typer.Exit(2) from None
    out.mkdir(parents=True, exist_ok=True)
    lines = [line for line in corpus.read_text().splitlines() if line.strip()]
    halves = {"build": lines[0::2], "eval": lines[1::2]}
    with tempfile.TemporaryDirectory(prefix="draft-vocab-") as tmp:  # the halves, re-made from the corpus
        split = Path(tmp)
        for name, part in halves.items():
            (split / f"{name}.jsonl").write_text("\n".join(part) + "\n")
        requests = {n: load_requests(split / f"{n}.jsonl", folder, None, greedy=True) for n in halves}
        engine = LLMEngine(EngineConfig(model=folder, drafter="ar", prefix_cache=False))
        outputs = {name: ar_outputs(engine, reqs) for name, reqs in requests.items()}
        counts: Counter[int] = Counter()
        for req, tokens in zip(requests["build"], outputs["build"], strict=True):
            counts.update(req.prompt_token_ids)
            counts.update(tokens)
        held_out = Counter(t for tokens in outputs["eval"] for t in tokens)
        held_out_total = max(sum(held_out.values()), 1)
        vocab = engine.model.config.vocab_size
        coverage: dict[int, float] = {}
        paths = []
        for size in wanted:
            ids = most_frequent(counts, min(size, vocab), engine.eos_token_ids)
            path = out / f"dv-{size}.json"
            save_draft_vocab(path, ids, vocab, f"{corpus.name} build half: prompts and greedy AR outputs")
            inside = set(ids)
            coverage[size] = sum(n for t, n in held_out.items() if t in inside) / held_out_total
            paths.append(str(path))
        engine_command(
            corpus=split / "eval.jsonl", out=out / "engine.json", runs=1, max_tokens=None, greedy=True,
            model=folder, kernels=kernels or ["cpu-native", "cpu-fast"], tree_shape=None,
            draft_vocab=["none", *paths],
        )  # fmt: skip
    result = json.loads((out / "engine.json").read_text())
    arms = [
        {"arm": a["arm"], "kernels": a["kernels"], "draft_vocab": a["draft_vocab"],
         "accepted_per_event": a["accepted_per_event"], "tokens_per_s": a["pooled_tokens_per_s"],
         "speedup_vs_ar": a["speedup_vs_ar"], "drafter_ms": a["span_ms_per_cycle"].get("drafter")}
        for a in result["arms"]
    ]  # fmt: skip
    summary = {
        "command": f"lumobench bench draft-vocab --out {out} --corpus {corpus} --sizes {sizes}"
        + "".join(f" --kernels {k}" for k in kernels or []),
        "build_requests": len(requests["build"]),
        "eval_requests": len(requests["eval"]),
        "distinct_build_tokens": len(counts),
        "vocab_size": vocab,
        "eval_output_coverage": coverage,
        "same_output_requests": result["same_output_requests"],
        "arms": arms,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for size, share in coverage.items():
        typer.echo(f"dv-{size}: {share:.1%} of the evaluation half's AR output tokens")


if __name__ == "__main__":
    typer.run(draft_vocab_command)
