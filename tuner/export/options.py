"""What `tuner export` is asked for, and what it reports back."""

from __future__ import annotations

import keyword
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tuner.errors import TunerError
from tuner.problem import Problem

FORMATS = ("package", "header")
PACKAGE_VERSION = "0.1.0"


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    gpu: str  # GPU profile name (h100, h200, ...)
    out: Path
    shapes: tuple[str, ...] = ()  # "B,H,S,D" / "B,H,Sq,Sk,D"; empty: every tuned problem
    dtype: Optional[str] = None
    name: Optional[str] = None  # Python package name; default: the out folder's name
    format: str = "package"
    allow_rebuild: bool = False  # accept a rebuilt cubin that differs from the one the search measured
    force: bool = False  # write into a non-empty out folder, replacing an earlier export there (nothing else)
    db_url: Optional[str] = None
    check: bool = False  # measure every dispatch cell on this GPU against SDPA and route the losing ones (package)
    # --model: exactly these problems' trials (shape, dtype, causality, K/V heads, window, softcap; any K/V layout)
    model_problems: tuple[Problem, ...] = ()


@dataclass(frozen=True)
class ExportReport:
    out: Path
    format: str
    package: str
    entries: list[dict[str, Any]]
    kernels: int
    files: list[Path] = field(default_factory=list)
    checked: list[dict[str, Any]] = field(default_factory=list)  # measured cells (--check)


def package_name(options: ExportOptions) -> str:
    name = options.name or options.out.resolve().name.replace("-", "_")
    if not name.isidentifier() or keyword.iskeyword(name) or name in ("tuner", "torch", "numpy", "pycuda"):
        raise TunerError(f"package name {name!r} is not a usable Python identifier; pass --name")
    return name
