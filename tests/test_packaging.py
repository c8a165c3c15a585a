"""The wheel carries the data folders, and the installed tool finds them.

Builds the wheel once per session (about 5-15 s: pip + hatchling, no build
isolation, so nothing is downloaded), installs it into a private folder and
runs the installed `tuner` from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ASSET_FOLDERS = ("kernel_templates", "profiles", "db")


def _source_files(folder: str) -> list[str]:
    """Files of a data folder in the checkout, relative to it (caches left out)."""
    base = ROOT / folder
    if not base.is_dir():
        return []
    return sorted(
        p.relative_to(base).as_posix()
        for p in base.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    )


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 180):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("hatchling", reason="hatchling (the build backend, in the 'test' extra) is needed")
    out = tmp_path_factory.mktemp("wheel")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out), str(ROOT)],
        cwd=out,
    )
    wheels = list(out.glob("flashcore_tuner-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {out}: {sorted(p.name for p in out.iterdir())}"
    return wheels[0]


@pytest.fixture(scope="session")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel unpacked with pip into a folder used as PYTHONPATH (deps come from this environment)."""
    target = tmp_path_factory.mktemp("site")
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target), str(wheel)], cwd=target)
    return target


def test_wheel_contains_data_folders(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "tuner/_assets/profiles/h100.toml" in names
    for profile in ("a100", "h100", "h200", "l4"):
        assert f"tuner/_assets/profiles/{profile}.toml" in names
    assert "tuner/cli/app.py" in names and "tuner/runtime/launcher.py" in names and "tuner/profiles/profile.py" in names
    for folder in ASSET_FOLDERS:
        files = _source_files(folder)
        if not files:  # folder still empty in this checkout: nothing to ship yet
            continue
        prefix = f"tuner/_assets/{folder}/"
        shipped = {n[len(prefix):] for n in names if n.startswith(prefix)}
        assert shipped, f"wheel has no {prefix} entries although {folder}/ has {len(files)} files"
        missing = [f for f in files if f not in shipped]
        assert not missing, f"{folder}/ files missing from the wheel: {missing[:10]}"


def test_wheel_has_console_script(wheel):
    with zipfile.ZipFile(wheel) as zf:
        entry_points = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = zf.read(entry_points).decode()
    assert "tuner = tuner.cli.app:main" in text


def test_installed_wheel_finds_its_assets(installed, tmp_path):
    """Run from a folder with no checkout in sight: data must come from tuner/_assets."""
    env = {**os.environ, "PYTHONPATH": str(installed)}
    code = (
        "import json, tuner, tuner.assets as r;"
        "print(json.dumps({'pkg': tuner.__file__, 'profiles': str(r.asset_dir('profiles'))}))"
    )
    out = json.loads(_run([sys.executable, "-c", code], cwd=tmp_path, env=env).stdout)
    assert Path(out["pkg"]).is_relative_to(installed)
    assert Path(out["profiles"]) == installed / "tuner" / "_assets" / "profiles"

    result = _run([sys.executable, "-m", "tuner", "profiles", "--format", "json"], cwd=tmp_path, env=env)
    assert [p["name"] for p in json.loads(result.stdout)] == ["a100", "h100", "h200", "l4"]


def test_python_m_tuner_help():
    result = _run([sys.executable, "-m", "tuner", "--help"], cwd=ROOT, timeout=120)
    assert "Usage" in result.stdout
    assert "profiles" in result.stdout


def test_ci_runs_the_readme_test_command():
    """.ci/run runs the README's set-up (b) command verbatim."""
    command = "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest"
    readme = (ROOT / "README.md").read_text()
    ci = ROOT / ".ci" / "run"
    assert command in readme
    assert f"\n    {command}\n" in ci.read_text()
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
