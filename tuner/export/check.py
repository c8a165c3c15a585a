"""tuner export --check: measure every dispatch cell of a written package on this GPU.

For each cell (tuner.export.check_cells) the candidate kernels, loaded from
the package itself (the shipped cubins, the shipped launcher), are verified
against the fp32 reference (with the cell's window and softcap), then timed in interleaved rounds with
what the cell would otherwise run: every SDPA backend that takes the shape (under the package's window mask
for a windowed cell), or for a softcapped cell the package's torch softcap implementation, all in one child
process. The fastest kernel keeps the cell if its median per-round ratio to the best backend reaches
ROUTE_BELOW; otherwise the cell runs that fallback. The records land in the package's manifest.json under "checked"
(manifest.json is not among the hashed files: it holds the hashes).
An e4m3 cell (tuner.export.check_fp8) runs its kernels on FP8 inputs with their descales, checks them against the
fp32 reference on the real values, and times them against its fallback: dequantise to bfloat16, then SDPA.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from tuner.errors import TunerError
from tuner.export import check_fp8
from tuner.export.check_cells import CheckCell, check_cells, decide, median_ratios
from tuner.problem import Problem
from tuner.profiles import GpuProfile

ROUNDS = 5  # interleaved rounds per cell: a ratio counts as the median per-round ratio


def require_gpu_for(profile: GpuProfile) -> int:
    """The device index to check on: a GPU of the profile's compute capability, else a one-line TunerError."""
    import torch

    if not torch.cuda.is_available():
        raise TunerError("tuner export --check times the kernels on the GPU: no CUDA device is visible here "
                         "(export without --check, or run it on the GPU machine)")
    device = torch.cuda.current_device()
    cc = torch.cuda.get_device_capability(device)
    if tuple(cc) != tuple(profile.compute_capability):
        raise TunerError(f"tuner export --check for profile {profile.name} needs compute capability "
                         f"{profile.compute_capability[0]}.{profile.compute_capability[1]}; cuda:{device} "
                         f"({torch.cuda.get_device_name(device)}) has {cc[0]}.{cc[1]}")
    return device


def _import_package(root: Path, name: str) -> Any:
    """The written package, imported from `root` (its own integrity check runs on import)."""
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(root))


def _kernel_runs(pkg: Any, cell: CheckCell, q: Any, k: Any, v: Any, ref: Any, errors: dict[str, str],
                 descales: Any = None) -> dict[str, Callable[[], Any]]:
    """A launch closure per candidate kernel that takes the shape and verifies; why the others do not.
    `descales`: an e4m3 cell's (q_descale, k_descale, v_descale); its kernels write bfloat16."""
    import torch

    from tuner.runtime.verify import TOLERANCE, empty_output, relative_error

    kernels = importlib.import_module(f"{pkg.__name__}._runtime.kernels")
    limit = TOLERANCE[cell.problem.dtype]
    runs: dict[str, Callable[[], Any]] = {}
    for entry in cell.candidates:
        name = entry["kernel"]
        kernel = kernels.load_kernel(name, q.get_device())
        out = empty_output(q) if descales is None else torch.empty_like(q, dtype=torch.bfloat16).fill_(float("nan"))
        try:
            kernel(q, k, v, out, descales=descales)
        except pkg.AttentionInputError as exc:
            errors[name] = f"does not take the shape: {exc}"
            continue
        err = relative_error(out, ref)
        if not err < limit:
            errors[name] = f"relative error {err:.2e} >= {limit:g}"
            continue
        runs[name] = lambda kernel=kernel, out=out: kernel.launch_unchecked(q, k, v, out, None, None, None, descales)
    return runs


def fallback_baselines(pkg: Any, problem: Problem, q: Any, k: Any, v: Any, descales: Any = None) -> list[Any]:
    """What a routed cell of `problem` runs instead of a kernel, timed as baselines: every SDPA backend that takes
    it (FlashAttention-4 left out: the fallback is SDPA); for a window, each under the package's own window mask;
    for a softcap, the package's torch softcap implementation (SDPA has none). An e4m3 cell's (FP8 q, k, v with
    `descales`): the same on the inputs dequantised to bfloat16, the dequantisation inside each timed call."""
    from tuner.runtime.baselines import SDPA_BACKENDS, Baseline, available_baselines, sdpa_baseline

    if descales is not None:
        buffers = check_fp8.dequantised(pkg, q, k, v, descales)
        found = fallback_baselines(pkg, dataclasses.replace(problem, dtype="bf16"), *buffers)
        return check_fp8.dequantising(pkg, found, q, k, v, descales, buffers)
    if not problem.local and not problem.softcap:
        return available_baselines(problem, q, k, v, fa4=False)
    masked = importlib.import_module(f"{pkg.__name__}._runtime.masked")
    mask = (problem.window_left, problem.window_right, problem.softcap)
    if problem.softcap:
        return [Baseline("torch_softcap", lambda: masked.fallback(q, k, v, problem.causal, None, mask), None)]
    kept = masked.keys_kept(problem.seq_q, problem.seq_k, problem.causal, mask[:2], q.device)
    found = []
    for name in SDPA_BACKENDS:
        try:
            found.append(sdpa_baseline(name, q, k, v, problem.causal, None, kept))
        except RuntimeError:  # a backend that takes no boolean mask (flash): not what the fallback runs
            continue
    return found


def measure_cell(pkg: Any, cell: CheckCell, l2_bytes: int, rounds: int = ROUNDS) -> dict[str, Any]:
    """Verify and time one cell's kernels against SDPA in `rounds` interleaved rounds; its manifest record.

    Each timing is a trial's (25 ms warm-up, 100 ms of repetitions, L2 flushed): shorter ones read a
    sustained kernel faster than it runs once the card reaches its power limit, and not every kernel
    by as much (cuDNN read 14% faster at 30 ms on an H100 at B1 S16384 D128, the tuned kernel 2%).
    """
    import torch

    from tuner.runtime.timing import interleaved_rounds, time_cuda
    from tuner.runtime.fp8 import dequantized_inputs
    from tuner.runtime.verify import fp8_inputs, make_inputs, problem_reference

    if cell.problem.fp8:  # FP8 inputs, their descales, and their real values for the reference
        q, k, v, descales = fp8_inputs(cell.problem, seed=0)
        ref, _ = problem_reference(cell.problem, *dequantized_inputs(q, k, v, descales))
    else:
        (q, k, v), descales = make_inputs(cell.problem, seed=0), None
        ref, _ = problem_reference(cell.problem, q, k, v)  # the cell's window and softcap too
    errors: dict[str, str] = {}
    runs = _kernel_runs(pkg, cell, q, k, v, ref, errors, descales)
    del ref
    baselines = fallback_baselines(pkg, cell.problem, q, k, v, descales)  # what a routed cell runs: compare with it
    calls: dict[str, Callable[[], Any]] = {
        **{name: (lambda fn=fn: time_cuda(fn, l2_bytes=l2_bytes)) for name, fn in runs.items()},
        **{b.name: (lambda b=b: b.time(l2_bytes=l2_bytes)) for b in baselines}}
    timed = interleaved_rounds(calls, rounds)
    torch.cuda.synchronize()
    names = [b.name for b in baselines]
    ratios = median_ratios(timed, list(runs), names) if names else {n: 1.0 for n in runs}
    medians = {n: statistics.median(t) for n, t in timed.items()}
    return decide(cell, ratios, {n: medians[n] for n in names}, errors, {n: medians[n] for n in runs})


def check_package(root: Path, name: str, profile: GpuProfile, progress: Callable[[dict[str, Any]], None]
                  = lambda record: None) -> list[dict[str, Any]]:
    """Measure every cell of the package `root/name` and record the results in its manifest.json.

    The cells are measured in a child process that imports the package as a user would: this process
    never imports it, so a later import here reads the checked manifest (a package's torch op can be
    registered once per process).
    """
    require_gpu_for(profile)
    path = root / name / "manifest.json"
    manifest = json.loads(path.read_text())
    records: list[dict[str, Any]] = []
    header: dict[str, Any] = {}
    with tempfile.TemporaryFile("w+") as errors:  # a file, not a pipe: warnings cannot block the child
        child = subprocess.Popen([sys.executable, "-m", "tuner.export.check", str(root), name, str(profile.l2_bytes)],
                                 stdout=subprocess.PIPE, stderr=errors, text=True)
        assert child.stdout is not None
        for line in child.stdout:  # anything else the child prints is ignored
            if line.startswith(_CELL):
                records.append(json.loads(line[len(_CELL):]))
                progress(records[-1])
            elif line.startswith(_DONE):
                header = json.loads(line[len(_DONE):])
        child.wait()
        errors.seek(0)
        stderr = errors.read()
    if child.returncode != 0 or not header:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {child.returncode}"
        raise TunerError(f"export --check failed while measuring the cells of {name}: {last}")
    manifest["checked"] = {**header, "rounds": ROUNDS, "cells": records}
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return records


_CELL, _DONE = "@cell ", "@done "  # the child's line prefixes: a measured cell, then where it was measured


def _measure_all(root: Path, name: str, l2_bytes: int) -> None:
    """The child: import the package, measure each cell, print one record line per cell, then the header."""
    import torch

    pkg = _import_package(root, name)
    for cell in check_cells(pkg.MANIFEST["entries"]):
        print(_CELL + json.dumps(measure_cell(pkg, cell, l2_bytes)), flush=True)
    device = torch.cuda.current_device()
    header = {"gpu_name": torch.cuda.get_device_name(device), "torch_version": torch.__version__,
              "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    print(_DONE + json.dumps(header), flush=True)


if __name__ == "__main__":
    _measure_all(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
