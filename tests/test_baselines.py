"""Probing SDPA backends for baselines: a rejected backend is skipped quietly."""

from __future__ import annotations

import warnings

from tuner.problem import Problem
from tuner.runtime.baseline_log import log_path, take_counts
from tuner.runtime.baselines import SDPA_BACKENDS, available_baselines


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


def test_other_warnings_are_not_lost_but_logged(monkeypatch, tmp_path) -> None:
    """Not the rejection's note: kept, but in the baselines' log rather than in the search's output."""
    import torch
    import torch.nn.functional as F

    def deprecated(*_args, **_kwargs):
        warnings.warn("something else", DeprecationWarning)
        raise RuntimeError("rejected")

    monkeypatch.setenv("TUNER_LOG_DIR", str(tmp_path))
    monkeypatch.setattr(F, "scaled_dot_product_attention", deprecated)
    q = torch.zeros(1, 2, 8, 64)
    take_counts()
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        available_baselines(Problem(1, 2, 8, 8, 64), q, q, q)
    assert escaped == []
    log = log_path().read_text()
    assert log_path().parent == tmp_path and log.count("DeprecationWarning: something else") == len(SDPA_BACKENDS)
    assert "sdpa_flash (first call)" in log and take_counts() == {name: 1 for name in SDPA_BACKENDS}
