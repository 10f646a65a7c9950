"""How a command ends: a user-fixable error as one line (`user_errors`), a signal as Ctrl-C
(`interrupt_on_signals`)."""

from __future__ import annotations

import signal
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


def interrupt_on_signals() -> None:
    """Ctrl-C, SIGTERM and SIGHUP (a closed terminal or ssh session) raise KeyboardInterrupt, so
    `finally` blocks stop launched servers and agents, and run files say "interrupted".

    SIGINT is set explicitly because a process started in the background by a non-interactive shell
    inherits it ignored.
    """

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)
