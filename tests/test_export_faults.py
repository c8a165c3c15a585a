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


# --- a killed export ---------------------------------------------------------------------------------------


def test_a_killed_exports_temporary_folder_is_removed_by_the_next_export(export_store, tmp_path) -> None:
    """kill -9 while the package is being written leaves its staging folder in --out; the next export says it
    removed it (not "not empty ... the earlier export": there was none) and writes the package."""
    name = _unique("killed")
    out = tmp_path / name
    marker = tmp_path / "writing"
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
            "import tuner.export.package as package\n"
            "def stall(*args):\n"
            f"    open({str(marker)!r}, 'w').close(); time.sleep(120)\n"
            "package._readme = stall\n"
            "from pathlib import Path\nfrom tuner.export.run import ExportOptions, export\n"
            f"export(ExportOptions(gpu='h100', out=Path({str(out)!r}), db_url={export_store.url!r}, "
            "shapes=('2,8,256,64',)))\n")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the export never reached its README"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    left = _temporary(out)
    assert len(left) == 1 and left[0].startswith(".tuner-export-"), left
    res = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(out), "--shape", "2,8,256,64")
    assert res.exit_code == 0, res.stderr
    assert "not empty" not in res.stderr and "earlier export" not in res.stderr
    assert f"note: removed {left[0]} from {out}: left by an export that was killed (pid {child.pid})" in \
        " ".join(res.stderr.replace("\n  ", " ").splitlines())
    assert _temporary(out) == [] and (out / name / "manifest.json").is_file()


def test_an_export_killed_while_swapping_gets_the_earlier_export_back(export_store, tmp_path) -> None:
    """Killed between moving the earlier export aside and moving the new one in: the next export puts the
    earlier one back (and then it is an earlier export: --force replaces it, nothing else does)."""
    name = _unique("swap")
    out = tmp_path / "proj"
    export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, name=name, shapes=("2,8,256,64",)))
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    pid = _dead_pid()
    aside = out / f".tuner-previous-{_host()}-{pid}-abcd1234"
    aside.mkdir()
    for n in (name, "pyproject.toml", "README.md"):
        os.replace(out / n, aside / n)
    (out / f".tuner-export-{_host()}-{pid}-efgh5678" / name).mkdir(parents=True)  # half-written
    with pytest.raises(TunerError, match="not empty; pass --force to replace the earlier export there"):
        export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, name=name, shapes=("2,8,256,64",)))
    assert _temporary(out) == []
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_running_exports_temporary_folder_is_left_and_named(export_store, tmp_path) -> None:
    """A staging folder whose export is alive (this process) is not removed, and the refusal says whose it is."""
    out = tmp_path / "busy"
    live = out / f".tuner-export-{_host()}-{os.getpid()}-abcd1234"
    live.mkdir(parents=True)
    res = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(out), "--shape", "2,8,256,64")
    assert res.exit_code == 2 and "earlier export" not in res.stderr
    assert f"{out} holds {live.name}, the temporary folder of an export that is still running (pid {os.getpid()})" \
        in " ".join(res.stderr.split())
    assert live.is_dir()


# --- a full disk -------------------------------------------------------------------------------------------


def test_a_full_disk_is_one_short_line(export_store, tmp_path, monkeypatch) -> None:
    """copytree (the runtime's copy) fails every file on a full disk and raises one shutil.Error listing them
    all: the error names the first file and the OS reason, in one line."""
    copyfile = shutil.copyfile

    def full(src, dst, *args, **kwargs):
        if "_runtime" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return copyfile(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", full)
    name = _unique("full")
    out = tmp_path / name
    with pytest.raises(TunerError) as info:
        export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, shapes=("2,8,256,64",)))
    message = str(info.value)
    assert message.startswith(f"cannot write the export to {out} ({out / name / '_runtime'}/"), message
    assert message.endswith(".py): No space left on device") and "\n" not in message and len(message) < 300
    assert not out.exists()


# --- --out and --name --------------------------------------------------------------------------------------


def test_out_naming_a_file_says_so_first(export_store, tmp_path) -> None:
    """--out FILE: "exists and is not a folder", not a complaint about the package name derived from it."""
    file = tmp_path / "my-notes.txt"
    file.write_text("x")
    for fmt in ("package", "header"):
        res = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(file), "--format", fmt)
        assert res.exit_code == 2, res.stderr
        assert res.stderr.strip() == f"error: {file} exists and is not a folder; pass a folder to --out"
    assert file.read_text() == "x"


def test_a_header_export_needs_no_python_name(export_store, tmp_path) -> None:
    """A header has no Python package: --out x.h is a folder whose name gives the C++ namespace (x)."""
    out = tmp_path / "x.h"
    res = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(out), "--format", "header",
                    "--shape", "2,8,256,64")
    assert res.exit_code == 0, res.stderr
    assert "namespace x {" in (out / "x.h").read_text() and "exported header x.h" in res.stdout
    res = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(tmp_path / "my-kernels"),
                    "--format", "header", "--shape", "2,8,256,64")
    assert res.exit_code == 0 and (tmp_path / "my-kernels" / "my_kernels.h").is_file(), res.stderr
    bad = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(tmp_path / "h2"), "--format",
                    "header", "--name", "class")
    assert bad.exit_code == 2 and "Python" not in bad.stderr
    assert "header name 'class' is not a usable C++ identifier (its namespace and file name); pass --name" in \
        " ".join(bad.stderr.split())


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
