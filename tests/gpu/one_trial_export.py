"""An export of a store holding one ok trial, as `tuner search` stores it (the variant built here, its cubin's
sha256; made-up timings): the export path of one kernel end to end, for the GPU tests of a dtype's package."""

from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path
from typing import Any

from tuner.problem import Problem


def export_one_trial(profile: Any, base: Path, problem: Problem, variant: Any, median_us: float,
                     rel_error: float) -> Any:
    """The imported package exported (to `base`) from a fresh store holding one trial of `variant` on
    `problem`, built for `profile`'s arch."""
    from tuner.export.run import ExportOptions, export
    from tuner.kernels.manifest import load_manifest
    from tuner.runtime.build import build
    from tuner.status import TrialStatus
    from tuner.store import RunInfo, TrialRecord, open_store

    url = f"sqlite:///{base / 'results.db'}"
    built = build(variant, profile.nvcc_arch)
    assert built.ok, built.compiled.log[-3000:]
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name="test", profile=profile.name, host="test"))
        store.add_trial(TrialRecord(
            run_id=run, problem=problem, template=variant.template,
            template_hash=load_manifest(variant.template).source_hash, params=variant.stored_params(),
            variant_name=variant.name, status=TrialStatus.OK, median_us=median_us, rel_error=rel_error,
            cubin_sha256=built.compiled.cubin_sha256))
        store.finish_run(run)
    name = f"one_{problem.dtype}_{uuid.uuid4().hex[:8]}"
    export(ExportOptions(gpu=profile.name, out=base / name, db_url=url))
    sys.path.insert(0, str(base / name))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(base / name))
