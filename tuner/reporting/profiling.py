"""Nsight Compute (ncu) counters of stored trials.

`profile_trial` replays one stored trial in a child Python process under ncu:
the child (`python -m tuner.reporting.ncu_replay ...`, see `replay_trial`) builds the trial's variant for its GPU profile (from the compile cache),
makes inputs, and launches the kernel a few times inside one NVTX range;
ncu profiles only the kernels in that range (`--nvtx-include`), with
`--clock-control none` so the card keeps the clocks it was tuned at. The raw
CSV page is parsed into NcuMetric rows and stored with the trial. ncu's
duration is stored as a metric only, never as the trial's median: replayed
kernels under a profiler are not the timing discipline of tuner.runtime.timing.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from tuner.errors import TunerError
from tuner.profiles import load_profile
from tuner.reporting.ncu_replay import DEFAULT_LAUNCHES
from tuner.runtime.nvtx import ncu_include, range_name
from tuner.status import TrialStatus
from tuner.store.records import NcuMetric, TrialFilter

__all__ = [
    "METRICS",
    "ncu_command",
    "parse_ncu_csv",
    "profile_top",
    "profile_trial",
    "trial_range_name",
]

# The counters collected for every profiled trial (names checked with
# `ncu --query-metrics --chip gh100`, Nsight Compute 2025.3) and what they show.
METRICS: dict[str, str] = {
    "gpu__time_duration.sum": "kernel duration under the profiler",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM throughput, % of peak",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM throughput, % of peak",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy, % of the warps an SM can hold",
    "launch__registers_per_thread": "registers per thread",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "shared-memory bank conflicts, loads",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "shared-memory bank conflicts, stores",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": "local-memory (spill) bytes loaded",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": "local-memory (spill) bytes stored",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe (HMMA) busy, % of active cycles",
    "sm__inst_executed_pipe_tensor_op_hmma.sum": "HMMA instructions executed",
}

NCU_TIMEOUT_S = 900.0
_KERNEL_COLUMN = "Kernel Name"
_ID_COLUMN = "ID"


# ---------------------------------------------------------------------------------------------
# Command line and CSV


def ncu_command(python_args: Sequence[str], range_name: str, metrics: Iterable[str] = tuple(METRICS),
                out_csv: Optional[str | os.PathLike[str]] = None, *, ncu: str = "ncu",
                kernel_name: Optional[str] = None) -> list[str]:
    """The ncu command that profiles the kernels inside the NVTX range `range_name` of a program.

    Always `--clock-control none`: ncu would otherwise lock the clocks to
    base, and the counters would describe another card than the one timed.
    With `out_csv`, ncu's output (the CSV) goes to that file, apart from the
    program's own output.
    """
    metric_list = ",".join(metrics)
    if not metric_list:
        raise TunerError("ncu needs at least one metric")
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", ncu_include(range_name),
           "--csv", "--page", "raw", "--metrics", metric_list]
    if kernel_name:
        cmd += ["--kernel-name", kernel_name]
    if out_csv is not None:
        cmd += ["--log-file", str(out_csv)]
    return cmd + [str(a) for a in python_args]


def _number(text: str) -> Optional[float]:
    """ncu's number format ("1,234.5", "n/a", "") -> float or None."""
    text = text.strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan", "-"):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV part of ncu's output: from the header ("ID", ...) on, without ==PROF==/==WARNING== lines."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if line.startswith(f'"{_ID_COLUMN}",'):
            break
    else:
        return []
    body = [line for line in lines[start:] if line.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(body))))


def _is_metric_column(name: str) -> bool:
    return "__" in name and not name.startswith(("device__attribute", "nvlink__", "numa__", "profiler__",
                                                   "c2clink__"))


def parse_ncu_csv(text: str, metrics: Optional[Iterable[str]] = None, kernel: Optional[str] = None) -> list[NcuMetric]:
    """Metrics from ncu's `--csv --page raw` output, averaged over the profiled kernel launches.

    The raw page is a header row of metric names, a row of units, then one
    row per profiled kernel launch; numbers may carry thousands separators
    and missing values read "n/a". `metrics` selects columns (default: every
    numeric metric column); `kernel` keeps only launches of that kernel.
    """
    rows = _csv_rows(text)
    if len(rows) < 2:
        return []
    header, rest = rows[0], rows[1:]
    units = rest[0] if rest and rest[0] and rest[0][0] == "" else [""] * len(header)
    data = [r for r in rest if r and r[0] != "" and len(r) == len(header)]
    if kernel is not None and _KERNEL_COLUMN in header:
        col = header.index(_KERNEL_COLUMN)
        data = [r for r in data if r[col] == kernel or r[col].split("(")[0].strip() == kernel]
    if not data:
        return []
    wanted = list(metrics) if metrics is not None else [h for h in header if _is_metric_column(h)]
    out = []
    for name in wanted:
        if name not in header:
            continue
        col = header.index(name)
        values = [v for v in (_number(r[col]) for r in data) if v is not None]
        if not values:
            continue
        unit = units[col].strip() if col < len(units) else ""
        out.append(NcuMetric(name, sum(values) / len(values), unit or None))
    return out


def _ncu_messages(text: str) -> list[str]:
    """ncu's own error lines (==ERROR== ...), and the program's last lines, for a one-line error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("==ERROR==")]
    app = [line for line in lines if not line.startswith(("==", '"'))]
    return errors + app[-1:]


# ---------------------------------------------------------------------------------------------
# Replay (runs inside the profiled process)


def trial_range_name(run_id: int, trial_id: int, variant_name: str) -> str:
    return range_name(f"run{run_id}/trial{trial_id}", variant_name, "profile")


def _replay_args(detail: Any, arch: str, nvtx_range: str, launches: int) -> list[str]:
    return [sys.executable, "-m", "tuner.reporting.ncu_replay", "--template", detail.template,
            "--params", json.dumps(dict(detail.params), sort_keys=True), "--problem", json.dumps(detail.problem.to_dict(), sort_keys=True),
            "--arch", arch, "--range", nvtx_range, "--launches", str(launches), "--expect-gpu", detail.gpu_name]


# ---------------------------------------------------------------------------------------------
# Services


def find_ncu(ncu: str = "ncu") -> str:
    path = shutil.which(ncu)
    if path is None:
        raise TunerError(f"ncu (Nsight Compute) not found{'' if os.sep in ncu else ' on PATH'}: {ncu}; install "
                         "Nsight Compute (it ships with the CUDA toolkit) or pass --ncu PATH")
    return path


def profile_trial(store: Any, trial_id: int, *, ncu: str = "ncu", launches: int = DEFAULT_LAUNCHES,
                  timeout_s: float = NCU_TIMEOUT_S) -> list[NcuMetric]:
    """Profile one stored ok trial under ncu on this machine's GPU and store its metrics."""
    detail = store.trial_detail(trial_id)
    if detail.status is not TrialStatus.OK:
        raise TunerError(f"trial {trial_id} is {detail.status.value}: only ok trials can be profiled")
    ncu_path = find_ncu(ncu)
    arch = load_profile(detail.profile).nvcc_arch
    nvtx_range = trial_range_name(detail.run_id, trial_id, detail.variant_name)
    with tempfile.TemporaryDirectory(prefix="tuner-ncu-") as tmp:
        out_csv = Path(tmp) / "ncu.csv"
        cmd = ncu_command(_replay_args(detail, arch, nvtx_range, launches), nvtx_range, METRICS, out_csv,
                          ncu=ncu_path, kernel_name=detail.variant_name)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_package_root(), os.environ.get("PYTHONPATH")]))}
        stdout, stderr, returncode = _run_ncu(cmd, env, timeout_s, ncu_path, trial_id)
        text = out_csv.read_text(errors="replace") if out_csv.exists() else ""
    metrics = parse_ncu_csv(text or stdout, METRICS, kernel=detail.variant_name)
    if not metrics:
        why = _ncu_messages("\n".join([text, stdout, stderr]))
        detail_text = "; ".join(why[-2:]) if why else f"ncu exited with code {returncode}"
        raise TunerError(f"ncu measured no kernel of trial {trial_id} ({detail.variant_name}): {detail_text}")
    store.add_ncu_metrics(trial_id, metrics)
    return metrics


def _run_ncu(cmd: Sequence[str], env: Mapping[str, str], timeout_s: float, ncu_path: str,
             trial_id: int) -> tuple[str, str, int]:
    """Run ncu in its own session; (stdout, stderr, exit code). A timeout kills the whole group.

    subprocess.run(timeout=...) kills ncu only, leaving its child (the replay, holding the GPU) alive.
    """
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env),
                                start_new_session=True)
    except OSError as exc:
        raise TunerError(f"cannot run ncu ({ncu_path}): {exc}") from None
    with proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise TunerError(f"ncu did not finish within {timeout_s:.0f} s profiling trial {trial_id}") from None
        except BaseException:  # e.g. Ctrl-C: its own session no longer gets the terminal's SIGINT
            _kill_group(proc)
            raise
    return stdout, stderr, proc.returncode


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass
    proc.wait()


def _package_root() -> str:
    """The folder holding the `tuner` package, so the profiled child imports this same code."""
    return str(Path(__file__).resolve().parent.parent)


def top_trials(store: Any, run_id: Optional[int], k: int, gpu: Optional[str] = None) -> list[Any]:
    """The k trials to profile: the best ok trial of each problem, fastest first, then the next fastest."""
    if k < 1:
        raise TunerError(f"--top must be a positive integer, got {k}")
    best = sorted(store.best_trials(TrialFilter(run_id=run_id, gpu=gpu)), key=lambda t: t.median_us)
    chosen = best[:k]
    if len(chosen) < k:
        seen = {t.id for t in chosen}
        others = [t for t in store.query_trials(TrialFilter(run_id=run_id, gpu=gpu, status=TrialStatus.OK))
                  if t.id not in seen and t.median_us is not None]
        chosen += sorted(others, key=lambda t: t.median_us)[: k - len(chosen)]
    if not chosen:
        where = f" in run {run_id}" if run_id is not None else ""
        raise TunerError(f"no ok trials to profile{where}{f' on {gpu}' if gpu else ''}")
    return chosen


def profile_top(store: Any, run_id: Optional[int], k: int, gpu: Optional[str] = None, *, ncu: str = "ncu",
                launches: int = DEFAULT_LAUNCHES) -> dict[int, list[NcuMetric]]:
    """Profile the k fastest ok trials (best per problem first) of a run, or of the whole store."""
    find_ncu(ncu)
    return {t.id: profile_trial(store, t.id, ncu=ncu, launches=launches) for t in top_trials(store, run_id, k, gpu)}


def metrics_to_json(results: Mapping[int, list[NcuMetric]]) -> dict[str, list[dict[str, Any]]]:
    return {str(tid): [asdict(m) for m in metrics] for tid, metrics in results.items()}

