"""The access log without secrets: values of query parameters whose names say key, token, secret,
password, credential, signature or auth (`?api_key=...`, `&access_token=...`) are written as `***`.

Clients that cannot send headers put keys in the URL; the access log must not keep them, whether the
request was served or refused.
"""

from __future__ import annotations

import logging
import re

MASK = "***"
_SECRET_WORDS = frozenset(
    {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH", "SIG"}
    | {"SIGNATURE"}
)
_PARAM = re.compile(r"(?P<name>[^&=;]*)=(?P<value>[^&;]*)")


def _secret_name(name: str) -> bool:
    return any(part in _SECRET_WORDS for part in re.split(r"[^A-Z0-9]+", name.upper()))


def mask_query(path: str) -> str:
    """`path` with the values of secret-named query parameters replaced by MASK."""
    head, sep, query = path.partition("?")
    if not sep:
        return path
    masked = _PARAM.sub(lambda m: f"{m['name']}={MASK}" if _secret_name(m["name"]) else m[0], query)
    return f"{head}?{masked}"


class SecretQueryFilter(logging.Filter):
    """Masks the path argument of uvicorn's access records ("%s - "%s %s HTTP/%s" %d")."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], mask_query(args[2]), *args[3:])
        return True


def install() -> None:
    """Mask secrets in uvicorn's access log (call once uvicorn has configured its loggers)."""
    logging.getLogger("uvicorn.access").addFilter(SecretQueryFilter())
