"""`lumobench corpus check|freeze|stats` (`corpus_app`; other commands may be added to it)."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from lumobench.corpus import TextPart, check_corpus, load_corpus
from lumobench.errors import user_errors
from lumobench.manifest import freeze_manifest, write_manifest

corpus_app = typer.Typer(help="Validate, freeze and describe request corpora (JSONL).", no_args_is_help=True)

CorpusFile = Annotated[Path, typer.Argument(help="Corpus file (JSONL, one request per line).")]


@corpus_app.command("check")
def check(file: CorpusFile) -> None:
    """Validate every record; report each bad one with its line number and field."""
    with user_errors():
        records, issues = check_corpus(file)
    for issue in issues:
        typer.echo(f"{file}:{issue}", err=True)
    if issues:
        typer.secho(f"{len(issues)} problem(s) in {file}; {len(records)} valid record(s)", err=True, fg="red")
        raise typer.Exit(1)
    typer.echo(f"{file}: {len(records)} records, all valid")


@corpus_app.command("freeze")
def freeze(
    file: CorpusFile,
    out: Annotated[Path, typer.Option("--out", help="Manifest to write, e.g. manifests/NAME.json.")],
) -> None:
    """Freeze a manifest: the corpus sha256 and each record's canonical-JSON sha256 (rule: all records)."""
    with user_errors():
        records = load_corpus(file)
        write_manifest(freeze_manifest(file, records), out)
    typer.echo(f"froze {len(records)} records of {file} into {out}")


def _content_chars(content: str | list[TextPart] | None) -> int:
    """Characters of a message's content: a string, or the texts of its content parts."""
    if isinstance(content, str):
        return len(content)
    return sum(len(part.text) for part in content or ())


def _dist(values: list[int]) -> str:
    if not values:
        return "–"
    return f"{min(values)} / {int(statistics.median(values))} / {max(values)}"


@corpus_app.command("stats")
def stats(file: CorpusFile) -> None:
    """Describe a corpus: sizes, tools, tool calls in histories, sampling settings, sources."""
    with user_errors():
        records = load_corpus(file)
    chars = [sum(_content_chars(m.content) for m in r.messages) for r in records]
    calls = [sum(len(m.tool_calls or ()) for m in r.messages) for r in records]
    sampling = Counter(
        ", ".join(f"{k}={v}" for k, v in r.sampling().items() if k not in ("max_tokens", "seed"))
        or "server defaults"
        for r in records
    )
    table = Table(title=f"{file}: {len(records)} records", show_header=False)
    table.add_row(
        "with tools / without", f"{sum(bool(r.tools) for r in records)} / {sum(not r.tools for r in records)}"
    )
    table.add_row("messages (min / median / max)", _dist([len(r.messages) for r in records]))
    table.add_row("message characters (min / median / max)", _dist(chars))
    table.add_row("tool calls in history (min / median / max)", _dist(calls))
    table.add_row("max_tokens (min / median / max)", _dist([r.max_tokens for r in records if r.max_tokens]))
    table.add_row("records with input_ids", str(sum(r.input_ids is not None for r in records)))
    table.add_row("records with a seed", str(sum(r.seed is not None for r in records)))
    for setting, count in sampling.most_common():
        table.add_row(f"sampling ({count} records)", setting)
    sources = Counter((r.source.task if r.source else None) or "–" for r in records)
    table.add_row("source tasks", ", ".join(f"{t} ({n})" for t, n in sources.most_common()))
    Console().print(table)
