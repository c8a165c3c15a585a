"""tuner export --check: measure every dispatch cell of a written package on this GPU.

For each cell (tuner.export.check_cells) the candidate kernels, loaded from
the package itself (the shipped cubins, the shipped launcher), are verified
against the fp32 reference (with the cell's window and softcap), then timed in interleaved rounds with
what the cell would otherwise run: every SDPA backend that takes the shape (under the package's window mask
for a windowed cell), or for a softcapped cell the package's torch softcap implementation, all in one child
process. The fastest kernel keeps the cell if its median per-round ratio to the best backend reaches
ROUTE_BELOW; otherwise the cell runs that fallback. The records land in the package's manifest.json under "checked"
(and the package's __init__.py, the root of its import check, is sealed again with the manifest's new sha256).
An e4m3 cell (tuner.export.check_fp8) runs its kernels on FP8 inputs with their descales, checks them against the
fp32 reference on the real values, and times them against its fallback: dequantise to bfloat16, then SDPA.
A paged or ragged cell runs its kernels as the search timed its problem (tuner.backends.gpu_child: K/V copied into
shuffled pages, the batch's seeded key lengths), against the reference of each row's own keys, and times them
against the fallback as the package runs it: SDPA under the lengths' mask, on the pages gathered in each call.
A packed cell (tuner.export.check_packed) runs its kernels on the packed copies, checks each sequence's rows against
that sequence's own reference, and times them against the package's per-sequence fallback.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from tuner.dtypes import spec
from tuner.errors import TunerError
from tuner.export import check_fp8, check_packed, check_paged
from tuner.export.check_cells import CheckCell, check_cells, decide, median_ratios
from tuner.export.package import seal
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


def _kernel_runs(pkg: Any, cell: CheckCell, data: dict[str, Any], ref: Any,
                 errors: dict[str, str]) -> dict[str, Callable[[], Any]]:
    """A launch closure per candidate kernel that takes the cell's inputs and verifies against `ref` (a
    verify.Expected); why the others do not. `data`: cell_inputs()'s, as the search's kernel_call takes them (an
    e4m3 cell's descales; a paged cell's cache, table and lengths; a ragged cell's lengths; a packed cell's packed
    copies). e4m3 kernels write bfloat16."""
    from tuner.backends.gpu_child import kernel_call
    from tuner.runtime.verify import TOLERANCE, empty_output

    kernels = importlib.import_module(f"{pkg.__name__}._runtime.kernels")
    limit = TOLERANCE[cell.problem.dtype]
    runs: dict[str, Callable[[], Any]] = {}
    for entry in cell.candidates:
        name = entry["kernel"]
        kernel = kernels.load_kernel(name, data["q"].get_device())
        out = empty_output(data["q"])
        try:
            kernel_call(kernel, data, out, checked=True)()
        except pkg.AttentionInputError as exc:
            errors[name] = f"does not take the shape: {exc}"
            continue
        err = ref.error(out)
        if not err < limit:
            errors[name] = f"relative error {err:.2e} >= {limit:g}"
            continue
        runs[name] = kernel_call(kernel, data, out, checked=False)
    return runs


def cell_inputs(problem: Problem, device: str = "cuda") -> tuple[dict[str, Any], Any]:
    """The cell's inputs as the search makes them (verify.make_inputs, or fp8_inputs with the descales; a paged
    layout's pages, a ragged batch's lengths, packed sequences' packed copies: gpu_child.layout_inputs) in
    kernel_call's form, and the fp32 reference (verify.expected_output: on the real values, each row's own keys,
    the cell's window and softcap; sampled rows where all would not fit, each packed sequence's own rows)."""
    from tuner.backends.gpu_child import layout_inputs
    from tuner.runtime.verify import expected_output, fp8_inputs, make_inputs

    data: dict[str, Any] = {"scale": None}
    if problem.fp8:  # FP8 inputs (e4m3, or an FP8 KV cache) and their descales; the reference dequantises them
        q, k, v, data["descales"] = fp8_inputs(problem, device, seed=0)
    else:
        q, k, v = make_inputs(problem, device, seed=0)
    data.update(q=q, k=k, v=v, **layout_inputs(problem, q, k, v, seed=0))
    lengths = problem.key_lengths() if problem.ragged else None
    return data, expected_output(problem, q, k, v, key_lengths=lengths, descales=data.get("descales"))


def fallback_baselines(pkg: Any, problem: Problem, q: Any, k: Any, v: Any, descales: Any = None) -> list[Any]:
    """What a routed cell of `problem` runs instead of a kernel, timed as baselines: every SDPA backend that takes
    it (FlashAttention-4 left out: the fallback is SDPA); for a window, each under the package's own window mask;
    for a softcap, the package's torch softcap implementation (SDPA has none). An e4m3 cell's (FP8 q, k, v with
    `descales`): the same on the inputs dequantised to bfloat16, the dequantisation inside each timed call; an FP8
    KV cache's (descales (None, k_scale, v_scale)): on k and v dequantised to q's dtype, likewise."""
    from tuner.runtime.baselines import SDPA_BACKENDS, Baseline, available_baselines, sdpa_baseline
    from tuner.runtime.verify import ragged_seq_lens

    baseline = spec(problem.dtype).baseline.name  # the type FP8 inputs are dequantised to (e4m3's bf16)
    if descales is not None and descales[0] is None:  # an FP8 KV cache: k and v to q's dtype in each call
        kv = check_fp8.cache_dequantised(pkg, q, k, v, descales)
        found = fallback_baselines(pkg, dataclasses.replace(problem, dtype=baseline), q, *kv)
        return check_fp8.cache_dequantising(pkg, found, q, k, v, descales, kv)
    if descales is not None:
        buffers = check_fp8.dequantised(pkg, q, k, v, descales)
        found = fallback_baselines(pkg, dataclasses.replace(problem, dtype=baseline), *buffers)
        return check_fp8.dequantising(pkg, found, q, k, v, descales, buffers)
    if not problem.local and not problem.softcap:  # a ragged batch: SDPA under its lengths' mask (sdpa_mask)
        return available_baselines(problem, q, k, v, fa4=False)
    masked = importlib.import_module(f"{pkg.__name__}._runtime.masked")
    mask, lens = (problem.window_left, problem.window_right, problem.softcap), ragged_seq_lens(problem, q.device)
    if problem.softcap:
        return [Baseline("torch_softcap", lambda: masked.fallback(q, k, v, problem.causal, None, mask, lens=lens),
                         None)]
    kept = masked.keys_kept(problem.seq_q, problem.seq_k, problem.causal, mask[:2], q.device, lens)
    found = []
    for name in SDPA_BACKENDS:
        try:
            found.append(sdpa_baseline(name, q, k, v, problem.causal, None, kept))
        except RuntimeError:  # a backend that takes no boolean mask (flash): not what the fallback runs
            continue
    return found


def routed_baselines(pkg: Any, problem: Problem, data: dict[str, Any]) -> list[Any]:
    """fallback_baselines of the cell (data: cell_inputs()'s); a paged cell's gather their K/V from its pages
    in each call first, as the package's fallback of a paged call does; a packed cell's is the package's
    per-sequence fallback."""
    if problem.packed:
        return [check_packed.fallback_baseline(pkg, problem, data)]
    q, k, v, descales = data["q"], data["k"], data["v"], data.get("descales")
    if not problem.page_size:
        return fallback_baselines(pkg, problem, q, k, v, descales)
    (k, v), gather = check_paged.gathered(pkg, data, problem.seq_k)
    return check_paged.preceded(fallback_baselines(pkg, problem, q, k, v, descales), gather)


def measure_cell(pkg: Any, cell: CheckCell, l2_bytes: int, rounds: int = ROUNDS) -> dict[str, Any]:
    """Verify and time one cell's kernels against SDPA in `rounds` interleaved rounds; its manifest record.

    Each timing is a trial's (25 ms warm-up, 100 ms of repetitions, L2 flushed): shorter ones read a
    sustained kernel faster than it runs once the card reaches its power limit, and not every kernel
    by as much (cuDNN read 14% faster at 30 ms on an H100 at B1 S16384 D128, the tuned kernel 2%).
    """
    import torch

    from tuner.runtime.timing import interleaved_rounds, time_cuda

    data, ref = cell_inputs(cell.problem)
    errors: dict[str, str] = {}
    runs = _kernel_runs(pkg, cell, data, ref, errors)
    del ref
    baselines = routed_baselines(pkg, cell.problem, data)  # what a routed cell runs: compare with it
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
        # No bytecode: the package may be a staged copy about to move, its .pyc would name the old path.
        child = subprocess.Popen([sys.executable, "-m", "tuner.export.check", str(root), name, str(profile.l2_bytes)],
                                 stdout=subprocess.PIPE, stderr=errors, text=True,
                                 env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
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
    seal(root / name)  # the manifest changed: its sha256 in __init__.py too, or the package would not import
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
