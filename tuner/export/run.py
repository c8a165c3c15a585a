"""tuner export: the store's best ok trials -> an importable package or a C++ header.

    export(ExportOptions(gpu="h100", out=Path("my_attention")))

The kernels are chosen and rebuilt by tuner.export.selection, written by
tuner.export.package or tuner.export.header through tuner.export.staging.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import tuner
from tuner.errors import TunerError
from tuner.export.backward_selection import attach_backwards, pick_backward
from tuner.export.header import write_header
from tuner.export.options import (
    FORMATS,
    PACKAGE_VERSION,
    ExportOptions,
    ExportReport,
    check_out_kind,
    package_name,
)
from tuner.export.package import write_package
from tuner.export.selection import (
    ExportedKernel,
    build_kernel,
    entry_of,
    resolve_collisions,
    sdpa_ratio,
    select_trials,
)
from tuner.export.staging import clear_dead_staging
from tuner.kernels.compiler import BASE_OPTIONS, nvcc_version
from tuner.kernels.manifest import load_manifest
from tuner.profiles import offline_profile
from tuner.store import open_store

__all__ = ["ExportOptions", "ExportReport", "export"]


def export(options: ExportOptions, progress: Optional[Callable[[dict[str, Any]], None]] = None) -> ExportReport:
    """Export the best ok trials of `options.gpu` as a package or a header (see module doc).

    With options.check the written package is measured cell by cell on this GPU (tuner.export.check);
    `progress` gets each measured cell's record.
    """
    if options.format not in FORMATS:
        raise TunerError(f"unknown export format {options.format!r}; expected one of {', '.join(FORMATS)}")
    profile = offline_profile(options.gpu)
    if options.check:
        if options.format != "package":
            raise TunerError("--check measures an importable package: it needs --format package")
        from tuner.export.check import require_gpu_for

        require_gpu_for(profile)  # before anything is written
    check_out_kind(options.out)  # the real cause first: a name derived from a file's name would be refused
    name = package_name(options)
    with open_store(options.db_url, create=False) as store:
        rows = select_trials(store, profile, options.shapes, options.dtype, options.model_problems)
        details = {r.id: store.trial_detail(r.id) for r in rows}  # one read per trial: its run and baselines
        runs = {r.run_id: details[r.id].run for r in rows}
        ratios = {r.id: sdpa_ratio(store, r, details[r.id].baselines) for r in rows}
        # A package trains: each forward problem's confirmed backward winner ships where it beat SDPA's backward.
        picks = [pick_backward(store, profile.name, r.problem) for r in rows] if options.format == "package" else []
    built: dict[str, ExportedKernel] = {}
    entries = []
    for row in rows:
        kernel = build_kernel(row, profile.nvcc_arch, options.allow_rebuild)
        built.setdefault(kernel.variant.name, kernel)
        entries.append(entry_of(row, kernel, runs[row.run_id], ratios[row.id]))
    attach_backwards(entries, picks, profile.nvcc_arch, options.allow_rebuild, built)
    resolve_collisions(entries)
    manifest: dict[str, Any] = {
        "format": 1,
        "package": name,
        "version": PACKAGE_VERSION,
        "tuner_version": tuner.__version__,
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "nvcc_version": nvcc_version(),
        # The package's JIT path compiles with these (what the search measured, minus ptxas -v).
        "nvcc_options": [o for o in BASE_OPTIONS if not o.startswith("--ptxas-options")],
        "gpu": {"profile": profile.name, "display_name": profile.display_name, "arch": profile.nvcc_arch,
                "compute_capability": list(profile.compute_capability),
                "gpu_names": sorted({r.gpu_name for r in rows})},
        "templates": {t: {"source_hash": load_manifest(t).source_hash}
                      for t in sorted({k.variant.template for k in built.values()})},
        # The recordings replayed runs answered from (empty: every timing was measured on a GPU).
        "replayed_from": sorted({e["run"]["replayed_from"] for e in entries if e["run"]["replayed_from"]}),
        "kernels": {},
        "entries": entries,
    }
    # A killed export's temporary folders are not "an earlier export": removed, and said so.
    notes = clear_dead_staging(options.out)
    if options.format == "header":
        return dataclasses.replace(write_header(options, name, profile, manifest, built), notes=notes)
    if not options.check:
        return dataclasses.replace(write_package(options, name, profile, manifest, built), notes=notes)
    from tuner.export.check import check_package

    checked: list[dict[str, Any]] = []  # measured in the staged package: a failed check keeps the earlier export

    def check(stage: Path) -> None:
        checked.extend(check_package(stage, name, profile, progress or (lambda record: None)))

    return dataclasses.replace(write_package(options, name, profile, manifest, built, check), checked=checked,
                               notes=notes)
