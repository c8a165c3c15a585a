"""Property tests: whatever a trial holds comes back unchanged; get-or-create is idempotent.

The store fixture is shared by all examples of one test on purpose (a fresh
database per example would be slow); every example writes new rows and reads
back only its own.
"""

from __future__ import annotations

import math
from dataclasses import fields

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_factories import H100

from tuner.problem import DTYPES, Problem
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timing
from tuner.status import TrialStatus
from tuner.store import BaselineRecord, TrialRecord, canonical_json

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

# PostgreSQL text cannot hold NUL (the store replaces it; tested elsewhere).
texts = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40)
int32 = st.integers(min_value=0, max_value=2**31 - 1)
maybe_float = st.none() | st.floats(allow_nan=False, allow_infinity=True, width=64)
json_scalars = st.none() | st.booleans() | st.integers(-(2**62), 2**62) | st.floats(allow_nan=False, allow_infinity=False) | texts
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
params_dicts = st.dictionaries(texts, json_values, max_size=6)
finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False, width=64)
# What a store keeps of an Energy: everything but the window (a diagnostic of the timed block).
energies = st.none() | st.builds(Energy, joules_per_call=finite, power_w=finite, sm_mhz=st.none() | finite)


def stored_timings(median_us: st.SearchStrategy = st.floats(allow_nan=False, allow_infinity=True, width=64)
                   ) -> st.SearchStrategy:
    """What a store keeps of a Timing: everything but its repetitions (and its energy's window)."""
    return st.builds(Timing, median_us=median_us, p20_us=maybe_float, p80_us=maybe_float, reps=st.none(),
                     energy=energies, isolated_us=maybe_float)


@st.composite
def problems(draw) -> Problem:
    heads_kv = draw(st.integers(1, 8))
    seq_k = draw(st.integers(1, 1 << 17))
    return Problem(
        batch=draw(st.integers(1, 64)),
        heads=heads_kv * draw(st.integers(1, 8)),
        seq_q=draw(st.integers(1, 1 << 17)),
        seq_k=seq_k,
        head_dim=draw(st.sampled_from([32, 64, 96, 128, 256])),
        dtype=draw(st.sampled_from(DTYPES)),
        causal=draw(st.booleans()),
        heads_kv=heads_kv,
        layout=draw(st.sampled_from(["bhsd", "bshd"])),
        lengths=draw(st.one_of(st.just("full"), st.integers(1, seq_k).map(lambda low: f"uniform:{low}"))),
    )


@st.composite
def trial_records(draw, run_id: int) -> TrialRecord:
    return TrialRecord(
        run_id=run_id,
        problem=draw(problems()),
        template=draw(texts.filter(bool)),
        template_hash=draw(st.text("0123456789abcdef", min_size=1, max_size=16)),
        params=draw(params_dicts),
        variant_name=draw(texts),
        status=draw(st.sampled_from(list(TrialStatus))),
        study=draw(st.none() | texts),
        trial_number=draw(st.none() | int32),
        timing=draw(st.none() | stored_timings()),
        tflops=draw(maybe_float),
        rel_error=draw(maybe_float),
        compile_s=draw(maybe_float),
        registers=draw(st.none() | int32),
        smem_bytes=draw(st.none() | int32),
        spill_bytes=draw(st.none() | int32),
        cubin_sha256=draw(st.none() | st.text("0123456789abcdef", min_size=64, max_size=64)),
        error=draw(st.none() | texts),
        compile_log=draw(st.none() | st.text(max_size=300).map(lambda s: s.replace("\x00", ""))),
        source_path=draw(st.none() | texts),
    )


def test_trial_round_trip(store):
    run = store.start_run(H100)
    first_names: dict[tuple[str, str, str], str] = {}

    @SETTINGS
    @given(rec=trial_records(run))
    def check(rec: TrialRecord) -> None:
        detail = store.trial_detail(store.add_trial(rec))
        # A variant is (template, hash, params); its name is the one given when it was first stored.
        key = (rec.template, rec.template_hash, canonical_json(rec.params))
        assert detail.variant_name == first_names.setdefault(key, rec.variant_name)
        for f in fields(TrialRecord):
            sent, got = getattr(rec, f.name), getattr(detail, f.name, None)
            if f.name in ("run_id", "problem", "template", "template_hash", "status", "study", "trial_number",
                          "timing", "rel_error", "compile_s", "registers", "smem_bytes", "spill_bytes",
                          "cubin_sha256", "error", "compile_log", "source_path"):  # fmt: skip
                assert got == sent, f.name
        assert detail.params == rec.params
        median = rec.timing.median_us if rec.timing is not None else None
        if rec.tflops is not None:
            assert detail.tflops == rec.tflops
        elif median is not None and math.isfinite(median) and median > 0:
            assert math.isclose(detail.tflops, rec.problem.tflops(median))
        else:
            assert detail.tflops is None

    check()


def test_baseline_round_trip_keeps_its_timing_whole(store):
    run = store.start_run(H100)

    @SETTINGS
    # µs from 1 ns up: a denormal median's TFLOP/s divides by zero (the store computes it; not this test's rule)
    @given(problem=problems(), impl=texts.filter(bool), timing=stored_timings(st.floats(1e-3, 1e6)))
    def check(problem: Problem, impl: str, timing: Timing) -> None:
        baseline_id = store.add_baseline(BaselineRecord(run_id=run, problem=problem, impl=impl, timing=timing))
        [row] = [b for b in store.baselines_for(run, store.problem_id(problem)) if b.id == baseline_id]
        assert row.timing == timing

    check()


def test_variant_get_or_create_is_idempotent(store):
    @SETTINGS
    @given(template=texts, template_hash=texts, params=params_dicts, name=texts)
    def check(template: str, template_hash: str, params: dict, name: str) -> None:
        first = store.variant_id(template, template_hash, params, name)
        assert store.variant_id(template, template_hash, dict(reversed(list(params.items()))), name + "x") == first
        assert store.variant_id(template, template_hash + "!", params, name) != first

    check()


def test_problem_get_or_create_is_idempotent(store):
    @SETTINGS
    @given(problem=problems())
    def check(problem: Problem) -> None:
        first = store.problem_id(problem)
        assert store.problem_id(Problem(**{f.name: getattr(problem, f.name) for f in fields(Problem)})) == first
        flipped = Problem(**{**{f.name: getattr(problem, f.name) for f in fields(Problem)}, "causal": not problem.causal})
        assert store.problem_id(flipped) != first

    check()
