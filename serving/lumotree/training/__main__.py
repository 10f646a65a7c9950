"""`python -m lumotree.training`: train, evaluate or export the small model."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Annotated

import torch
import typer

from lumotree.model import ConfigError, load_checkpoint, save_checkpoint
from lumotree.training import corpus
from lumotree.training.pipeline import TOY_RECIPE, TOY_SETTINGS, Recipe, encode_files, run
from lumotree.training.train import TrainSettings, evaluate

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter("no CUDA device here")
    return torch.device(name)


@app.command("run")
def run_cmd(
    out: Annotated[
        Path, typer.Option(help="Checkpoint folder to write (config, safetensors, tokenizer, logs).")
    ],
    toy: Annotated[
        bool, typer.Option(help="Seconds-long rehearsal: stdlib only, tiny model, CPU-sized.")
    ] = False,
    train_seconds: Annotated[
        float | None, typer.Option(help="Wall-time budget of the training loop.")
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per optimizer step.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Tokens per training sequence.")] = None,
    max_corpus_mb: Annotated[float | None, typer.Option(help="Cap on training source text, MB.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Collect code, train the tokenizer and the model (with its MTP head), evaluate, write the checkpoint."""
    recipe, settings = (TOY_RECIPE, TOY_SETTINGS) if toy else (Recipe(), TrainSettings())
    changes = {"train_seconds": train_seconds, "batch_size": batch_size, "seq_len": seq_len}
    settings = dataclasses.replace(settings, **{k: v for k, v in changes.items() if v is not None})
    if max_corpus_mb is not None:
        recipe = dataclasses.replace(recipe, max_corpus_bytes=int(max_corpus_mb * 1e6))
    metrics = run(out, recipe, settings, _device(device), typer.echo)
    typer.echo(json.dumps({"heldout": metrics["heldout"], "wall_s": metrics["wall_s"]}))


@app.command("evaluate")
def evaluate_cmd(
    model: Annotated[Path, typer.Option(help="Checkpoint folder (with tokenizer.json).")],
    heldout_pct: Annotated[int, typer.Option(help="Held-out share by content hash, as in training.")] = 2,
    heldout_mb: Annotated[float, typer.Option(help="Held-out text to score, MB.")] = 4.0,
    windows: Annotated[int, typer.Option(help="Maximum scored windows.")] = 64,
    seq_len: Annotated[int, typer.Option(help="Tokens per scored window.")] = 2048,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Held-out loss and MTP agreement on this machine's held-out Python files (same filter and split)."""
    from tokenizers import Tokenizer

    try:
        lm = load_checkpoint(model, device=_device(device))
        tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    except (ConfigError, ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    files, _ = corpus.collect_sources()
    _, heldout = corpus.split_heldout(files, heldout_pct)
    stream = encode_files(tok, corpus.take_bytes(heldout, int(heldout_mb * 1e6)))
    typer.echo(json.dumps(evaluate(lm, stream, seq_len, windows, _device(device))))


@app.command("export")
def export_cmd(
    model: Annotated[Path, typer.Option(help="Checkpoint folder to read.")],
    out: Annotated[Path, typer.Option(help="Folder to write.")],
    fmt: Annotated[str, typer.Option("--format", help="qwen3_5_text or qwen3_next.")] = "qwen3_next",
    dense_mlp_as_moe: Annotated[
        bool, typer.Option(help="qwen3_next: write dense MLPs as exact one-expert MoE blocks.")
    ] = False,
) -> None:
    """Re-write a checkpoint in another layout (bf16), copying the tokenizer files."""
    if fmt not in ("qwen3_5_text", "qwen3_next"):
        raise typer.BadParameter(f"unknown format {fmt!r}")
    try:
        lm = load_checkpoint(model)
        save_checkpoint(lm, out, fmt=fmt, dense_mlp_as_moe=dense_mlp_as_moe)  # type: ignore[arg-type]
    except (ConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    for name in TOKENIZER_FILES:
        if (model / name).is_file():
            shutil.copy(model / name, out / name)
    typer.echo(f"wrote {out}")


if __name__ == "__main__":
    app()
