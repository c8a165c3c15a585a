"""An export of a store holding one ok trial, as `tuner search` stores it (the variant built here, its cubin's
sha256; made-up timings): the export path of one kernel end to end, for the GPU tests of a dtype's package."""

from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.built_trials import add_built_trial
from tuner.problem import Problem


def export_one_trial(profile: Any, base: Path, problem: Problem, variant: Any, median_us: float,
                     rel_error: float) -> Any:
    """The imported package exported (to `base`) from a fresh store holding one trial of `variant` on
    `problem`, built for `profile`'s arch."""
    from tuner.export.run import ExportOptions, export
    from tuner.store import RunInfo, open_store

    url = f"sqlite:///{base / 'results.db'}"
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name="test", profile=profile.name, host="test"))
        add_built_trial(store, run, problem, variant, profile.nvcc_arch, median_us, rel_error)
        store.finish_run(run)
    name = f"one_{problem.dtype}_{uuid.uuid4().hex[:8]}"
    export(ExportOptions(gpu=profile.name, out=base / name, db_url=url))
    sys.path.insert(0, str(base / name))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(base / name))
