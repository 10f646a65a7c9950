"""Typer sub-apps and commands of the `lumobench` CLI, one module per noun or verb."""
