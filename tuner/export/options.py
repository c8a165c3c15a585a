"""What `tuner export` is asked for, and what it reports back."""

from __future__ import annotations

import keyword
import re
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
    notes: list[str] = field(default_factory=list)  # what the export cleared up first (a killed export's folders)


# What a header's namespace (its name) cannot be: C++ keywords (the common ones; a compiler refuses the rest)
# and the namespaces the header itself uses (std, fc).
_CPP_KEYWORDS = frozenset(
    "alignas alignof and asm auto bool break case catch char class const constexpr continue decltype default "
    "delete do double else enum explicit export extern false float for friend goto if inline int long mutable "
    "namespace new noexcept not nullptr operator or private protected public register return short signed "
    "sizeof static struct switch template this throw true try typedef typename union unsigned using virtual "
    "void volatile while xor std fc".split())


def check_out_kind(out: Path) -> None:
    """--out must be a folder (or not exist yet): said first, before any name is derived from it."""
    if out.exists() and not out.is_dir():
        raise TunerError(f"{out} exists and is not a folder; pass a folder to --out")


def package_name(options: ExportOptions) -> str:
    """The package's import name (--name, else --out's folder name); for a header, its C++ namespace and file name
    (--name, else --out's folder name made an identifier: a header has no Python package)."""
    if options.format == "header":
        return _header_name(options)
    name = options.name or options.out.resolve().name.replace("-", "_")
    if not name.isidentifier() or keyword.iskeyword(name) or name in ("tuner", "torch", "numpy", "pycuda"):
        raise TunerError(f"package name {name!r} is not a usable Python identifier; pass --name")
    return name


def _header_name(options: ExportOptions) -> str:
    if options.name is not None:
        name = options.name
    else:  # --out my-kernels.h -> my_kernels (written as my-kernels.h/my_kernels.h)
        stem = re.sub(r"\.(h|hpp)$", "", options.out.resolve().name)
        name = re.sub(r"[^0-9A-Za-z_]", "_", stem)
        name = f"h_{name}" if name[:1].isdigit() else name
    if not re.fullmatch(r"[A-Za-z_][0-9A-Za-z_]*", name) or name in _CPP_KEYWORDS:
        raise TunerError(f"header name {name!r} is not a usable C++ identifier (its namespace and file name); "
                         "pass --name")
    return name
