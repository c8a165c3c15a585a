"""Which trial `tuner export` ships for a problem (CPU, both store backends): the fastest back to back of the
current template code, a time confirm stage's winner over it, never an energy or isolated stage's; with
--model, exactly the model's problems."""

from __future__ import annotations

import dataclasses
import re

import pytest
from store_factories import BIG, H100, trial

from tuner.export.selection import sdpa_ratio, select_trials
from tuner.kernels.manifest import load_manifest
from tuner.profiles import load_profile
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timing
from tuner.store import BaselineRecord, ConfirmRecord

PROFILE = load_profile("h100")
CURRENT = load_manifest("attn_fwd_mma").source_hash


def _trial(store, run, block_n: int, us: float, code: str = CURRENT, **fields) -> int:
    return store.add_trial(trial(run, BIG, params={"BLOCK_M": 64, "BLOCK_N": block_n}, template_hash=code,
                                 median_us=us, **fields))


def test_the_current_codes_best_is_exported_before_a_faster_trial_of_older_code(store) -> None:
    """A trial measured before the template changed describes another kernel: once the search ran again, the
    current code's best ships, even slower (the old one would fail the cubin check, or ship rebuilt with the
    old figure); a problem with older code's trials alone keeps its best."""
    old = store.start_run(H100)
    stale = _trial(store, old, 64, 30.0, code="older-template-code")
    assert [r.id for r in select_trials(store, PROFILE, (), None)] == [stale]
    new = store.start_run(H100)
    _trial(store, new, 64, 45.0)
    current = _trial(store, new, 32, 40.0)
    assert [r.id for r in select_trials(store, PROFILE, (), None)] == [current]


def test_an_energy_confirm_stages_winner_is_not_exported_over_the_fastest(store) -> None:
    """Export ranks by back-to-back µs: the energy stage's frugal-but-slower winner (and its J ratio) would
    route the cell to SDPA, slower and costlier than the fastest kernel; a time stage's winner is preferred."""
    run = store.start_run(H100)
    store.add_baseline(BaselineRecord(run_id=run, problem=BIG, impl="sdpa_flash", timing=Timing(50.0)))
    fast = _trial(store, run, 64, 40.0, energy=Energy(0.045, 700.0, 1500.0))
    frugal = _trial(store, run, 32, 55.0, energy=Energy(0.030, 550.0, 1300.0))
    names = {fast: "attn_fwd_mma_block_m64_block_n64", frugal: "attn_fwd_mma_block_m64_block_n32"}
    timings = {names[fast]: (fast, (40.0, 40.5, 40.2)), names[frugal]: (frugal, (55.0, 55.2, 54.9)),
               "sdpa_flash": (None, (50.0, 50.1, 49.9))}
    store.add_confirmation(ConfirmRecord(run_id=run, problem=BIG, rounds=3, objective="energy", winner_trial_id=frugal,
                                         winner_us=55.0, winner_ratio=1.6, baseline_impl="sdpa_flash",
                                         winner_joules_per_call=0.031, timings=timings))
    (row,) = select_trials(store, PROFILE, (), None)
    assert row.id == fast and row.confirmed_us is None
    assert sdpa_ratio(store, row, store.trial_detail(row.id).baselines) == 50.0 / 40.0
    store.add_confirmation(ConfirmRecord(run_id=run, problem=BIG, rounds=3, winner_trial_id=fast, winner_us=40.2,
                                         winner_ratio=1.24, baseline_impl="sdpa_flash", timings=timings))
    (row,) = select_trials(store, PROFILE, (), None)
    assert row.id == fast and row.confirmed_us == 40.2 and row.confirmed_objective == "time"


def test_a_models_export_takes_exactly_its_problems_fp8_cache_decode_included(store) -> None:
    """--model exports the problems its search tuned: not another problem of the same shape (non-causal, other
    K/V heads), and with --kv-cache e4m3 its decode steps in their FP8-cache dtype."""
    from tuner.errors import TunerError
    from tuner.models import load_model, model_problems

    model = load_model("llama-3.1-8b")
    plain, fp8 = model_problems(model), model_problems(model, "e4m3")
    decode = [p for p in fp8 if p.dtype == "bf16_kv_e4m3"]
    assert decode and len(plain) == len(fp8)
    run = store.start_run(H100)
    ids = {p: store.add_trial(trial(run, p, params={"BLOCK_M": 64}, template_hash=CURRENT, median_us=10.0))
           for p in fp8}
    stranger = dataclasses.replace(plain[0], causal=False, heads_kv=plain[0].heads)
    store.add_trial(trial(run, stranger, params={"BLOCK_M": 64}, template_hash=CURRENT, median_us=1.0))
    rows = select_trials(store, PROFILE, (), None, fp8)
    assert sorted(r.id for r in rows) == sorted(ids.values())
    missing = dataclasses.replace(decode[0], dtype="bf16").label
    with pytest.raises(TunerError, match=re.escape(f"no ok trials for h100 ({missing})")):
        select_trials(store, PROFILE, (), None, plain)  # its decode steps were tuned over an FP8 cache
