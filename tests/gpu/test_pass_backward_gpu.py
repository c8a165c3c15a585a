"""`tuner search --pass backward` on a real card (issue 40, item 3): the profile's backward template is searched,
each trial's dQ, dK and dV are checked against fp32 autograd before it is timed, and SDPA's flash and cuDNN backward
(and FlashAttention-4's where it imports) are timed in the same run as its baselines."""

from __future__ import annotations

import sqlite3

import pytest

from tests.cli_helpers import run_tuner

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape, extra", [("2,4,512,64", ()), ("1,8,384,128", ("--hkv", "2", "--causal"))])
def test_a_two_trial_backward_search_lands_verified_timed_trials_with_baselines(gpu_profile, tmp_path, shape,
                                                                                   extra) -> None:
    url = f"sqlite:///{tmp_path / 'bwd.db'}"
    res = run_tuner("--db", url, "search", "--gpu", gpu_profile.name, "--shape", shape, *extra, "--dtype", "bf16",
                    "--pass", "backward", "--trials", "2", "--seed", "0", "--confirm", "2", "--confirm-rounds", "2")
    assert res.exit_code == 0, res.stderr[-3000:]
    with sqlite3.connect(tmp_path / "bwd.db") as db:
        trials = db.execute("SELECT p.pass, v.template, t.status, t.median_us, t.rel_error, t.error FROM trials t "
                            "JOIN problems p ON t.problem_id = p.id JOIN variants v ON t.variant_id = v.id "
                            "WHERE t.status != 'pruned'").fetchall()
        baselines = dict(db.execute("SELECT b.impl, b.median_us FROM baselines b JOIN problems p "
                                    "ON b.problem_id = p.id WHERE p.pass = 'backward'").fetchall())
    backward_template = gpu_profile.templates_for("backward")[0 if gpu_profile.compute_capability[0] >= 9 else -1]
    assert len(trials) == 2 and {(t[0], t[1]) for t in trials} == {("backward", backward_template)}, trials
    ok = [t for t in trials if t[2] == "ok"]
    assert ok, trials  # a verified, timed trial: every gradient within twice the forward's bf16 tolerance
    assert all(t[3] > 0 and t[4] is not None and t[4] < 2e-2 for t in ok), ok
    assert "sdpa_flash" in baselines and all(us > 0 for us in baselines.values()), baselines
    assert "sdpa_efficient" not in baselines
    if gpu_profile.compute_capability[0] >= 9:  # cuDNN's backward serves Sq == Sk, causal or not, on sm_90+
        assert "sdpa_cudnn" in baselines, baselines
    assert "backward" in res.stdout
