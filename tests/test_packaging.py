"""The wheel carries the data folders, and the installed tool finds them.

Builds the wheel once per session (about 5-15 s: pip + hatchling, no build
isolation, so nothing is downloaded), installs it into a private folder and
runs the installed `tuner` from there.
"""

from __future__ import annotations

import json
import os
import shutil
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
    assert "tuner/cli/app.py" in names and "tuner/runtime/shipped/launcher.py" in names and "tuner/profiles/profile.py" in names
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
    assert "tuner = tuner.__main__:main" in text


def test_the_console_script_module_imports_no_cli() -> None:
    """A spawned child (the GPU worker, a card's worker process) re-runs the console script before its
    own work: the script's module must not import the CLI (Optuna, SQLAlchemy, Typer) in every child."""
    code = "import sys, tuner.__main__; print(sorted(m for m in sys.modules if m.startswith(('tuner.cli', 'optuna'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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


def test_installed_wheel_compiles_from_its_own_headers(installed, tmp_path, monkeypatch):
    """The installed templates list (and hash) the same files as the checkout, all inside the install; with nvcc,
    a variant compiled from the install is byte for byte the checkout's cubin (headers are hashed and copied by
    content, so where the templates are installed does not matter)."""
    from tuner.kernels.manifest import load_manifest

    env = {**os.environ, "PYTHONPATH": str(installed), "TUNER_CACHE_DIR": str(tmp_path / "installed-cache")}
    env.pop("TUNER_TEMPLATE_PATH", None)
    name = "attn_fwd_wgmma_d64_fp16_m128n128_s2_sw128_r24_ov_pp_p_causal"
    code = (
        "import json, shutil\n"
        "from tuner.kernels.manifest import load_manifest\n"
        "m = load_manifest('attn_fwd_wgmma')\n"
        "out = {'files': {r: str(p) for r, p in m.files.items()}, 'hash': m.source_hash}\n"
        "if shutil.which('nvcc'):\n"
        "    from tuner.kernels.compiler import compile_source\n"
        "    from tuner.kernels.render import render\n"
        "    from tuner.kernels.variant import parse_variant_name\n"
        f"    r = compile_source(render(parse_variant_name({name!r})), {name!r}, 'sm_90a')\n"
        "    out['cubin'] = r.cubin_sha256 if r.ok else r.log\n"
        "print(json.dumps(out))\n"
    )
    got = json.loads(_run([sys.executable, "-c", code], cwd=tmp_path, env=env, timeout=300).stdout)
    assets = installed / "tuner" / "_assets" / "kernel_templates"
    assert {r: Path(p) for r, p in got["files"].items()} == {r: assets / r for r in load_manifest("attn_fwd_wgmma").files}
    assert all(Path(p).is_file() for p in got["files"].values())
    assert got["hash"] == load_manifest("attn_fwd_wgmma").source_hash
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: compile from the install not checked")
    from tuner.kernels.compiler import compile_source
    from tuner.kernels.render import render
    from tuner.kernels.variant import parse_variant_name

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "checkout-cache"))
    mine = compile_source(render(parse_variant_name(name)), name, "sm_90a")
    assert mine.ok and got["cubin"] == mine.cubin_sha256


def test_installed_render_is_the_checkouts_one_file(installed, tmp_path):
    """`tuner render` from the install inlines the installed headers: the checkout's file, byte for byte (one
    that needs no include path, tests/test_render.py), with no path of the install in it."""
    from tuner.kernels.render import render_standalone
    from tuner.kernels.variant import parse_variant_name

    env = {**os.environ, "PYTHONPATH": str(installed), "TUNER_DB": f"sqlite:///{tmp_path / 'no-store.db'}"}
    env.pop("TUNER_TEMPLATE_PATH", None)
    name = "attn_decode_d64_fp16_m32n128_w2_sp8_s3"
    out = _run([sys.executable, "-m", "tuner", "render", name], cwd=tmp_path, env=env).stdout
    assert out == render_standalone(parse_variant_name(name))
    assert str(installed) not in out and "// ---- begin kernel_templates/common/utils.h ----" in out


def test_python_m_tuner_help():
    result = _run([sys.executable, "-m", "tuner", "--help"], cwd=ROOT, timeout=120)
    assert "Usage" in result.stdout
    assert "profiles" in result.stdout


def test_ci_runs_the_readme_test_command():
    """.ci/run runs the README's set-up (b) command verbatim."""
    command = "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest -n auto"
    readme = (ROOT / "README.md").read_text()
    ci = ROOT / ".ci" / "run"
    assert command in readme
    assert f"\n    {command}\n" in ci.read_text()
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
