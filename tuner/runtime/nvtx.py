"""NVTX ranges around measured work, and the ncu filter expression that selects one.

A range is named `<prefix>/<variant or baseline name>/<phase>`, where the
prefix says which run and trial it belongs to (e.g. `run3/trial17`), so a
timeline (nsys) or a profiler filter (ncu) finds one trial's kernels by name.

The `nvtx` package is optional (the `gpu` extra): without it, ranges are
no-ops, so that the tuner still works on a machine without it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

_state: dict[str, object] = {}


def range_name(prefix: str | None, subject: str, phase: str) -> str:
    """`<prefix>/<subject>/<phase>`, or `<subject>/<phase>` without a prefix."""
    parts = [p.strip("/") for p in (prefix or "", subject, phase)]
    return "/".join(p for p in parts if p)


def nvtx_available() -> bool:
    if "module" not in _state:
        try:
            import nvtx

            _state["module"] = nvtx
        except ImportError:
            _state["module"] = None
    return _state["module"] is not None


@contextlib.contextmanager
def annotate(name: str) -> Iterator[None]:
    """A push/pop NVTX range in the default domain (a no-op without the nvtx package)."""
    if not nvtx_available():
        yield
        return
    nvtx = _state["module"]
    with nvtx.annotate(name):  # type: ignore[attr-defined]
        yield


def ncu_include(name: str) -> str:
    """The `--nvtx-include` expression matching kernels inside the push/pop range `name`.

    In ncu's filter syntax `/` separates nested push/pop ranges and a trailing
    `/` marks a push/pop range, so the slashes inside our range names are
    escaped (checked with ncu 2025.3: `a\\/b\\/c/` matches the range `a/b/c`,
    `a/b/c/` only matches three nested ranges).
    """
    if "@" in name:
        raise ValueError(f"NVTX range name {name!r} must not contain '@' (ncu's domain separator)")
    return name.replace("\\", "\\\\").replace("/", "\\/") + "/"
