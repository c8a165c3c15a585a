"""Credentials never leave the store's code: URLs and command lines with passwords hidden."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url


def redact_url(url: str) -> str:
    """The URL with its password replaced by ***; safe to print."""
    try:
        return make_url(url.strip()).render_as_string(hide_password=True)
    except Exception:
        return "<malformed database URL>"


def redact_command_line(args: list[str]) -> list[str]:
    """Arguments with the password of any database URL in them (`URL` or `--opt=URL`) hidden."""
    out = []
    for arg in args:
        head, sep, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        if "://" in value and "@" in value:
            try:
                value = make_url(value).render_as_string(hide_password=True)
            except Exception:  # not a URL after all: keep the text, but never a password-like part
                value = value.split("://", 1)[0] + "://***"
        out.append(head + sep + value)
    return out


def redacted(url: URL) -> str:
    return url.render_as_string(hide_password=True)


