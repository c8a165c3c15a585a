"""ncu integration without a GPU: command line, raw-CSV parsing, and profile_trial with a fake ncu."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from cli_helpers import run_tuner

from tuner.errors import TunerError
from tuner.kernels.variant import Variant, parse_variant_name
from tuner.problem import Problem
from tuner.reporting.profiling import METRICS, ncu_command, parse_ncu_csv, profile_top, profile_trial, trial_range_name
from tuner.runtime.nvtx import ncu_include, range_name
from tuner.runtime.timed import Timing
from tuner.status import TrialStatus
from tuner.store import RunInfo, TrialRecord, open_store

DATA = Path(__file__).parent / "data"
SAMPLE = (DATA / "ncu_raw_sample.csv").read_text()
SAMPLE_KERNEL = "attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s2_qreg"
PROBLEM = Problem(16, 16, 2048, 2048, 64)

# A stand-in for ncu: prints (or writes to --log-file) the sample CSV with the
# requested kernel's name, records its arguments, or runs the profiled program.
FAKE_NCU = r'''#!{python}
import json, os, subprocess, sys
VALUED = {{"--clock-control", "--nvtx-include", "--page", "--metrics", "--kernel-name", "--log-file"}}
args, opts, i = sys.argv[1:], {{}}, 0
while i < len(args) and args[i].startswith("--"):
    if args[i] in VALUED:
        opts[args[i]] = args[i + 1]; i += 2
    else:
        opts[args[i]] = True; i += 1
app = args[i:]
mode = os.environ.get("FAKE_NCU_MODE", "print")
if os.environ.get("FAKE_NCU_ARGS"):
    with open(os.environ["FAKE_NCU_ARGS"], "a") as f:
        f.write(json.dumps({{"argv": sys.argv[1:], "app": app}}) + "\n")
if mode == "run":
    sys.exit(subprocess.run(app).returncode)
if mode == "hang":  # like ncu stuck on its profiled child: both must die on timeout
    import time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.environ["FAKE_NCU_PIDS"], "w") as f:
        f.write(f"{{os.getpid()}} {{child.pid}}")
    time.sleep(120)
text = open({sample!r}).read().replace({kernel!r}, opts.get("--kernel-name", {kernel!r}))
if mode == "logfile" and "--log-file" in opts:
    open(opts["--log-file"], "w").write(text)
elif mode == "empty":
    print("==PROF== Disconnected from process 1\n==WARNING== No kernels were profiled.")
else:
    sys.stdout.write(text)
'''


def mma_variant(**overrides) -> Variant:
    # By name, so parameters added to the template later take their default values.
    base = parse_variant_name("attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s2_qreg")
    return Variant("attn_fwd_mma", 64, "fp16", False, {**base.params, **overrides})


def add_trial(store, run_id: int, variant: Variant, *, problem: Problem = PROBLEM, median_us: float = 100.0,
              status: TrialStatus = TrialStatus.OK) -> int:
    return store.add_trial(TrialRecord(
        run_id=run_id, problem=problem, template=variant.template, template_hash="h", params=variant.stored_params(),
        variant_name=variant.name, status=status, timing=Timing(median_us) if status is TrialStatus.OK else None,
    ))


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "ncu"
    script.write_text(FAKE_NCU.format(python=sys.executable, sample=str(DATA / "ncu_raw_sample.csv"), kernel=SAMPLE_KERNEL))
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_NCU_ARGS", str(tmp_path / "ncu_args.jsonl"))
    return script


@pytest.fixture
def stored(sqlite_url):
    """A store with one run on an H200 and one ok trial of the sample's variant."""
    with open_store(sqlite_url) as store:
        run_id = store.start_run(RunInfo(gpu_name="NVIDIA H200", profile="h200"))
        trial_id = add_trial(store, run_id, mma_variant())
        yield store, run_id, trial_id


# --- command line -------------------------------------------------------------------------------


def test_ncu_command_always_fixes_clock_control_and_filters_the_range(tmp_path) -> None:
    rng = trial_range_name(3, 17, SAMPLE_KERNEL)
    assert rng == f"run3/trial17/{SAMPLE_KERNEL}/profile"
    cmd = ncu_command(["python", "-m", "tuner.reporting.ncu_replay", "--x"], rng, METRICS, tmp_path / "out.csv",
                      ncu="/opt/ncu", kernel_name=SAMPLE_KERNEL)
    assert cmd[0] == "/opt/ncu"
    i = cmd.index("--clock-control")
    assert cmd[i + 1] == "none"
    assert "--nvtx" in cmd
    inc = cmd[cmd.index("--nvtx-include") + 1]
    assert inc == "run3\\/trial17\\/" + SAMPLE_KERNEL + "\\/profile/"  # one range with slashes in its name
    assert cmd[cmd.index("--csv"):cmd.index("--csv") + 3] == ["--csv", "--page", "raw"]
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(METRICS)
    assert cmd[cmd.index("--kernel-name") + 1] == SAMPLE_KERNEL
    assert cmd[cmd.index("--log-file") + 1] == str(tmp_path / "out.csv")
    assert cmd[-4:] == ["python", "-m", "tuner.reporting.ncu_replay", "--x"]
    bare = ncu_command(["app"], "r", ["gpu__time_duration.sum"])
    assert bare == ["ncu", "--clock-control", "none", "--nvtx", "--nvtx-include", "r/", "--csv", "--page", "raw",
                    "--metrics", "gpu__time_duration.sum", "app"]
    with pytest.raises(TunerError):
        ncu_command(["app"], "r", [])


def test_range_names_and_include_expressions() -> None:
    assert range_name("run1/trial2", "v", "verify") == "run1/trial2/v/verify"
    assert range_name("", "v", "time") == "v/time"
    assert range_name(None, "sdpa_flash", "time") == "sdpa_flash/time"
    assert ncu_include("a/b") == "a\\/b/"
    with pytest.raises(ValueError):
        ncu_include("dom@range")


def test_metric_set_names_the_counters_we_need() -> None:
    for name in ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
                 "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                 "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
                 "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
                 "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                 "sm__inst_executed_pipe_tensor_op_hmma.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"):
        assert name in METRICS


# --- CSV ----------------------------------------------------------------------------------------


def test_parse_raw_csv_averages_the_kernel_launches() -> None:
    metrics = {m.name: m for m in parse_ncu_csv(SAMPLE, METRICS, kernel=SAMPLE_KERNEL)}
    assert list(metrics) == [name for name in METRICS if name in metrics]  # requested order
    assert set(metrics) == set(METRICS)
    assert metrics["gpu__time_duration.sum"].value == pytest.approx((181408 + 183520) / 2)  # "181,408"
    assert metrics["gpu__time_duration.sum"].unit == "ns"
    assert metrics["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"].value == pytest.approx(2000)
    assert metrics["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"].unit is None  # empty unit
    assert metrics["l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"].value == 0  # "0" and "n/a"
    assert metrics["launch__registers_per_thread"].value == 168
    assert metrics["launch__registers_per_thread"].unit == "register/thread"
    assert metrics["sm__warps_active.avg.pct_of_peak_sustained_active"].value == pytest.approx(14.75)
    assert metrics["sm__inst_executed_pipe_tensor_op_hmma.sum"].value == 2097152


def test_parse_without_kernel_filter_and_default_columns() -> None:
    everything = {m.name: m.value for m in parse_ncu_csv(SAMPLE)}
    assert everything["launch__registers_per_thread"] == pytest.approx((168 + 168 + 16) / 3)
    assert everything["launch__grid_size"] == pytest.approx((4096 + 4096 + 1024) / 3)  # "1,024"
    assert not any(name.startswith("device__attribute") for name in everything)
    assert "Kernel Name" not in everything and "Block Size" not in everything


def test_parse_edge_cases() -> None:
    assert parse_ncu_csv("") == []
    assert parse_ncu_csv("==PROF== Disconnected\n==WARNING== No kernels were profiled.\n") == []
    assert parse_ncu_csv(SAMPLE, METRICS, kernel="some_other_kernel") == []
    only = parse_ncu_csv(SAMPLE, ["gpu__time_duration.sum", "not__a_metric.sum"], kernel=SAMPLE_KERNEL)
    assert [m.name for m in only] == ["gpu__time_duration.sum"]
    header_only = '"ID","Kernel Name","gpu__time_duration.sum"\n"","","ns"\n'
    assert parse_ncu_csv(header_only) == []
    na = '"ID","Kernel Name","gpu__time_duration.sum","x__y.sum"\n"","","ns",""\n"0","k","n/a","1,234.5"\n'
    assert [(m.name, m.value, m.unit) for m in parse_ncu_csv(na)] == [("x__y.sum", 1234.5, None)]


# --- profile_trial / profile_top with a fake ncu ------------------------------------------------


def test_profile_trial_stores_metrics_and_show_lists_them(stored, fake_ncu, sqlite_url, tmp_path) -> None:
    store, run_id, trial_id = stored
    metrics = profile_trial(store, trial_id)
    assert {m.name for m in metrics} == set(METRICS)
    detail = store.trial_detail(trial_id)
    assert {m.name: (m.value, m.unit) for m in detail.ncu_metrics}["gpu__time_duration.sum"] == (182464.0, "ns")
    assert detail.median_us == 100.0  # ncu's duration is a metric, never the trial's timing
    [call] = [json.loads(line) for line in (tmp_path / "ncu_args.jsonl").read_text().splitlines()]
    argv, app = call["argv"], call["app"]
    assert argv[argv.index("--clock-control") + 1] == "none"
    assert argv[argv.index("--nvtx-include") + 1] == ncu_include(trial_range_name(run_id, trial_id, detail.variant_name))
    assert app[:3] == [sys.executable, "-m", "tuner.reporting.ncu_replay"]
    assert app[app.index("--arch") + 1] == "sm_90a"  # the h200 profile's arch
    assert json.loads(app[app.index("--params") + 1]) == detail.params
    assert Problem.from_dict(json.loads(app[app.index("--problem") + 1])) == PROBLEM
    assert app[app.index("--expect-gpu") + 1] == "NVIDIA H200"

    shown = run_tuner("--db", sqlite_url, "show", str(trial_id), env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.stderr
    assert "ncu metrics" in shown.stdout
    assert "gpu__time_duration" in shown.stdout and "182464" in shown.stdout
    # In 80 columns the names (up to 70 characters) give way to what they count, never cut mid-word.
    narrow = run_tuner("--db", sqlite_url, "show", str(trial_id), env={"COLUMNS": "80"}).stdout
    assert "kernel duration under the profiler" in narrow and "182464" in narrow
    table = narrow.split("ncu metrics\n", 1)[1].splitlines()
    assert len(table) == 2 + len(METRICS) and all(len(line) <= 80 for line in table), narrow
    as_json = run_tuner("--db", sqlite_url, "show", str(trial_id), "--format", "json")
    listed = {m["name"]: m["value"] for m in json.loads(as_json.stdout)["ncu_metrics"]}
    assert listed["sm__warps_active.avg.pct_of_peak_sustained_active"] == pytest.approx(14.75)
    assert set(listed) == set(METRICS)


def test_profile_trial_reads_ncu_log_file(stored, fake_ncu, monkeypatch) -> None:
    store, _, trial_id = stored
    monkeypatch.setenv("FAKE_NCU_MODE", "logfile")
    assert len(profile_trial(store, trial_id)) == len(METRICS)


def test_profile_cli_table_and_json(stored, fake_ncu, sqlite_url) -> None:
    _, _, trial_id = stored
    table = run_tuner("--db", sqlite_url, "profile", str(trial_id))
    assert table.exit_code == 0, table.stderr
    assert f"trial {trial_id}" in table.stdout and "achieved occupancy" in table.stdout
    as_json = run_tuner("--db", sqlite_url, "profile", str(trial_id), "--format", "json")
    assert as_json.exit_code == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert {m["name"] for m in data[str(trial_id)]} == set(METRICS)
    both = run_tuner("--db", sqlite_url, "profile", str(trial_id), "--top", "2")
    assert both.exit_code == 2 and "either" in both.stderr
    neither = run_tuner("--db", sqlite_url, "profile")
    assert neither.exit_code == 2 and "either" in neither.stderr


def test_missing_ncu_is_one_line_error(stored, tmp_path, monkeypatch, sqlite_url) -> None:
    store, _, trial_id = stored
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(TunerError, match="ncu") as info:
        profile_trial(store, trial_id)
    assert "\n" not in str(info.value)
    cli = run_tuner("--db", sqlite_url, "profile", str(trial_id))
    assert cli.exit_code == 2
    assert cli.stderr.startswith("error: ncu (Nsight Compute) not found") and cli.stderr.count("\n") == 1
    with pytest.raises(TunerError, match="not found"):
        profile_top(store, None, 1)


def test_no_kernel_profiled_is_an_error_and_stores_nothing(stored, fake_ncu, monkeypatch) -> None:
    store, _, trial_id = stored
    monkeypatch.setenv("FAKE_NCU_MODE", "empty")
    with pytest.raises(TunerError, match="measured no kernel"):
        profile_trial(store, trial_id)
    assert store.trial_detail(trial_id).ncu_metrics == []


def test_replay_without_gpu_reports_why(stored, fake_ncu, monkeypatch) -> None:
    """The fake ncu runs the real replay program; on this GPU-less machine it must fail in one line."""
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    store, _, trial_id = stored
    monkeypatch.setenv("FAKE_NCU_MODE", "run")
    with pytest.raises(TunerError) as info:
        profile_trial(store, trial_id)
    message = str(info.value)
    assert "\n" not in message and "measured no kernel" in message
    assert "error:" in message and ("GPU" in message or "pycuda" in message)


def _alive(pid: int) -> bool:
    """Whether pid is a running process (a zombie waiting for its reaper counts as gone)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_ncu_timeout_kills_ncu_and_its_child(stored, fake_ncu, monkeypatch, tmp_path) -> None:
    import time

    store, _, trial_id = stored
    pids_file = tmp_path / "pids"
    monkeypatch.setenv("FAKE_NCU_MODE", "hang")
    monkeypatch.setenv("FAKE_NCU_PIDS", str(pids_file))
    start = time.monotonic()
    with pytest.raises(TunerError, match="did not finish within 2 s") as info:
        profile_trial(store, trial_id, timeout_s=2)
    assert time.monotonic() - start < 30 and "\n" not in str(info.value)
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10  # the orphaned child is reaped by init
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)
    assert store.trial_detail(trial_id).ncu_metrics == []


def test_only_ok_trials_are_profiled(stored, fake_ncu) -> None:
    store, run_id, _ = stored
    bad = add_trial(store, run_id, mma_variant(STAGES=3), status=TrialStatus.LAUNCH_ERROR)
    with pytest.raises(TunerError, match="launch_error"):
        profile_trial(store, bad)


def test_profile_top_picks_the_fastest_best_per_problem_then_fills(stored, fake_ncu) -> None:
    store, run_id, first = stored  # PROBLEM, 100 us
    small = Problem(1, 8, 512, 512, 64)
    slow = add_trial(store, run_id, mma_variant(STAGES=3), median_us=150.0)  # PROBLEM, not its best
    best_small = add_trial(store, run_id, mma_variant(STAGES=1), problem=small, median_us=20.0)
    add_trial(store, run_id, mma_variant(STAGES=3), problem=small, status=TrialStatus.INCORRECT)
    other_run = store.start_run(RunInfo(gpu_name="NVIDIA H200", profile="h200"))
    add_trial(store, other_run, mma_variant(BLOCK_N=32), median_us=1.0)  # faster, but another run

    one = profile_top(store, run_id, 1)
    assert list(one) == [best_small]
    two = profile_top(store, run_id, 2)
    assert list(two) == [best_small, first]
    three = profile_top(store, run_id, 5)  # only three ok trials in the run
    assert list(three) == [best_small, first, slow]
    assert all(len(m) == len(METRICS) for m in three.values())
    assert store.trial_detail(slow).ncu_metrics  # stored
    top_cli = run_tuner("--db", store.url, "profile", "--top", "1", "--run", str(run_id), "--format", "json")
    assert top_cli.exit_code == 0, top_cli.stderr
    assert list(json.loads(top_cli.stdout)) == [str(best_small)]
    empty_run = store.start_run(RunInfo(gpu_name="NVIDIA H200", profile="h200"))
    with pytest.raises(TunerError, match="no ok trials"):
        profile_top(store, empty_run, 3)
