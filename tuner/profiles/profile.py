"""One GPU profile: the hardware limits and default problems of one card, read from a TOML file."""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from tuner.errors import TunerError
from tuner.dtypes import SPECS
from tuner.problem import BACKWARD, Problem


@dataclass(frozen=True)
class GpuProfile:
    """Limits and defaults of one GPU model (one file in profiles/)."""

    name: str
    display_name: str
    match: tuple[str, ...]
    compute_capability: tuple[int, int]
    nvcc_arch: str
    sm_count: int
    smem_per_block_optin: int
    smem_per_sm: int
    regs_per_sm: int
    regs_per_thread: int
    max_threads_per_block: int
    max_threads_per_sm: int
    l2_bytes: int
    peak_fp16_tflops: float
    peak_bf16_tflops: float
    mem_bandwidth_gbs: float
    default_problems: tuple[Problem, ...]
    # Tables and keys this module does not interpret (e.g. a search-space
    # section read by other modules), read-only.
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False, repr=False)
    source: Path | None = field(default=None, compare=False, repr=False)
    peak_fp8_tflops: float = 0.0  # dense FP8 (e4m3) tensor-core peak; 0: none (no FP8 tensor cores, e.g. A100)

    @property
    def arch(self) -> str:
        """'sm_90' style name of the compute capability (without the 'a' suffix)."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def templates(self) -> tuple[str, ...]:
        """Kernel templates `tuner search` uses by default, best first (profile key `templates`)."""
        return tuple(self.extra.get("templates", DEFAULT_TEMPLATES))

    def templates_for(self, kernel_pass: str) -> tuple[str, ...]:
        """The default templates of a pass, best first: `templates` (forward) or `backward_templates` (backward)."""
        if kernel_pass == BACKWARD:
            return tuple(self.extra.get("backward_templates", DEFAULT_BACKWARD_TEMPLATES))
        return self.templates

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak of a dtype's compute type (the dtype registry's: an FP8 KV cache's kernels
        compute in fp16, attn_decode/kv_fp8.h); e4m3's is the profile's optional peak_fp8_tflops."""
        s = SPECS.get(dtype)
        if s is None:
            raise TunerError(f"no peak figure for dtype {dtype!r} in GPU profile {self.name!r}")
        peak = getattr(self, s.compute.peak)
        if peak > 0 or s.compute.peak not in _OPTIONAL_FLOAT_FIELDS:
            return peak
        # Only the FP8 peak is optional in a profile (absent: 0, the card has none).
        raise TunerError(f"GPU profile {self.name!r} gives no FP8 peak ({s.compute.peak}; a card without FP8 "
                         "tensor cores has none)")

    def matches(self, device_name: str) -> bool:
        """Whether one of `match` is a whole-token, case-insensitive part of `device_name`."""
        return match_length(self, device_name) > 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict with the TOML schema's keys (problems as dicts)."""
        return {
            "name": self.name,
            "display_name": self.display_name,
            "match": list(self.match),
            "compute_capability": list(self.compute_capability),
            "nvcc_arch": self.nvcc_arch,
            "sm_count": self.sm_count,
            "smem_per_block_optin": self.smem_per_block_optin,
            "smem_per_sm": self.smem_per_sm,
            "regs_per_sm": self.regs_per_sm,
            "regs_per_thread": self.regs_per_thread,
            "max_threads_per_block": self.max_threads_per_block,
            "max_threads_per_sm": self.max_threads_per_sm,
            "l2_bytes": self.l2_bytes,
            "peak_fp16_tflops": self.peak_fp16_tflops,
            "peak_bf16_tflops": self.peak_bf16_tflops,
            "mem_bandwidth_gbs": self.mem_bandwidth_gbs,
            **({"peak_fp8_tflops": self.peak_fp8_tflops} if self.peak_fp8_tflops else {}),
            "problems": [p.to_dict() for p in self.default_problems],
        }


# ---------------------------------------------------------------- validation

# Scalar keys of a profile file and the type each must have. `int` excludes
# bool (TOML `true` is not a count); `float` accepts TOML integers too.
_INT_FIELDS = (
    "sm_count",
    "smem_per_block_optin",
    "smem_per_sm",
    "regs_per_sm",
    "regs_per_thread",
    "max_threads_per_block",
    "max_threads_per_sm",
    "l2_bytes",
)
_FLOAT_FIELDS = ("peak_fp16_tflops", "peak_bf16_tflops", "mem_bandwidth_gbs")
_OPTIONAL_FLOAT_FIELDS = ("peak_fp8_tflops",)  # absent: 0 (the card has none)
_STR_FIELDS = ("name", "display_name", "nvcc_arch")
REQUIRED_KEYS = (
    "name",
    "display_name",
    "match",
    "compute_capability",
    "nvcc_arch",
    *_INT_FIELDS,
    *_FLOAT_FIELDS,
    "problems",
)

_PROBLEM_REQUIRED = {
    "batch": int,
    "heads": int,
    "seq_q": int,
    "seq_k": int,
    "head_dim": int,
    "dtype": str,
    "causal": bool,
}
# "window": an integer the Problem checks (-1 is unbounded); float: a number the Problem checks (softcap 0: off)
_PROBLEM_OPTIONAL = {"heads_kv": int, "layout": str, "lengths": str, "window_left": "window", "window_right": "window",
                     "softcap": float, "kernel_pass": str}

DEFAULT_TEMPLATES = ("attn_fwd_mma",)  # for a profile that names no `templates`: runs on any sm_80+ card
DEFAULT_BACKWARD_TEMPLATES = ("attn_bwd_mma",)  # for one that names no `backward_templates`: any sm_80+ card
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_ARCH_RE = re.compile(r"^sm_(\d+)(a?)$")


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


class _Checker:
    """Collects the file name into every error message."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)

    def fail(self, key: str, message: str) -> TunerError:
        return TunerError(f"GPU profile {self.path}: field '{key}' {message}")

    def get(self, data: Mapping[str, Any], key: str, where: str = "") -> Any:
        if key not in data:
            raise self.fail(where + key, "is missing")
        return data[key]

    def integer(self, value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {_type_name(value)} {value!r}")
        if value < 1:
            raise self.fail(key, f"must be positive, got {value!r}")
        return value

    def number(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number, got {_type_name(value)} {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise self.fail(key, f"must be a positive finite number, got {value!r}")
        return float(value)

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {_type_name(value)} {value!r}")
        if not value.strip():
            raise self.fail(key, "must not be empty")
        return value


def _parse_problem(check: _Checker, index: int, table: Any) -> Problem:
    where = f"problems[{index}]"
    if not isinstance(table, dict):
        raise check.fail(where, f"must be a table, got {_type_name(table)}")
    unknown = sorted(set(table) - set(_PROBLEM_REQUIRED) - set(_PROBLEM_OPTIONAL))
    if unknown:
        raise check.fail(f"{where}.{unknown[0]}", "is not a problem key (expected "
                         + ", ".join([*_PROBLEM_REQUIRED, *_PROBLEM_OPTIONAL]) + ")")
    values: dict[str, Any] = {}
    for key, kind in (*_PROBLEM_REQUIRED.items(), *_PROBLEM_OPTIONAL.items()):
        if key not in table:
            if key in _PROBLEM_REQUIRED:
                raise check.fail(f"{where}.{key}", "is missing")
            continue
        value = table[key]
        full = f"{where}.{key}"
        if kind is int:
            values[key] = check.integer(value, full)
        elif kind == "window" or kind is float:
            if isinstance(value, bool) or not isinstance(value, int if kind == "window" else (int, float)):
                raise check.fail(full, f"must be {'an integer' if kind == 'window' else 'a number'}, got "
                                       f"{_type_name(value)} {value!r}")
            values[key] = value
        elif kind is bool:
            if not isinstance(value, bool):
                raise check.fail(full, f"must be a boolean, got {_type_name(value)} {value!r}")
            values[key] = value
        else:
            values[key] = check.string(value, full)
    try:
        return Problem(**values)
    except TunerError as exc:
        raise TunerError(f"GPU profile {check.path}: {where}: {exc}") from None


def profile_from_dict(data: Mapping[str, Any], path: Path | str = "<profile>") -> GpuProfile:
    """Validate a parsed profile table; errors name `path` and the field."""
    check = _Checker(path)
    values: dict[str, Any] = {}
    for key in _STR_FIELDS:
        values[key] = check.string(check.get(data, key), key)
    if not _NAME_RE.match(values["name"]):
        raise check.fail("name", f"must be lower-case letters, digits, '-' or '_', got {values['name']!r}")
    for key in _INT_FIELDS:
        values[key] = check.integer(check.get(data, key), key)
    for key in _FLOAT_FIELDS:
        values[key] = check.number(check.get(data, key), key)
    for key in _OPTIONAL_FLOAT_FIELDS:
        if key in data:
            values[key] = check.number(data[key], key)

    match = check.get(data, "match")
    if not isinstance(match, list) or not match:
        raise check.fail("match", f"must be a non-empty array of strings, got {_type_name(match)} {match!r}")
    values["match"] = tuple(check.string(m, f"match[{i}]") for i, m in enumerate(match))

    cc = check.get(data, "compute_capability")
    if (
        not isinstance(cc, list)
        or len(cc) != 2
        or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in cc)
    ):
        raise check.fail("compute_capability", f"must be an array of two integers [major, minor], got {cc!r}")
    values["compute_capability"] = (cc[0], cc[1])

    arch = _ARCH_RE.match(values["nvcc_arch"])
    if not arch:
        raise check.fail("nvcc_arch", f"must look like 'sm_90a' or 'sm_80', got {values['nvcc_arch']!r}")
    if int(arch.group(1)) != cc[0] * 10 + cc[1]:
        raise check.fail("nvcc_arch", f"{values['nvcc_arch']!r} disagrees with compute_capability {cc!r}")

    if values["smem_per_block_optin"] > values["smem_per_sm"]:
        raise check.fail("smem_per_block_optin", "must not exceed smem_per_sm")
    if values["max_threads_per_block"] > values["max_threads_per_sm"]:
        raise check.fail("max_threads_per_block", "must not exceed max_threads_per_sm")
    if values["regs_per_thread"] > values["regs_per_sm"]:
        raise check.fail("regs_per_thread", "must not exceed regs_per_sm")

    problems = check.get(data, "problems")
    if not isinstance(problems, list) or not problems:
        raise check.fail("problems", f"must be a non-empty array of tables ([[problems]]), got {_type_name(problems)}")
    values["default_problems"] = tuple(_parse_problem(check, i, t) for i, t in enumerate(problems))

    for key, default in (("templates", DEFAULT_TEMPLATES), ("backward_templates", DEFAULT_BACKWARD_TEMPLATES)):
        templates = data.get(key, list(default))
        if not isinstance(templates, list) or not templates or not all(isinstance(t, str) and t for t in templates):
            raise check.fail(key, f"must be a non-empty array of template names, got {templates!r}")

    known = set(REQUIRED_KEYS) | set(_OPTIONAL_FLOAT_FIELDS)
    values["extra"] = MappingProxyType({k: v for k, v in data.items() if k not in known})
    values["source"] = Path(path) if not str(path).startswith("<") else None
    return GpuProfile(**values)


def load_profile_file(path: str | Path) -> GpuProfile:
    """Load and validate one profile TOML file."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise TunerError(f"GPU profile {path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise TunerError(f"GPU profile {path}: invalid TOML: {exc}") from None
    return profile_from_dict(data, path)


def match_length(profile: GpuProfile, device_name: str) -> int:
    """Length of the longest `match` entry found in device_name as a whole token, else 0.

    A token boundary is any character that is not a letter or digit (or the
    ends of the string): "H100" is found in "NVIDIA H100 80GB HBM3" and
    "NVIDIA H100-SXM5", but not in "NVIDIA GH100X"; "L4" not in "NVIDIA L40S".
    """
    best = 0
    for pattern in profile.match:
        regex = r"(?<![A-Za-z0-9])" + re.escape(pattern.strip()) + r"(?![A-Za-z0-9])"
        if re.search(regex, device_name, flags=re.IGNORECASE):
            best = max(best, len(pattern.strip()))
    return best
