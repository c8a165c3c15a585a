"""Probing SDPA backends for baselines: a rejected backend is skipped quietly."""

from __future__ import annotations

import warnings

import pytest

from tuner.problem import Problem
from tuner.runtime.baselines import available_baselines


def test_probing_backends_shows_no_torch_warnings(monkeypatch) -> None:
    """torch warns once per rejected backend and call; a search probes every problem: none may reach the log."""
    import torch
    import torch.nn.functional as F

    def rejecting(*_args, **_kwargs):
        warnings.warn("Flash attention kernel not used because: (test)", UserWarning)
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(F, "scaled_dot_product_attention", rejecting)
    q = torch.zeros(1, 2, 8, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning that escapes fails the test
        assert available_baselines(Problem(1, 2, 8, 8, 64), q, q, q) == []


def test_other_warnings_are_not_hidden(monkeypatch) -> None:
    import torch
    import torch.nn.functional as F

    def deprecated(*_args, **_kwargs):
        warnings.warn("something else", DeprecationWarning)
        raise RuntimeError("rejected")

    monkeypatch.setattr(F, "scaled_dot_product_attention", deprecated)
    q = torch.zeros(1, 2, 8, 64)
    with pytest.warns(DeprecationWarning):
        available_baselines(Problem(1, 2, 8, 8, 64), q, q, q)
