"""An export trains with its tuned backward on a GPU (issue 40, item 4). A store holding, for each tuned problem, a
forward trial and a confirmed backward winner recorded faster than SDPA's backward (the profile's backward template,
its first covering variant, built here; made-up timings) is exported; the package is imported in a fresh process
(torch alone: tests/gpu/backward_package_run.py), where attention()'s backward must run the tuned kernel: dQ, dK and
dV against fp32 autograd within the backward trial's tolerance (causal and not, GQA, Sq != Sk, rows without keys,
BSHD), explain() naming both kernels, and a CUDA graph of forward and backward replayed on new data. A real short
`tuner search --pass both` then export checks the decision end to end.

    pytest -m gpu tests/gpu/test_export_backward_gpu.py -s
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tuner.problem import Problem

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

TUNED = [
    Problem(2, 4, 256, 256, 64, dtype="bf16"),
    Problem(2, 4, 256, 256, 64, dtype="bf16", causal=True),
    Problem(2, 4, 256, 256, 128, dtype="bf16"),
    Problem(2, 4, 256, 256, 128, dtype="bf16", causal=True),
]
# (b, h, hkv, sq, sk, d, causal, layout): the tuned entries serve any group and lengths (the nearest bucket)
CASES = [
    (2, 4, 4, 256, 256, 64, True, "bhsd"),      # first: also captured in a CUDA graph
    (2, 4, 4, 256, 256, 128, False, "bhsd"),
    (2, 8, 2, 256, 256, 128, True, "bhsd"),     # GQA 4: dK, dV summed over each group by the kernel
    (1, 4, 4, 200, 333, 64, False, "bhsd"),     # Sq != Sk, lengths off the tiles
    (1, 4, 2, 300, 200, 128, True, "bhsd"),     # causal Sq > Sk: rows that see no key
    (2, 4, 4, 256, 256, 64, True, "bshd"),      # BSHD views
]


def _case(c: tuple, seed: int) -> dict:
    b, h, hkv, sq, sk, d, causal, layout = c
    return dict(b=b, h=h, hkv=hkv, sq=sq, sk=sk, d=d, dtype="bfloat16", causal=causal, layout=layout, seed=seed)


def _problem(c: tuple) -> Problem:
    b, h, hkv, sq, sk, d, causal, layout = c
    return Problem(b, h, sq, sk, d, dtype="bf16", causal=causal, heads_kv=hkv, layout=layout)


def _record(store, run: int, problem: Problem, profile) -> str:
    """A forward trial of `problem` and a backward winner confirmed at 100/90 of SDPA's cuDNN backward; its name."""
    from tests.built_trials import add_built_trial
    from tuner.export.backward_selection import backward_problem
    from tuner.kernels.feasibility import covering_sample, default_template
    from tuner.store import ConfirmRecord

    forward = covering_sample(default_template(profile, [problem]), problem, profile)[0]
    add_built_trial(store, run, problem, forward, profile.nvcc_arch, 100.0, 2e-3)
    bwd = covering_sample(profile.templates_for("backward")[0], problem, profile)[0]
    bp = backward_problem(problem)
    trial = add_built_trial(store, run, bp, bwd, profile.nvcc_arch, 90.0, 4e-3)
    timings = {bwd.name: (trial, (90.0, 90.0, 90.0)), "sdpa_cudnn": (None, (100.0, 100.0, 100.0)),
               "sdpa_flash": (None, (120.0, 120.0, 120.0))}
    store.add_confirmation(ConfirmRecord(run_id=run, problem=bp, rounds=3, timings=timings, winner_trial_id=trial,
                                         winner_us=90.0, winner_ratio=100.0 / 90.0, baseline_impl="sdpa_cudnn"))
    return bwd.name


def _run_package(out: Path, name: str, cases: list[dict], tmp: Path) -> dict:
    import torch

    result = tmp / f"{name}.pt"
    done = subprocess.run([sys.executable, str(ROOT / "tests/gpu/backward_package_run.py"), str(out), name,
                           json.dumps(cases), str(result)], capture_output=True, text=True, cwd=tmp, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(result)


@pytest.fixture(scope="module")
def trained(gpu_profile, tmp_path_factory):
    """(backward kernel names by problem label, the package's report, what the fresh process saved)."""
    from tuner.export.run import ExportOptions, export
    from tuner.store import RunInfo, open_store

    base = tmp_path_factory.mktemp("export_backward_gpu")
    url = f"sqlite:///{base / 'results.db'}"
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name="test", profile=gpu_profile.name, host="test"))
        names = {p.label: _record(store, run, p, gpu_profile) for p in TUNED}
        store.finish_run(run)
    name = f"bwd_{uuid.uuid4().hex[:8]}"
    report = export(ExportOptions(gpu=gpu_profile.name, out=base / name, db_url=url))
    saved = _run_package(base / name, name, [_case(c, i) for i, c in enumerate(CASES)], base)
    return names, report, saved


def _check(problem: Problem, inputs: list, grads: list, what: str) -> None:
    from tuner.runtime.backward_trial import grad_tolerance
    from tuner.runtime.backward_verify import grad_error, grad_noise_floors, reference_grads

    q, k, v, do = (t.cuda() for t in inputs)
    ref = reference_grads(q, k, v, do, problem.causal)
    floors = grad_noise_floors(q, k, v, do, problem.causal)
    for label, got, want in zip(("dq", "dk", "dv"), grads, ref):
        assert got.dtype == q.dtype and got.shape == want.shape, (what, label)
        err = grad_error(got.cuda(), want, floors[label])
        assert err < grad_tolerance(problem), f"{what} {label}: error {err:.3g} >= {grad_tolerance(problem)}"


def test_every_tuned_problem_ships_its_backward(trained) -> None:
    names, report, _ = trained
    for entry in report.entries:
        assert entry["backward"]["kernel"] == names[entry["problem_label"]], entry
        assert entry["backward"]["ratio_to_sdpa"] == pytest.approx(100.0 / 90.0)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[_problem(c).label.replace(" ", "_") + "_" + c[-1]
                                                          for c in CASES])
def test_the_tuned_backward_runs_and_its_gradients_match_fp32_autograd(trained, index) -> None:
    names, _, saved = trained
    case, problem = saved["cases"][index], _problem(CASES[index])
    assert case["kind"] == "tuned", case["explain"]
    assert case["kernel"].startswith("attn_bwd_") and f"_d{problem.head_dim}_bf16_" in case["kernel"]
    assert case["kernel"].endswith("_causal") == problem.causal
    _check(problem, case["inputs"], case["grads"], "eager")
    assert all(case["layouts"]), "dq, dk, dv are laid out like q, k, v"
    assert f"backward: tuned backward kernel {case['kernel']}" in case["explain"]
    assert "  kernel: attn_fwd" in case["explain"] and f"backward kernel: {case['kernel']}" in case["explain"]


def test_a_cuda_graph_of_forward_and_backward_replays_with_correct_gradients(trained) -> None:
    graph = trained[2]["graph"]
    _check(_problem(CASES[0]), graph["inputs"], graph["grads"], "graph replay")


def test_the_package_trains_with_torch_alone(trained) -> None:
    assert trained[2]["tuner_imported"] == []


def test_a_short_search_of_both_passes_exports_its_backward_decision(gpu_profile, tmp_path) -> None:
    """`tuner search --pass both` (2 trials a pass, a short confirm stage) then export: each entry ships the
    confirmed backward winner exactly where its confirmed ratio to SDPA's best backward is above 1, and says why
    otherwise; a shipped one trains correctly in a fresh process."""
    from tests.cli_helpers import run_tuner
    from tuner.export.run import ExportOptions, export

    url = f"sqlite:///{tmp_path / 'both.db'}"
    res = run_tuner("--db", url, "search", "--gpu", gpu_profile.name, "--shape", "2,4,256,128", "--dtype", "bf16",
                    "--pass", "both", "--trials", "2", "--seed", "0", "--confirm", "2", "--confirm-rounds", "3")
    assert res.exit_code == 0, res.stderr[-3000:]
    name = f"both_{uuid.uuid4().hex[:8]}"
    report = export(ExportOptions(gpu=gpu_profile.name, out=tmp_path / name, db_url=url))
    (entry,) = report.entries
    shipped = entry["backward"]
    print("backward decision:", entry["backward_note"])
    if shipped is None:
        assert "not faster" in entry["backward_note"] or "no confirmed backward" in entry["backward_note"]
        return
    assert shipped["ratio_to_sdpa"] > 1.0
    saved = _run_package(tmp_path / name, name, [_case((2, 4, 4, 256, 256, 128, False, "bhsd"), 3)], tmp_path)
    assert saved["cases"][0]["kind"] == "tuned" and saved["cases"][0]["kernel"] == shipped["kernel"]
    _check(Problem(2, 4, 256, 256, 128, dtype="bf16"), saved["cases"][0]["inputs"], saved["cases"][0]["grads"],
           "searched")
