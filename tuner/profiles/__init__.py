"""GPU profiles: the hardware limits and default problems of one card.

A profile is a TOML file in profiles/ (shipped in the wheel as
tuner/_assets/profiles). Hardware limits live there, never as constants in
code. profile.py parses and validates one, catalog.py lists the shipped ones,
detect.py finds the GPU present and picks the profile for it.
"""

from tuner.profiles.catalog import list_profiles, load_profile, profile_names
from tuner.profiles.detect import (AUTO, DetectedGpu, detect_gpu, offline_profile, resolve_profile,
                                   visible_gpu_count)
from tuner.profiles.profile import REQUIRED_KEYS, GpuProfile, load_profile_file, profile_from_dict

__all__ = [
    "AUTO",
    "REQUIRED_KEYS",
    "DetectedGpu",
    "GpuProfile",
    "detect_gpu",
    "visible_gpu_count",
    "list_profiles",
    "load_profile",
    "load_profile_file",
    "offline_profile",
    "profile_from_dict",
    "profile_names",
    "resolve_profile",
]
