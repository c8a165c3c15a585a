"""The GPU worker on a real card: faults and hangs are results, and the worker recovers; ncu end to end.

Uses the test-only template tests/data/kernel_templates/attn_fault (found
through TUNER_TEMPLATE_PATH), whose kernels store through a wild pointer,
spin until the watchdog kills them, or write finite but wrong values.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.runtime.build import build
from tuner.runtime.verify import TOLERANCE
from tuner.status import TrialStatus

pytestmark = pytest.mark.gpu
FAULT_TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "kernel_templates"
PROBLEM = Problem(2, 4, 512, 512, 64)


@pytest.fixture
def fault_templates(monkeypatch):
    from tuner.kernels import manifest as templates
    from tuner.kernels import variant as space

    monkeypatch.setenv("TUNER_TEMPLATE_PATH", str(FAULT_TEMPLATES))
    templates.load_manifest.cache_clear()
    space._name_regex.cache_clear()
    yield
    templates.load_manifest.cache_clear()
    space._name_regex.cache_clear()


def real_variant(profile) -> Variant:
    from tuner.kernels.feasibility import check
    from tuner.kernels.variant import parse_variant_name

    # By name, so parameters added to the template later take their default values.
    name = f"attn_fwd_mma_d{PROBLEM.head_dim}_{PROBLEM.dtype}_m128n64_w4_q_rows_pad_s2_qreg"
    variant = parse_variant_name(name + ("_causal" if PROBLEM.causal else ""))
    assert check(variant, PROBLEM, profile), check(variant, PROBLEM, profile).reason
    return variant


def fault_variant(mode: str) -> Variant:
    return Variant("attn_fault", PROBLEM.head_dim, PROBLEM.dtype, PROBLEM.causal, {"BLOCK_M": 64, "MODE": mode})


def built(variant: Variant, profile):
    result = build(variant, profile.nvcc_arch)
    assert result.ok, result.compiled.log[-3000:]
    return result


def test_worker_classifies_faults_and_recovers(gpu_profile, fault_templates) -> None:
    import torch

    from tuner.backends.gpu import GpuBackend

    real = real_variant(gpu_profile)
    cases = [(real, TrialStatus.OK)] + [(fault_variant(m), s) for m, s in (
        ("illegal_address", TrialStatus.LAUNCH_ERROR), ("hang", TrialStatus.TIMEOUT),
        ("ok_but_wrong", TrialStatus.INCORRECT))] + [(real, TrialStatus.OK)]
    builds = {v: built(v, gpu_profile) for v, _ in cases}
    with GpuBackend(gpu_profile, watchdog_s=3.0, seed=1) as backend:
        facts = backend.device_facts()
        assert facts.gpu_name == torch.cuda.get_device_name(0)
        assert facts.cuda_version == torch.version.cuda
        baselines = backend.baselines(PROBLEM)
        assert baselines and all(b.median_us > 0 for b in baselines), baselines
        pids, results = [], []
        for variant, expected in cases:
            start = time.monotonic()
            m = backend.measure(PROBLEM, variant, builds[variant], range_prefix="test/trial")
            results.append((variant.name, m, time.monotonic() - start))
            pids.append(backend.worker_pid)
            assert m.status is expected, (variant.name, m)
        (_, ok1, _), (_, illegal, _), (_, hang, hang_s), (_, wrong, _), (_, ok2, _) = results
        assert ok1.median_us > 0 and ok1.p20_us <= ok1.median_us <= ok1.p80_us
        assert ok1.rel_error < TOLERANCE[PROBLEM.dtype]
        assert "illegal" in illegal.error.lower() or "launch" in illegal.error.lower(), illegal.error
        assert "verify" in hang.error and hang_s < 3.0 + 60.0, hang_s
        assert wrong.rel_error is not None and wrong.rel_error > TOLERANCE[PROBLEM.dtype]
        assert ok2.median_us > 0 and ok2.rel_error < TOLERANCE[PROBLEM.dtype]
        assert backend.restarts == 2  # after the illegal address and after the hang
        assert pids[1] is None and pids[2] is None  # a faulted or hung child is gone at once
        assert pids[0] != pids[3] and pids[3] == pids[4]  # a fresh child; an incorrect result costs no restart
        for name, m, seconds in results:
            print(f"{name}: {m.status.value} in {seconds:.1f} s, median {m.median_us} us, "
                  f"rel error {m.rel_error}, error {m.error}")


def test_profile_a_real_trial_with_ncu(gpu_profile, tmp_path) -> None:
    if shutil.which("ncu") is None:
        pytest.skip("ncu (Nsight Compute) is not on PATH")
    import torch

    from tuner.backends.gpu import GpuBackend
    from tuner.kernels.manifest import load_manifest
    from tuner.reporting.profiling import METRICS, profile_trial
    from tuner.store import RunInfo, TrialRecord, open_store

    variant = real_variant(gpu_profile)
    kernel = built(variant, gpu_profile)
    with GpuBackend(gpu_profile) as backend:
        m = backend.measure(PROBLEM, variant, kernel)
    assert m.status is TrialStatus.OK, m
    with open_store(f"sqlite:///{tmp_path / 'results.db'}") as store:
        run_id = store.start_run(RunInfo(gpu_name=torch.cuda.get_device_name(0), profile=gpu_profile.name))
        trial_id = store.add_trial(TrialRecord(
            run_id=run_id, problem=PROBLEM, template=variant.template,
            template_hash=load_manifest(variant.template).source_hash, params=variant.stored_params(),
            variant_name=variant.name, status=TrialStatus.OK, timing=m.timing, rel_error=m.rel_error,
            registers=kernel.compiled.registers,
        ))
        metrics = {x.name: x for x in profile_trial(store, trial_id)}
        detail = store.trial_detail(trial_id)
    assert set(metrics) == set(METRICS), sorted(set(METRICS) - set(metrics))
    assert metrics["gpu__time_duration.sum"].value > 0 and metrics["gpu__time_duration.sum"].unit
    assert metrics["launch__registers_per_thread"].value == kernel.compiled.registers  # ptxas and ncu agree
    assert metrics["sm__inst_executed_pipe_tensor_op_hmma.sum"].value > 0  # mma.sync on the tensor pipe
    assert {x.name for x in detail.ncu_metrics} == set(METRICS)
    assert detail.median_us == m.median_us  # ncu's duration never replaces the measured median


def test_a_confirm_round_times_the_variants_and_only_the_baselines_asked_for(gpu_profile) -> None:
    from tuner.backends.gpu import GpuBackend

    variant = real_variant(gpu_profile)
    kernel = built(variant, gpu_profile)
    with GpuBackend(gpu_profile) as backend:
        every = backend.confirm(PROBLEM, [variant], [kernel], 1).rounds
        baselines = sorted(name for name in every if name != variant.name)
        assert variant.name in every and baselines, every
        fastest = min(baselines, key=lambda name: every[name][0])
        chosen = backend.confirm(PROBLEM, [variant], [kernel], 2, baselines=[fastest], first_round=3).rounds
        none = backend.confirm(PROBLEM, [variant], [kernel], 1, baselines=[]).rounds
    assert set(chosen) == {variant.name, fastest} and all(len(t) == 2 and min(t) > 0 for t in chosen.values())
    assert set(none) == {variant.name}
