"""`tuner search --pass backward|both` (issue 40, item 3) on the CPU: the pass in the problem (label, study key,
store row), the default backward template per card, the search of a backward problem through the replay backend
on a synthetic recording, and `results`, `show` and the report naming the pass."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_tuner
from tuner.backends.synthetic import write_synthetic_recording
from tuner.errors import TunerError
from tuner.kernels.feasibility import default_template
from tuner.problem import Problem, problem_from_shape
from tuner.profiles import load_profile
from tuner.search.options import SearchOptions, validate_options
from tuner.search.samplers import study_name
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store

SHAPE = "1,4,256,64"
FORWARD = problem_from_shape(SHAPE)
BACKWARD = problem_from_shape(SHAPE, kernel_pass="backward")


def test_the_pass_is_part_of_a_problem() -> None:
    assert FORWARD != BACKWARD and FORWARD.kernel_pass == "forward"
    assert BACKWARD.label == FORWARD.label + " backward"
    assert BACKWARD.flops == pytest.approx(2.5 * FORWARD.flops)
    assert Problem.from_dict(BACKWARD.to_dict()) == BACKWARD
    old = {k: v for k, v in FORWARD.to_dict().items() if k != "kernel_pass"}  # written before the pass existed
    assert Problem.from_dict(old) == FORWARD
    with pytest.raises(TunerError, match="unsupported pass 'sideways'"):
        Problem(1, 1, 1, 1, 64, kernel_pass="sideways")


def test_a_backward_study_has_its_own_name() -> None:
    forward, backward = (study_name("h100", "t", p) for p in (FORWARD, BACKWARD))
    assert backward == forward + "-backward"


@pytest.mark.parametrize("gpu, head_dim, template", [
    ("h100", 64, "attn_bwd_wgmma"), ("h200", 128, "attn_bwd_wgmma"), ("h100", 32, "attn_bwd_mma"),
    ("a100", 64, "attn_bwd_mma"), ("l4", 128, "attn_bwd_mma")])
def test_the_default_backward_template_follows_the_card(gpu: str, head_dim: int, template: str) -> None:
    profile = load_profile(gpu)
    problem = Problem(1, 4, 256, 256, head_dim, kernel_pass="backward")
    assert default_template(profile, [problem], list(profile.templates_for("backward"))) == template
    assert profile.templates_for("forward") == profile.templates


def test_bad_pass_options_are_one_line_errors() -> None:
    with pytest.raises(TunerError, match="unknown pass 'sideways'"):
        validate_options(SearchOptions(kernel_pass="sideways"))
    with pytest.raises(TunerError, match="--pass both tunes two templates"):
        validate_options(SearchOptions(kernel_pass="both", template="attn_fwd_mma"))


def test_an_unknown_pass_on_the_command_line_is_refused() -> None:
    result = run_tuner("search", "--gpu", "h100", "--shape", SHAPE, "--pass", "sideways", "--backend", "replay",
                       "--from", "sqlite:///nowhere.db")
    assert result.exit_code == 2 and "unknown pass 'sideways'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_profiling_the_backward_is_refused_in_one_line() -> None:
    result = run_tuner("search", "--gpu", "h100", "--shape", SHAPE, "--pass", "backward", "--profile-top", "1")
    assert result.exit_code == 2 and "--profile-top profiles forward kernels only" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_backward_head_dim_no_template_takes_is_a_one_line_error(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/rec.db"
    write_synthetic_recording(url, [BACKWARD], profile="h100", template="attn_bwd_mma")
    result = run_tuner("--db", f"sqlite:///{tmp_path}/out.db", "search", "--gpu", "h100", "--shape", "1,4,256,96",
                       "--pass", "backward", "--backend", "replay", "--from", url, "--trials", "2")
    assert result.exit_code == 2, result.stderr
    assert "cannot tune B1 H4 S256 D96 fp16 backward: head dim 96 unsupported by attn_bwd_mma" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_forward_template_cannot_tune_the_backward(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/rec.db"
    write_synthetic_recording(url, [BACKWARD], profile="h100", template="attn_bwd_mma")
    result = run_tuner("--db", f"sqlite:///{tmp_path}/out.db", "search", "--gpu", "h100", "--shape", SHAPE,
                       "--pass", "backward", "--template", "attn_fwd_mma", "--backend", "replay", "--from", url)
    assert result.exit_code == 2
    assert "attn_fwd_mma is a forward template, not a backward one" in result.stderr


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """`tuner search --pass both` of one problem, replayed from a synthetic recording of its forward (attn_fwd_mma)
    and backward (attn_bwd_mma) on an A100 (whose default templates those are)."""
    tmp = tmp_path_factory.mktemp("pass")
    rec, db = f"sqlite:///{tmp}/rec.db", f"sqlite:///{tmp}/out.db"
    write_synthetic_recording(rec, [FORWARD], profile="a100", template="attn_fwd_mma", gpu_name="NVIDIA A100-SXM4-80GB")
    write_synthetic_recording(rec, [BACKWARD], profile="a100", template="attn_bwd_mma",
                              gpu_name="NVIDIA A100-SXM4-80GB")
    result = run_tuner("--db", db, "search", "--gpu", "a100", "--shape", SHAPE, "--pass", "both", "--backend",
                       "replay", "--from", rec, "--trials", "4", "--seed", "1", "--confirm", "0")
    assert result.exit_code == 0, result.stderr
    return db, result


def test_both_passes_are_searched_and_stored_apart(searched) -> None:
    db, result = searched
    assert "backward" in result.stdout and "-backward" in result.stdout  # the summary's problem and study
    with open_store(db, create=False) as store:
        forward = store.query_trials(TrialFilter(problem=FORWARD))
        backward = store.query_trials(TrialFilter(problem=BACKWARD))
        baselines = store.trial_detail(backward[0].id).baselines
    measured = [r for r in forward + backward if r.status is not TrialStatus.PRUNED]  # infeasible points are free
    assert len(measured) == 8 and {r.problem for r in measured} == {FORWARD, BACKWARD}
    assert {r.template for r in forward} == {"attn_fwd_mma"} and {r.template for r in backward} == {"attn_bwd_mma"}
    assert {r.study for r in backward} == {"a100-attn_bwd_mma-B1H4S256S256D64-fp16-backward"}
    # A backward is timed against SDPA's flash and cuDNN backward (FA4's where it runs), not the efficient one.
    assert {b.impl for b in baselines} == {"sdpa_flash", "sdpa_cudnn"}


def test_results_filter_and_show_name_the_pass(searched) -> None:
    db, _ = searched
    table = run_tuner("--db", db, "results", "--pass", "backward")
    assert table.exit_code == 0, table.stderr
    assert "backward" in table.stdout
    rows = json.loads(run_tuner("--db", db, "results", "--pass", "forward", "--format", "json").stdout)
    assert rows and {(r["problem"]["kernel_pass"], r["template"]) for r in rows} == {("forward", "attn_fwd_mma")}
    backward = json.loads(run_tuner("--db", db, "results", "--pass", "backward", "--format", "json").stdout)
    assert backward and {(r["problem"]["kernel_pass"], r["template"]) for r in backward} == {("backward",
                                                                                             "attn_bwd_mma")}
    bad = run_tuner("--db", db, "results", "--pass", "sideways")
    assert bad.exit_code == 2 and "unknown pass 'sideways'" in bad.stderr
    shown = run_tuner("--db", db, "show", str(backward[0]["id"]))
    assert shown.exit_code == 0, shown.stderr
    assert "problem: B1 H4 S256 D64 fp16 backward (layout bhsd, backward pass)" in shown.stdout


def test_the_report_names_the_pass(searched, tmp_path) -> None:
    db, _ = searched
    result = run_tuner("--db", db, "report", "--gpu", "a100", "--out", str(tmp_path / "report"))
    assert result.exit_code == 0, result.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "D64 fp16 backward" in text


def test_a_store_from_before_the_pass_upgrades_and_its_problems_are_forwards(tmp_path) -> None:
    from tests.store_factories import H100, trial
    from tuner.store.schema import downgrade_store, upgrade_store

    url = f"sqlite:///{tmp_path}/old.db"
    with open_store(url) as store:
        store.add_trial(trial(store.start_run(H100), FORWARD))
    downgrade_store(url, "0011")  # the schema before the pass: no problems.pass column
    with pytest.raises(TunerError, match="run `tuner db upgrade`"):
        open_store(url)
    assert upgrade_store(url)[0] == "0011"
    with open_store(url) as store:
        assert [r.problem for r in store.query_trials(TrialFilter())] == [FORWARD]
        store.add_trial(trial(store.start_run(H100), BACKWARD))  # the same shape's backward: another problem row
        assert {r.problem for r in store.query_trials(TrialFilter(kernel_pass="backward"))} == {BACKWARD}
        assert {r.problem for r in store.query_trials(TrialFilter(kernel_pass="forward"))} == {FORWARD}


def test_a_backward_search_on_hopper_takes_the_wgmma_template_and_confirms(tmp_path) -> None:
    rec, db = f"sqlite:///{tmp_path}/rec.db", f"sqlite:///{tmp_path}/out.db"
    write_synthetic_recording(rec, [BACKWARD], profile="h100", template="attn_bwd_wgmma")
    result = run_tuner("--db", db, "search", "--gpu", "h100", "--shape", SHAPE, "--pass", "backward", "--backend",
                       "replay", "--from", rec, "--trials", "3", "--seed", "0")
    assert result.exit_code == 0, result.stderr
    with open_store(db, create=False) as store:
        rows = [r for r in store.query_trials(TrialFilter(kernel_pass="backward"))
                if r.status is not TrialStatus.PRUNED]
        confirmed = store.confirmed(BACKWARD, "h100")
    assert len(rows) == 3 and {r.template for r in rows} == {"attn_bwd_wgmma"}
    assert {r.study for r in rows} == {"h100-attn_bwd_wgmma-B1H4S256S256D64-fp16-backward"}
    assert confirmed is not None and confirmed.variant_name.startswith("attn_bwd_wgmma_")


def test_both_passes_share_a_time_budget_and_an_interrupt_stops_both(monkeypatch) -> None:
    from tuner.search import run

    asked = []

    def fake(options, console=None, hooks=None):
        asked.append((options.kernel_pass, options.time_budget_s))
        return run.SearchReport([], [len(asked)], [options.kernel_pass], interrupted=interrupt, measured=1, reused=0,
                                asked=1, wall_s=20.0)

    monkeypatch.setattr(run, "run_search", fake)
    interrupt = False
    report = run._search_both(SearchOptions(kernel_pass="both", time_budget_s=100.0), None, None)
    assert asked == [("forward", 50.0), ("backward", 80.0)]
    assert report.studies == ["forward", "backward"] and report.measured == 2 and report.wall_s == 40.0
    asked.clear()
    interrupt = True
    assert run._search_both(SearchOptions(kernel_pass="both"), None, None).interrupted
    assert asked == [("forward", None)]
