"""tuner export under faults and odd arguments (issue 36): a killed export's leftovers, a full disk, --out
naming a file, a header's name, a replayed export's README and explain(), output within 80 columns."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import test_export
from tests.cli_helpers import run_tuner
from tests.test_export import _one_trial_store, _unique, import_exported
from tuner.errors import TunerError
from tuner.export.run import ExportOptions, export

pytestmark = test_export.pytestmark  # nvcc: export recompiles cubins
export_store = test_export.export_store  # the module's fixture, reused

ROOT = Path(__file__).resolve().parents[1]


def _temporary(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".tuner-")) if out.exists() else []


def _host() -> str:
    """This host as the export's temporary folders name it."""
    from tuner.export import staging

    return getattr(staging, "_HOST", socket.gethostname())


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- a replayed export, and 80 columns ---------------------------------------------------------------------


def test_a_replayed_exports_readme_and_explain_say_so(tmp_path) -> None:
    import torch

    url = f"sqlite:///{tmp_path / 'r.db'}"
    recording = "sqlite:////data/recording.db"
    _one_trial_store(url, {"sdpa_cudnn": 50.0}, median_us=40.0, replayed_from=recording)
    name = _unique("replayed")
    export(ExportOptions(gpu="h100", out=tmp_path / name, db_url=url))
    readme = (tmp_path / name / "README.md").read_text()
    assert "40.0 us, replayed)" in readme
    assert f"**REPLAYED**: the timings marked replayed were answered from a recording ({recording})" in readme
    mod = import_exported(tmp_path / name, name)
    q = torch.empty(2, 8, 2048, 64, dtype=torch.float16, device="meta")
    text = str(mod.explain(q, q, q))
    assert f"REPLAYED: that timing was answered from a recording ({recording})" in text
    assert "not measured on a GPU" in text
    # Measured exports say nothing of the kind.
    measured = f"sqlite:///{tmp_path / 'm.db'}"
    _one_trial_store(measured, {"sdpa_cudnn": 50.0}, median_us=40.0)
    other = _unique("measured")
    export(ExportOptions(gpu="h100", out=tmp_path / other, db_url=measured))
    assert "replayed" not in (tmp_path / other / "README.md").read_text().lower()
    assert "REPLAYED" not in str(import_exported(tmp_path / other, other).explain(q, q, q))


def test_export_output_fits_80_columns(export_store, tmp_path) -> None:
    """The per-entry listing (a kernel name alone is ~50 columns) and the REPLAYED warning, in lines of <= 80."""
    res = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(tmp_path / "all"))
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert any("(shadowed by trial" in line for line in lines) and any("attn_fwd_mma_d64" in line for line in lines)
    assert max(map(len, lines)) <= 80, "\n".join(line for line in lines if len(line) > 80)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _one_trial_store(url, {"sdpa_cudnn": 50.0}, median_us=40.0, replayed_from="sqlite:////data/recording.db")
    res = run_tuner("--db", url, "export", "--gpu", "h100", "--out", str(tmp_path / "rep"))
    assert res.exit_code == 0 and "[replayed]" in res.stdout, res.stderr
    warning = res.stderr.splitlines()
    assert warning[0].startswith("warning: REPLAYED: 1 of 1 entries") and res.stderr.count("warning:") == 1
    assert max(map(len, warning + res.stdout.splitlines())) <= 80, res.stderr
    assert "re-run the search on the card before relying on them" in " ".join(res.stderr.split())
    json.loads((tmp_path / "rep" / "rep" / "manifest.json").read_text())  # written whole
