"""GPU test fixtures: skip (with the reason) where no CUDA GPU or pycuda is present."""

from __future__ import annotations

import importlib.util

import pytest


def gpu_unavailable_reason() -> str:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    if importlib.util.find_spec("pycuda") is None:
        return "pycuda is not installed (pip install '.[gpu]')"
    return ""


@pytest.fixture(scope="session")
def gpu_profile():
    reason = gpu_unavailable_reason()
    if reason:
        pytest.skip(reason)
    from tuner.profiles import resolve_profile
    from tuner.runtime.driver import cuda_driver

    cuda_driver(0)
    return resolve_profile("auto")


@pytest.fixture(scope="module")
def hopper(gpu_profile):
    """The profile of an sm_90 GPU (the Hopper templates' tests skip elsewhere)."""
    if tuple(gpu_profile.compute_capability) < (9, 0):
        pytest.skip(f"this test needs an sm_90 GPU; this is {gpu_profile.name}")
    return gpu_profile
