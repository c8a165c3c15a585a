"""Output folders of reports: created and checked before the work, OS errors as one line."""

from __future__ import annotations

import os
import re
import tempfile

from tuner.errors import TunerError


def os_error_text(exc: OSError, path: str) -> str:
    """One line: which path could not be written and the OS's reason."""
    where = exc.filename if isinstance(exc.filename, str) and exc.filename else path
    return f"cannot write to {where}: {exc.strerror or exc}"


def ensure_out_dir(path: str) -> None:
    """Create the output folder `path` and check a file can be written in it, or raise a one-line TunerError.

    Done before the (possibly long) work whose results go there, so they are not lost to a bad --out.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise TunerError(f"cannot write to {path}: it exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # running as root, os.access would always say yes
            pass
    except OSError as exc:
        raise TunerError(os_error_text(exc, path)) from None


def safe_file_name(text: str) -> str:
    """A file name made from text that may come from a store: letters, digits, '.', '_' and '-' only,
    never starting with a dot, so nothing read from a store can choose a path (../, /, ~)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".")
    return name or "_"
