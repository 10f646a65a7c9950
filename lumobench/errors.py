"""User-fixable errors and their one-line CLI rendering."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer


class LumobenchError(Exception):
    """A mistake the user can fix (bad input, missing file, busy port): shown as one line, no traceback."""


@contextmanager
def user_errors(exit_code: int = 2) -> Iterator[None]:
    """Turn a `LumobenchError` raised inside the block into `error: ...` on stderr and a non-zero exit."""
    try:
        yield
    except LumobenchError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(exit_code) from None
