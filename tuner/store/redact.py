"""Credentials never leave the store's code: URLs, messages and command lines with secrets hidden.

A password can sit in a URL's userinfo (postgresql://u:SECRET@host/db) or in
its query (?password=SECRET, ?sslpassword=SECRET, as libpq and SQLAlchemy
accept); both are hidden everywhere a URL or a driver's message is shown or
stored.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import URL, make_url

SECRET_KEYS = ("password", "sslpassword")  # libpq connection keywords whose values are secrets
_SECRET_QUERY = re.compile(r"(?i)\b(" + "|".join(SECRET_KEYS) + r")=([^&\s'\";]*)")
_USERINFO = re.compile(r"(://[^/:@\s]*):([^@\s]*)@")


def redact_text(text: str) -> str:
    """`text` with anything shaped like a URL password or a password=... keyword hidden."""
    return _USERINFO.sub(r"\1:***@", _SECRET_QUERY.sub(r"\1=***", text))


def secrets_of(url: URL) -> list[str]:
    """The secret values a URL carries (its password and secret query parameters)."""
    found = [str(url.password)] if url.password else []
    for key, value in url.query.items():
        if key.lower() in SECRET_KEYS:
            found += [value] if isinstance(value, str) else list(value)
    return [s for s in found if s]


def redacted(url: URL) -> str:
    """The URL rendered with every secret replaced by ***."""
    hidden = url.update_query_dict({k: "***" for k in url.query if k.lower() in SECRET_KEYS})
    return hidden.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def redact_url(url: str) -> str:
    """The URL with its secrets replaced by ***; safe to print."""
    try:
        return redacted(make_url(url.strip()))
    except Exception:
        return "<malformed database URL>"


def redact_command_line(args: list[str]) -> list[str]:
    """Arguments with every secret of a database URL or connection keyword in them hidden."""
    return [redact_text(arg) for arg in args]
