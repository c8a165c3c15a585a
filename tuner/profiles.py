"""GPU profiles: the hardware limits and default problems of one card.

A profile is a TOML file in profiles/ (shipped in the wheel as
tuner/_assets/profiles). Hardware limits live there, never as constants in
code. This module loads and validates profiles, detects the GPU present
(through torch.cuda, lazily imported) and picks the profile for it.
"""

from __future__ import annotations

import math
import re
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from tuner.errors import NoGpuError, TunerError
from tuner.problem import Problem
from tuner.assets import asset_dir

__all__ = [
    "DetectedGpu",
    "GpuProfile",
    "detect_gpu",
    "list_profiles",
    "load_profile",
    "load_profile_file",
    "profile_names",
    "resolve_profile",
]

AUTO = "auto"


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

    @property
    def arch(self) -> str:
        """'sm_90' style name of the compute capability (without the 'a' suffix)."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def templates(self) -> tuple[str, ...]:
        """Kernel templates `tuner search` uses by default, best first (profile key `templates`)."""
        return tuple(self.extra.get("templates", DEFAULT_TEMPLATES))

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak for 'fp16' or 'bf16'."""
        if dtype == "fp16":
            return self.peak_fp16_tflops
        if dtype == "bf16":
            return self.peak_bf16_tflops
        raise TunerError(f"no peak figure for dtype {dtype!r} in GPU profile {self.name!r}")

    def matches(self, device_name: str) -> bool:
        """Whether one of `match` is a whole-token, case-insensitive part of `device_name`."""
        return _match_length(self, device_name) > 0

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
            "problems": [
                {
                    "batch": p.batch,
                    "heads": p.heads,
                    "heads_kv": p.heads_kv,
                    "seq_q": p.seq_q,
                    "seq_k": p.seq_k,
                    "head_dim": p.head_dim,
                    "dtype": p.dtype,
                    "causal": p.causal,
                    "layout": p.layout,
                }
                for p in self.default_problems
            ],
        }


@dataclass(frozen=True)
class DetectedGpu:
    """What torch.cuda reports about one device."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    total_memory_bytes: int | None = None
    uuid: str | None = None

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def describe(self) -> str:
        return f"{self.name} ({self.arch}, {self.sm_count} SMs)"


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
_PROBLEM_OPTIONAL = {"heads_kv": int, "layout": str}

DEFAULT_TEMPLATES = ("attn_fwd_mma",)  # for a profile that names no `templates`: runs on any sm_80+ card
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

    templates = data.get("templates", list(DEFAULT_TEMPLATES))
    if not isinstance(templates, list) or not templates or not all(isinstance(t, str) and t for t in templates):
        raise check.fail("templates", f"must be a non-empty array of template names, got {templates!r}")

    known = set(REQUIRED_KEYS)
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


# ----------------------------------------------------------- shipped profiles


def _profiles_dir() -> Path:
    return asset_dir("profiles")


def profile_names() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(p.stem for p in _profiles_dir().glob("*.toml"))


def load_profile(name: str) -> GpuProfile:
    """Load a shipped profile by name ('h100', 'a100', ...)."""
    known = profile_names()
    key = name.strip().lower()
    if key not in known:
        raise TunerError(f"unknown GPU profile {name!r}; known: {', '.join(known)}")
    path = _profiles_dir() / f"{key}.toml"
    profile = load_profile_file(path)
    if profile.name != key:
        raise TunerError(f"GPU profile {path}: field 'name' is {profile.name!r} but the file is {key}.toml")
    return profile


def list_profiles() -> list[GpuProfile]:
    """Every shipped profile, sorted by name."""
    return [load_profile(n) for n in profile_names()]


# ------------------------------------------------------------------ detection


def _match_length(profile: GpuProfile, device_name: str) -> int:
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


def detect_gpu(device: int = 0) -> DetectedGpu | None:
    """The CUDA device `device` as torch sees it, or None without a usable GPU."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    try:
        if not torch.cuda.is_available():
            return None
        count = torch.cuda.device_count()
        if device < 0 or device >= count:
            raise TunerError(f"CUDA device {device} does not exist; this machine has {count}")
        props = torch.cuda.get_device_properties(device)
    except TunerError:
        raise
    except Exception as exc:  # broken driver, CUDA init failure
        raise NoGpuError(f"CUDA is present but unusable: {exc}") from exc
    uuid = getattr(props, "uuid", None)
    return DetectedGpu(
        index=device,
        name=props.name,
        compute_capability=(int(props.major), int(props.minor)),
        sm_count=int(props.multi_processor_count),
        total_memory_bytes=int(getattr(props, "total_memory", 0)) or None,
        uuid=str(uuid) if uuid is not None else None,
    )


def _profile_for(detected: DetectedGpu, profiles: list[GpuProfile]) -> GpuProfile:
    scored = [(_match_length(p, detected.name), p) for p in profiles]
    scored = [(n, p) for n, p in scored if n > 0 and p.compute_capability == detected.compute_capability]
    if not scored:
        raise TunerError(
            f"no GPU profile matches {detected.describe()}; known: "
            f"{', '.join(p.name for p in profiles)} (name one with --gpu NAME --force, or add a profile)"
        )
    best = max(n for n, _ in scored)
    winners = [p for n, p in scored if n == best]
    if len(winners) > 1:
        raise TunerError(
            f"several GPU profiles match {detected.name!r}: {', '.join(p.name for p in winners)}; name one with --gpu"
        )
    return winners[0]


_UNSET: Any = object()


def resolve_profile(
    name: str,
    *,
    force: bool = False,
    device: int = 0,
    detected: DetectedGpu | None = _UNSET,
) -> GpuProfile:
    """The profile to use for `--gpu name`.

    'auto' picks the profile that matches the detected GPU (NoGpuError when
    there is none). A named profile is checked against the GPU present: a
    mismatch is an error, or a warning when `force` is set. With no GPU
    present a named profile is returned as is (offline commands).

    `detected` replaces detection (tests pass a DetectedGpu or None).
    """
    if detected is _UNSET:
        detected = detect_gpu(device)
    if name.strip().lower() == AUTO:
        if detected is None:
            raise NoGpuError(
                "no CUDA GPU found (torch.cuda.is_available() is False), so --gpu auto cannot pick a profile; "
                f"name one with --gpu NAME ({', '.join(profile_names())}) for offline commands"
            )
        profile = _profile_for(detected, list_profiles())
        _warn_sm_count(profile, detected)
        return profile

    profile = load_profile(name)
    if detected is None:
        return profile
    problems = []
    if not profile.matches(detected.name):
        problems.append(f"the device is {detected.name!r}, not {' / '.join(profile.match)}")
    if profile.compute_capability != detected.compute_capability:
        problems.append(f"compute capability {detected.arch} is not the profile's {profile.arch}")
    if problems:
        message = (
            f"GPU profile {profile.name!r} does not match GPU {detected.index} ({'; '.join(problems)})"
        )
        if not force:
            raise TunerError(message + "; use --gpu auto, or --force to use this profile anyway")
        warnings.warn(message + "; using it anyway (--force)", UserWarning, stacklevel=2)
        return profile
    _warn_sm_count(profile, detected)
    return profile


def _warn_sm_count(profile: GpuProfile, detected: DetectedGpu) -> None:
    if detected.sm_count != profile.sm_count:
        warnings.warn(
            f"GPU {detected.index} ({detected.name}) has {detected.sm_count} SMs; profile {profile.name!r} "
            f"describes {profile.sm_count} (another variant of the card?): limits per block and per SM "
            "still apply, peak figures may not",
            UserWarning,
            stacklevel=3,
        )
