"""The GPU present (asked of the CUDA driver; torch.cuda where there is no driver library) and its profile."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from tuner.errors import NoGpuError, TunerError
from tuner.profiles.catalog import list_profiles, load_profile, profile_names
from tuner.profiles.cuda_query import DriverDevice, DriverError, driver_devices
from tuner.profiles.profile import GpuProfile, match_length

AUTO = "auto"


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


def detect_gpu(device: int = 0) -> DetectedGpu | None:
    """The CUDA device `device`, or None without a usable GPU: asked of the CUDA driver (milliseconds),
    or of torch.cuda where this machine has no driver library torch could use either way."""
    devices = _driver_view()
    if devices is None:
        return _torch_gpu(device)
    if device < 0 or device >= len(devices):
        if not devices:
            return None
        raise TunerError(f"CUDA device {device} does not exist; this machine has {len(devices)}")
    d = devices[device]
    return DetectedGpu(index=device, name=d.name, compute_capability=d.compute_capability, sm_count=d.sm_count,
                       total_memory_bytes=d.total_memory_bytes, uuid=d.uuid)


def _driver_view() -> list[DriverDevice] | None:
    """The driver's devices ([] where it has a library but no usable device); None where there is no
    driver library, so torch.cuda is asked instead."""
    try:
        return driver_devices()
    except DriverError:
        return []


def visible_gpu_count() -> int:
    """How many CUDA devices this process may use (0 without a usable GPU)."""
    devices = _driver_view()
    if devices is not None:
        return len(devices)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _torch_gpu(device: int) -> DetectedGpu | None:
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
    scored = [(match_length(p, detected.name), p) for p in profiles]
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
                "no CUDA GPU found (the CUDA driver reports none), so --gpu auto cannot pick a profile; "
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


def offline_profile(name: str, *, detected: DetectedGpu | None = _UNSET) -> GpuProfile:
    """The profile for an offline command's `--gpu name` (export, variants): a named profile whatever card this
    machine has (exports are often built on another host); only 'auto' looks at the GPU present."""
    if name.strip().lower() == AUTO:
        return resolve_profile(name, detected=detected)
    return load_profile(name)
