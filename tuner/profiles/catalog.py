"""The profiles shipped with the tool (profiles/, in the wheel as tuner/_assets/profiles)."""

from __future__ import annotations

from pathlib import Path

from tuner.assets import asset_dir
from tuner.errors import TunerError
from tuner.profiles.profile import GpuProfile, load_profile_file


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
