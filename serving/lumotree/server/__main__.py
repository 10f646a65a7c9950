"""`python -m lumotree.server`: serve one model with the LumoTree engine over HTTP (uvicorn)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from lumotree.engine import DRAFTER_KINDS, EngineConfig, EngineProcess
from lumotree.model import default_model_path
from lumotree.server import access_log, memory
from lumotree.server.app import create_app
from lumotree.server.context import ServingContext
from lumotree.server.guards import DEFAULT_MAX_BODY_BYTES, default_allowed_hosts
from lumotree.server.metrics import render_metrics

log = logging.getLogger("lumotree.server")
app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def serve(
    model: Annotated[
        Path | None, typer.Option(help="Checkpoint folder (default: the shipped lumo-tiny-coder).")
    ] = None,
    drafter: Annotated[
        str, typer.Option(help="tree (LumoTree), mtp (chain MTP) or ar (no drafts).")
    ] = "tree",
    mtp_depth: Annotated[
        int, typer.Option(help="MTP drafting passes (the chain length for --drafter mtp).")
    ] = 5,
    tree_shape: Annotated[
        str,
        typer.Option(
            help="The tree of --drafter tree: paper (28 rows: 5-depth MTP spine, 2 siblings, suffix "
            "tail 6, rescues 4 and 2), compact (9 rows: spine 2, tail 4, rescue 2), small (7 rows: "
            "compact without the rescue), medium (13 rows: spine 3, 1 sibling, tail 4, rescue 2) or "
            "auto (on the native CPU forward, where each row costs, the shape measured fastest for "
            "its ISA path; else paper)."
        ),
    ] = "auto",
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="LUMOTREE_API_KEY", help="Require 'Authorization: Bearer KEY' on generation routes."
        ),
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="The model name clients send (default: the folder name).")
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            min=2,
            envvar="LUMOTREE_MAX_MODEL_LEN",
            help="Prompt + output tokens per request (default: the model's).",
        ),
    ] = None,
    dtype: Annotated[
        str,
        typer.Option(help="Weights and activations: float32, bfloat16 or float64 (GDN state stays float32)."),
    ] = "float32",
    device: Annotated[
        str, typer.Option(help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N.")
    ] = "auto",
    kernels: Annotated[
        str,
        typer.Option(
            help="auto (triton on CUDA, cpu-native on a CPU: cpu-fast where it cannot build), "
            "cpu-native (the native C forward), cpu-fast (PyTorch), reference or triton."
        ),
    ] = "auto",
    eager: Annotated[
        bool, typer.Option("--eager", help="No CUDA graphs on the GPU (debugging; slower).")
    ] = False,
    random_weights: Annotated[
        str | None,
        typer.Option(
            envvar="LUMOTREE_RANDOM_WEIGHTS",
            help="Serve a random-weight model of a shape preset (e.g. qwen3.5-27b) built on the device "
            "instead of --model's weights (its tokenizer is still used): for speed work.",
        ),
    ] = None,
    forced_acceptance: Annotated[
        str | None,
        typer.Option(
            envvar="LUMOTREE_FORCED_ACCEPTANCE",
            help="Speed work only: every drafting cycle accepts a spine prefix of lengths from this "
            "schedule instead of the walk's ('paper': 4.05 accepted drafts a tree cycle, 3.17 a chain "
            "cycle; a mean like 3.4; counts like 0,4,5; hist:FILE.json), so a random-weight model "
            "publishes realistic paths. Outputs are then not the model's. Ignored with --drafter ar.",
        ),
    ] = None,
    tree_drafting: Annotated[
        str,
        typer.Option(
            envvar="LUMOTREE_TREE_DRAFTING",
            help="On the GPU, where the tree's next topology is drafted: device (inside the cycle, "
            "so the next cycle starts before the host reads the results) or host (between two "
            "cycles; for A/B timing). The same trees either way.",
        ),
    ] = "device",
    draft_vocab: Annotated[
        Path | None,
        typer.Option(
            envvar="LUMOTREE_DRAFT_VOCAB",
            help="A draft vocabulary file (python -m lumotree.drafting.draft_vocab): MTP drafts come "
            "from its token ids only, each drafting pass reading those rows of the vocabulary "
            "projection; outputs are unchanged (verification scores every token).",
        ),
    ] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch threads of the engine.")] = 1,
    seed: Annotated[
        int | None, typer.Option(help="Seed for the seeds of requests that bring none (default: random).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    max_request_bytes: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Largest request body in bytes, 413 beyond (0: no byte limit); default: what a request "
            f"at the full context can need, at most {DEFAULT_MAX_BODY_BYTES}. Prompts longer than the "
            "context and bodies of more JSON values than it can hold are refused before any work, "
            "whatever this limit.",
        ),
    ] = None,
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated Host header names to answer ('*' any, '*.example.org' a domain); "
            "default: loopback names when bound to loopback (against DNS rebinding), else any."
        ),
    ] = None,
) -> None:
    """Serve the OpenAI-compatible API (/v1/chat/completions, /v1/completions), SGLang's /generate,
    /v1/models, /health and /metrics (vLLM metric names) with the LumoTree engine."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    memory.limit_arenas()  # before the engine and tokenizer threads start: one heap each kept memory
    if drafter not in DRAFTER_KINDS:
        raise typer.BadParameter(f"must be one of {', '.join(DRAFTER_KINDS)}", param_hint="--drafter")
    try:
        folder = model or default_model_path()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"no checkpoint at {folder} (config.json missing)")
        config = EngineConfig(
            model=folder, drafter=drafter, mtp_depth=mtp_depth, max_model_len=max_model_len,  # type: ignore[arg-type]
            dtype=dtype, threads=threads, seed=seed, device=device, kernels=kernels,  # type: ignore[arg-type]
            eager=eager, random_weights=random_weights, tree_shape=tree_shape,  # type: ignore[arg-type]
            draft_vocab=draft_vocab, forced_acceptance=forced_acceptance,
            tree_drafting=tree_drafting,  # type: ignore[arg-type]
        )  # fmt: skip
        engine = EngineProcess(config, logging.getLevelName(log_level.upper()))
    except (FileNotFoundError, ValueError, TimeoutError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    ctx = ServingContext.for_model(
        engine,
        engine.tokenizer_path,
        engine.max_model_len,
        served_model_name,
        api_key,
        config=dataclasses.asdict(config),
    )
    ctx.engine_info = engine.info()
    log.info(
        "engine: %s",
        ", ".join(f"{k} {v}" for k, v in ctx.engine_info.items() if v is not None),
    )
    log.info(
        "serving %s as %r: drafter %s (%d rows), max_model_len %d, dtype %s, device %s (%s kernels%s), "
        "engine process %s, on http://%s:%d%s%s",
        random_weights or folder, ctx.model_name, drafter, engine.geometry.rows, engine.max_model_len, dtype,
        engine.device, engine.kernels, ", eager" if eager else "", engine.pid, host, port,
        " (API key required)" if api_key else "",
        f"; FORCED ACCEPTANCE {forced_acceptance!r}, outputs not the model's"
        if forced_acceptance and drafter != "ar"
        else "",
    )  # fmt: skip
    limits = ctx.limits
    log.info(
        "request bodies up to %s bytes and %d JSON values; prompt texts up to %d characters are tokenized",
        limits.body_bytes if max_request_bytes is None else max_request_bytes or "any number of",
        limits.body_values, limits.max_model_len * limits.max_token_bytes,
    )  # fmt: skip
    hosts = [h.strip() for h in allowed_hosts.split(",") if h.strip()] if allowed_hosts else None
    http = create_app(
        ctx,
        lambda: render_metrics(engine.metrics(), ctx.model_name),
        allowed_hosts=hosts or default_allowed_hosts(host),
        max_body_bytes="context" if max_request_bytes is None else max_request_bytes or None,
    )
    server = uvicorn.Server(
        uvicorn.Config(http, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    )
    access_log.install()  # after uvicorn configured its loggers
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
    finally:
        engine.shutdown()
    if not server.started:  # the address could not be bound (uvicorn logged why), as uvicorn.run exits
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
