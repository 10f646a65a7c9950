"""Keeping secrets out of everything the harness writes: run.json, rows, metric snapshots, server logs.

Secrets are recognised by where they stand: the value of an environment variable, or the argument of a
command-line flag (`--api-key K`, `--hf-token=K`), whose name says key, token, secret, password,
credential or auth; the password of a URL (`http://user:PASSWORD@host`); in command lines, the value of
a URL query parameter so named (`?api_key=KEY`); and the API key replay sends.
Those positions are masked wherever they are written, and every secret value of at least
`MIN_TEXT_SECRET` characters is also masked wherever else it appears (a server echoing its arguments
into its log, an error message quoting a header). Shorter values ("1", "true") are flags, not
credentials, and are masked only in their own position.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lumobench.arms import ResolvedArm

MASK = "***"
MIN_TEXT_SECRET = 8
_SECRET_WORDS = frozenset(
    {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH"}
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*:)(?P<password>[^@/\s]+)(?=@)")
_QUERY_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[^=&;#\s]+)=)(?P<value>[^&;#\s]+)")


def looks_secret(name: str) -> bool:
    """True for names like OPENAI_API_KEY, HF_TOKEN, --api-key, db-password (not --tokenizer, max_tokens)."""
    return any(part in _SECRET_WORDS for part in re.split(r"[^A-Z0-9]+", name.upper()))


def _flag_secrets(argv: Sequence[str]) -> Iterable[tuple[int, str]]:
    """(index, secret) for each flag argument that looks secret; the index is the element holding it."""
    for i, arg in enumerate(argv):
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.partition("=")
        if not looks_secret(name):
            continue
        if eq:
            yield i, value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            yield i + 1, argv[i + 1]


@dataclass
class Redactor:
    """The secret values of one run, and the masking of them in whatever is written."""

    secrets: set[str] = field(default_factory=set)

    @classmethod
    def for_launch(
        cls, argv: Sequence[str] = (), env: Mapping[str, str] | None = None, api_key: str | None = None
    ) -> Redactor:
        """The secrets of a command line, its environment variables and the API key sent to the server."""
        env = env or {}
        found = {value for _, value in _flag_secrets(argv)}
        found |= {value for name, value in env.items() if looks_secret(name)}
        found |= {
            m.group("password") for text in (*argv, *env.values()) for m in _URL_PASSWORD.finditer(text)
        }
        if api_key:
            found.add(api_key)
        return cls({s for s in found if s})

    @classmethod
    def for_arm(cls, arm: ResolvedArm) -> Redactor:
        """The secrets of a launched arm: its environment, its command line and its API key."""
        return cls.for_launch(arm.argv, arm.env, arm.api_key)

    def __or__(self, other: Redactor) -> Redactor:
        return Redactor(self.secrets | other.secrets)

    @property
    def masks_text(self) -> bool:
        """Whether free text (a server log) needs scanning at all."""
        return any(len(s) >= MIN_TEXT_SECRET for s in self.secrets)

    def text(self, text: str) -> str:
        """`text` with URL passwords and every long-enough secret value replaced by MASK."""
        text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
        for secret in sorted(self.secrets, key=len, reverse=True):
            if len(secret) >= MIN_TEXT_SECRET:
                text = text.replace(secret, MASK)
        return text

    def raw(self, data: bytes) -> bytes:
        """`text` for raw log output (secrets matched as UTF-8)."""
        for secret in sorted(self.secrets, key=len, reverse=True):
            if len(secret) >= MIN_TEXT_SECRET:
                data = data.replace(secret.encode(), MASK.encode())
        return data

    def argv(self, argv: Sequence[str]) -> list[str]:
        """A command line with each secret flag argument masked (then `text` on every element)."""
        out = list(argv)
        for i, value in _flag_secrets(argv):
            out[i] = out[i][: len(out[i]) - len(value)] + MASK
        return [self.url(arg) for arg in out]

    def url(self, text: str) -> str:
        """`text` with the values of secret-named URL query parameters masked too (only where a URL is
        expected: elsewhere `?token=` may be a model's output)."""
        return _QUERY_PARAM.sub(
            lambda m: m["head"] + MASK if looks_secret(m["name"]) else m[0], self.text(text)
        )

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Environment variables with the values of secret-looking names masked."""
        return {k: MASK if looks_secret(k) and v else self.text(v) for k, v in env.items()}

    def value(self, value: Any) -> Any:
        """`text` applied to every string of a JSON-like value (dicts, lists, scalars)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value
