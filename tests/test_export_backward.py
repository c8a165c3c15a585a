"""An export ships a tuned backward (CPU): the confirmed backward winner of each exported forward problem where it beat
SDPA's best backward in its confirm stage, none (and why) where it did not or there is none; the package's manifest
lists it with its launch facts; choose_backward and explain() name it; a winner whose template is gone is one clear
TunerError that leaves the earlier export as it was."""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tests.built_trials import add_built_trial
from tests.test_export import import_exported
from tuner.errors import TunerError
from tuner.export.backward_selection import backward_problem, pick_backward
from tuner.export.run import ExportOptions, export
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.shipped import backward as bw
from tuner.store import ConfirmRecord, RunInfo, open_store

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (export recompiles cubins)")

PROFILE = load_profile("h100")
FAST = Problem(2, 4, 256, 256, 64, dtype="bf16")                        # its backward winner beat SDPA's
SLOW = Problem(2, 4, 256, 256, 64, dtype="bf16", causal=True)           # its backward winner lost to SDPA's
NONE = Problem(2, 4, 256, 256, 128, dtype="bf16")                       # no backward was tuned
FORWARD_PARAMS = dict(NUM_WARPS=4, KV_SPLIT=1, STAGES=2, Q_IN_REGS=True, MIN_BLOCKS=1, LAZY_RESCALE=False,
                      BLOCK_M=64, BLOCK_N=64, SWIZZLE="xor")
BACKWARD_PARAMS = dict(BLOCK_M=64, BLOCK_N=64, STAGES=1, DQ_BULK=False, PRODUCER=False, DQ_WRITER=False)


def _confirm(store, run: int, problem: Problem, trial: int, name: str, mine: float, sdpa: dict[str, float]) -> None:
    """A time confirm stage of `problem` (3 rounds) won by `trial`, with SDPA's backwards timed beside it."""
    timings = {name: (trial, (mine, mine * 1.01, mine))} | {n: (None, (us, us, us * 1.01)) for n, us in sdpa.items()}
    store.add_confirmation(ConfirmRecord(run_id=run, problem=problem, rounds=3, timings=timings, winner_trial_id=trial,
                                         winner_us=mine, winner_ratio=min(sdpa.values()) / mine,
                                         baseline_impl=min(sdpa, key=sdpa.__getitem__)))


def _fill(url: str, backward_template: str = "attn_bwd_wgmma") -> dict[str, int]:
    """A store as `tuner search --pass both` leaves it: forward trials of FAST, SLOW and NONE; confirmed backward
    winners of FAST (1.11x SDPA's best backward) and SLOW (0.89x)."""
    ids = {}
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name="NVIDIA H100 80GB HBM3", profile=PROFILE.name, host="test"))
        for label, p in (("fast", FAST), ("slow", SLOW), ("none", NONE)):
            ids[label] = add_built_trial(store, run, p, Variant("attn_fwd_mma", p.head_dim, p.dtype, p.causal,
                                                                FORWARD_PARAMS), PROFILE.nvcc_arch, 40.0, 1e-3)
        for label, p, mine in (("fast_bwd", FAST, 90.0), ("slow_bwd", SLOW, 90.0)):
            v = Variant("attn_bwd_wgmma", p.head_dim, p.dtype, p.causal, BACKWARD_PARAMS)
            bp = backward_problem(p)
            ids[label] = add_built_trial(store, run, bp, v, PROFILE.nvcc_arch, mine, 2e-3)
            sdpa = {"sdpa_cudnn": 100.0, "sdpa_flash": 120.0} if label == "fast_bwd" else {"sdpa_cudnn": 80.0}
            _confirm(store, run, bp, ids[label], v.name, mine, sdpa)
        store.finish_run(run)
    if backward_template != "attn_bwd_wgmma":  # the winner's template renamed (its file gone from this checkout)
        import sqlite3

        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            db.execute("UPDATE variants SET template = ? WHERE template = 'attn_bwd_wgmma'", (backward_template,))
    return ids


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("export_backward")
    url = f"sqlite:///{base / 'results.db'}"
    ids = _fill(url)
    name = f"bwd_{uuid.uuid4().hex[:8]}"
    report = export(ExportOptions(gpu=PROFILE.name, out=base / name, db_url=url))
    return report, ids, import_exported(base / name, name), url


def _entry(report, problem: Problem) -> dict:
    return next(e for e in report.entries if e["problem_label"] == problem.label)


def test_the_confirmed_backward_winner_faster_than_sdpa_ships_with_its_launch_facts(exported) -> None:
    from tuner.runtime.backward_launch import backward_shape

    report, ids, pkg, _ = exported
    fast = _entry(report, FAST)["backward"]
    v = Variant("attn_bwd_wgmma", 64, "bf16", False, BACKWARD_PARAMS)
    assert fast["kernel"] == v.name and fast["trial_id"] == ids["fast_bwd"]
    assert fast["ratio_to_sdpa"] == pytest.approx(100.0 / 90.0, rel=0.02) and fast["median_us"] == 90.0
    manifest = json.loads((report.out / report.package / "manifest.json").read_text())
    meta = manifest["kernels"][v.name]
    assert meta["pass"] == "backward" and meta["launch"] == dataclasses.asdict(backward_shape(v))
    assert meta["launch"]["tma_rows"] == 64 and meta["launch"]["threads"] == 128
    assert (report.out / report.package / meta["cubins"][PROFILE.nvcc_arch]["path"]).is_file()
    assert all(m["pass"] == "forward" for k, m in manifest["kernels"].items() if k != v.name)
    assert "attn_bwd_wgmma" in manifest["templates"] and report.kernels == len(manifest["kernels"])
    assert pkg.MANIFEST["entries"] == manifest["entries"]  # the import checked it all


def test_no_backward_ships_where_it_lost_to_sdpa_or_none_was_tuned_and_the_entry_says_why(exported) -> None:
    report = exported[0]
    slow, none = _entry(report, SLOW), _entry(report, NONE)
    assert slow["backward"] is None and "0.89x SDPA's best backward, not faster" in slow["backward_note"]
    assert none["backward"] is None and "no confirmed backward winner" in none["backward_note"]
    assert not any("slow" in k or "_causal" in k for k, m in
                   json.loads((report.out / report.package / "manifest.json").read_text())["kernels"].items()
                   if m["pass"] == "backward")


def test_the_export_summary_says_which_backward_ships_and_why_not() -> None:
    from tuner.cli.tables import export_lines

    base = {"trial_id": 1, "median_us": 10.0, "ratio_to_best_baseline": 1.2, "problem_label": "x", "kernel": "k",
            "dispatch": True, "rebuilt": False, "run": {}}
    shipped = export_lines([base | {"backward": {"kernel": "attn_bwd_wgmma_d64_bf16_m64n64_s1"},
                                    "backward_note": "attn_bwd_wgmma_d64_bf16_m64n64_s1: 1.11x SDPA's best backward "
                                                     "(confirmed)"}])
    assert " ".join(s.strip() for s in shipped[2:]) == ("backward: attn_bwd_wgmma_d64_bf16_m64n64_s1 (1.11x SDPA's "
                                                         "best backward (confirmed))")
    lost = export_lines([base | {"backward": None, "backward_note": "its confirmed backward winner w measured 0.89x "
                                                                     "SDPA's best backward, not faster"}])
    assert " ".join(s.strip() for s in lost[2:]).startswith("backward: SDPA's (its confirmed backward winner w")
    assert all(len(line) <= 80 for line in shipped + lost)
    assert len(export_lines([base])) == 2  # a header's entry: no backward line


@settings(max_examples=60, deadline=None)
@given(mine=st.lists(st.floats(10.0, 200.0), min_size=3, max_size=3),
       cudnn=st.lists(st.floats(10.0, 200.0), min_size=3, max_size=3),
       flash=st.one_of(st.none(), st.lists(st.floats(10.0, 200.0), min_size=3, max_size=3)))
def test_a_backward_ships_exactly_when_its_median_round_ratio_to_the_best_sdpa_exceeds_one(mine, cudnn, flash) -> None:
    """The rule in general: the median over rounds of min(SDPA's backwards) / the winner's µs, > 1 ships."""
    import statistics

    class Store:  # what pick_backward reads of a store
        def confirmed(self, problem, gpu, objective):
            assert problem.backward and objective == "time"
            return type("C", (), dict(confirmation_id=1, trial_id=7, variant_name="w", median_us=mine[0]))

        def confirm_timings(self, cid):
            return {"w": mine, "sdpa_cudnn": cudnn} | ({"sdpa_flash": flash} if flash else {})

        def trial_detail(self, tid):
            return type("R", (), dict(id=tid))

    pick = pick_backward(Store(), "h100", FAST)
    best = [min(c, f) for c, f in zip(cudnn, flash)] if flash else cudnn
    ratio = statistics.median(b / m for b, m in zip(best, mine))
    assert (pick.row is not None) == (ratio > 1.0) and pick.ratio == pytest.approx(ratio)
    assert ("not faster" in pick.reason) == (ratio <= 1.0)


def test_a_backward_winner_whose_template_is_gone_is_one_clear_error_and_the_earlier_export_stays(
        exported, tmp_path) -> None:
    report = exported[0]
    url = f"sqlite:///{tmp_path / 'gone.db'}"
    ids = _fill(url, backward_template="attn_bwd_gone")
    before = (report.out / report.package / "manifest.json").read_bytes()
    with pytest.raises(TunerError) as err:
        export(ExportOptions(gpu=PROFILE.name, out=report.out, db_url=url, name=report.package, force=True))
    message = str(err.value)
    assert "\n" not in message and f"backward winner of {FAST.label} (trial {ids['fast_bwd']})" in message
    assert "unknown kernel template 'attn_bwd_gone'" in message
    assert (report.out / report.package / "manifest.json").read_bytes() == before


# --- choose_backward and explain() -------------------------------------------------------------------------------

TUNED = {"kernel": "attn_bwd_wgmma_d64_bf16_m64n64_s1", "trial_id": 12, "ratio_to_sdpa": 1.05,
         "problem_label": "B8 H16 S2048 D64 bf16 backward"}


def _choose(**kw):
    args = dict(head_dim=64, causal=False, seq_q=2048, seq_k=2048, cc=(9, 0), tuned=TUNED)
    return bw.choose_backward(**(args | kw))


def test_the_tuned_backward_is_chosen_where_the_package_ships_one_and_says_which_and_how_fast() -> None:
    choice = _choose()
    assert choice.kind == bw.TUNED and choice.kernel == TUNED["kernel"]
    assert choice.text() == ("backward: tuned backward kernel attn_bwd_wgmma_d64_bf16_m64n64_s1 on the tuned forward's "
                             "O and lse (no forward recomputation): the package ships it for this call's dispatch "
                             "entry, confirmed at 1.05x SDPA's best backward on B8 H16 S2048 D64 bf16 backward "
                             "(trial 12)")
    assert "no CUDA device here" in _choose(cc=None).text() and _choose(cc=None).kind == bw.TUNED


@pytest.mark.parametrize("kw,kind,why", [
    (dict(deterministic=True), bw.FLASH, "deterministic algorithms are on, and it accumulates dQ"),
    (dict(tuned_error="it does not load here (x)"), bw.CUDNN, "not the tuned backward attn_bwd_wgmma_d64_bf16_m64n64_s1: "
                                                              "it does not load here (x)"),
    (dict(tuned=None), bw.CUDNN, "sm_90+, where cuDNN's"),
    (dict(forward="the call's cell is routed to SDPA"), bw.SDPA, "routed to SDPA"),
    (dict(mask=(127, -1, 0.0)), bw.SDPA, "sliding windows"),
])
def test_sdpa_backward_serves_where_the_tuned_one_does_not_and_says_why(kw, kind, why) -> None:
    choice = _choose(**kw)
    assert choice.kind == kind and why in choice.text()


def test_explain_names_the_forward_and_the_backward_kernel(exported) -> None:
    import torch

    report, _, pkg, _ = exported
    q, k, v = (torch.zeros(2, 4, 256, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    text = str(pkg.explain(q, k, v))
    fast = _entry(report, FAST)
    assert f"kernel: {fast['kernel']}" in text
    assert f"backward kernel: {fast['backward']['kernel']} (trial {fast['backward']['trial_id']}" in text
    assert f"backward: tuned backward kernel {fast['backward']['kernel']}" in text
    slow = str(pkg.explain(q, k, v, causal=True))
    assert "backward kernel: none shipped, SDPA's backward serves training calls" in slow
    assert "tuned backward kernel" not in slow
    with torch.no_grad():  # an inference call: the entry's backward is still named, no backward line
        assert "backward kernel: attn_bwd_wgmma" in str(pkg.explain(*(t.detach() for t in (q, k, v))))


# --- the shipped launcher's workspaces ----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 8), st.integers(1, 700), st.sampled_from([64, 128]),
                          st.booleans()), min_size=1, max_size=6))
def test_eager_calls_share_one_workspace_per_stream_grown_to_the_largest(calls) -> None:
    """Views of the needed shapes (lse_log2 and delta over ROW_PAD-padded rows; dQ's accumulator, padded where it is
    tiled), in one buffer per stream that never shrinks and is reused where it fits (no allocation in a training
    loop at one shape)."""
    import math

    import torch

    from tuner.runtime.shipped.backward_kernel import BackwardLauncher, BackwardShape

    launcher = BackwardLauncher.__new__(BackwardLauncher)  # its workspace logic alone: no GPU, no cubin
    launcher._workspaces = {}
    largest = [0, 0]
    for b, h, sq, d, tiled in calls:
        launcher.shape = BackwardShape("bf16", d, 64, 128, 1, 128, 16, 128, 64, tiled)
        before = {s: tuple(t.data_ptr() for t in bufs) for s, bufs in launcher._workspaces.items()}
        scratch, accum = launcher._shared(torch.empty(b, h, sq, d), stream=7)
        pad = -(-sq // 128) * 128
        assert tuple(scratch.shape) == (2, b, h, pad) and tuple(accum.shape) == (b, h, pad if tiled else sq, d)
        need = [scratch.numel(), accum.numel()]
        grew = [n > m for n, m in zip(need, largest)]
        largest = [max(n, m) for n, m in zip(need, largest)]
        assert [t.numel() for t in launcher._workspaces[7]] == largest
        if 7 in before and not any(grew):
            assert tuple(t.data_ptr() for t in launcher._workspaces[7]) == before[7]
        assert math.prod(scratch.shape) <= launcher._workspaces[7][0].numel()


def test_the_tuners_backward_kernel_is_the_shipped_launcher_without_a_second_packing() -> None:
    import inspect

    from tuner.runtime import backward_launch
    from tuner.runtime.shipped.backward_kernel import BackwardLauncher

    assert issubclass(backward_launch.BackwardKernel, BackwardLauncher)
    source = inspect.getsource(backward_launch)
    assert "data_ptr" not in source and ".launch(" not in source


@pytest.mark.parametrize("damage, why", [
    ("unknown_kernel", "names no backward kernel of the kernels table"),
    ("forward_as_backward", "names no backward kernel of the kernels table"),
    ("no_threads", "launch lacks positive integers"),
    ("backward_as_forward", "is not a forward kernel"),
])
def test_a_package_whose_backward_record_is_broken_is_refused_on_import(exported, tmp_path, damage, why) -> None:
    """A sealed manifest (past the hash check) whose backward records do not hold together: one IntegrityError."""
    from tuner.export.package import seal

    report = exported[0]
    name = f"broken_{uuid.uuid4().hex[:8]}"
    shutil.copytree(report.out / report.package, tmp_path / name)
    path = tmp_path / name / "manifest.json"
    m = json.loads(path.read_text())
    m["package"] = name
    entry = next(e for e in m["entries"] if e["backward"])
    backward = m["kernels"][entry["backward"]["kernel"]]
    if damage == "unknown_kernel":
        entry["backward"]["kernel"] = "attn_bwd_nowhere"
    elif damage == "forward_as_backward":
        entry["backward"]["kernel"] = entry["kernel"]
    elif damage == "no_threads":
        del backward["launch"]["threads"]
    else:
        entry["kernel"] = entry["backward"]["kernel"]
    path.write_text(json.dumps(m))
    seal(tmp_path / name)
    with pytest.raises(ImportError) as info:
        import_exported(tmp_path, name)
    assert type(info.value).__name__ == "IntegrityError" and why in str(info.value) and "\n" not in str(info.value)
