"""tuner export: the store's best ok trials -> an importable package (or a C++ header).

The package is self-contained: verbatim copies of tuner/runtime/launcher.py
and of the runtime modules in tuner/export/shipped/, the cubins for the profile's arch,
the rendered source of each kernel (JIT-compiled where no cubin fits) and
manifest.json (dispatch table, provenance, sha256 of every file). It never
imports `tuner`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import keyword
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

# The shipped dispatch module is standard-library only: the tuner keys entries with it (one definition).
from tuner.export.shipped._dispatch import Key
from tuner.errors import TunerError
from tuner.problem import DTYPES, Problem, parse_shape
from tuner.profiles import GpuProfile, load_profile
from tuner.kernels.variant import Variant
from tuner.store import TrialFilter, TrialRow, open_store

FORMATS = ("package", "header")
# Runtime files copied verbatim into every export: (source under tuner/, name in the package).
_RUNTIME_FILES = (
    ("export/shipped/package_init.py", "__init__.py"),
    ("export/shipped/_api.py", "_api.py"),
    ("export/shipped/_dispatch.py", "_dispatch.py"),
    ("export/shipped/_kernels.py", "_kernels.py"),
    ("runtime/launcher.py", "_launcher.py"),  # one launcher for the tuner and every export
)
PACKAGE_VERSION = "0.1.0"
# What a manifest.json written by this module always holds: how --force tells an earlier export from user files.
_PROVENANCE_KEYS = ("format", "package", "version", "tuner_version", "exported_at", "gpu", "kernels", "entries")


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    gpu: str  # GPU profile name (h100, h200, ...)
    out: Path
    shapes: tuple[str, ...] = ()  # "B,H,S,D" / "B,H,Sq,Sk,D"; empty: every tuned problem
    dtype: Optional[str] = None
    name: Optional[str] = None  # Python package name; default: the out folder's name
    format: str = "package"
    allow_rebuild: bool = False  # accept a rebuilt cubin that differs from the one the search measured
    force: bool = False  # write into a non-empty out folder, replacing an earlier export there (nothing else)
    db_url: Optional[str] = None


@dataclass(frozen=True)
class BuiltKernel:
    variant: Variant
    source: str
    cubin: bytes
    rebuilt: bool  # the cubin differs from (or could not be checked against) the measured one


@dataclass(frozen=True)
class ExportReport:
    out: Path
    format: str
    package: str
    entries: list[dict[str, Any]]
    kernels: int
    files: list[Path] = field(default_factory=list)


def package_name(options: ExportOptions) -> str:
    name = options.name or options.out.resolve().name.replace("-", "_")
    if not name.isidentifier() or keyword.iskeyword(name) or name in ("tuner", "torch", "numpy", "pycuda"):
        raise TunerError(f"package name {name!r} is not a usable Python identifier; pass --name")
    return name


def select_trials(store: Any, profile: GpuProfile, shapes: tuple[str, ...], dtype: Optional[str]) -> list[TrialRow]:
    """Best ok trial per tuned problem of this profile (one per problem: causal, GQA, layout kept apart)."""
    if dtype is not None and dtype not in DTYPES:
        raise TunerError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    filters = [TrialFilter(gpu=profile.name, shape=parse_shape(s), dtype=dtype) for s in shapes] or \
              [TrialFilter(gpu=profile.name, dtype=dtype)]
    rows: dict[int, TrialRow] = {}
    for filt in filters:
        found = [r for r in store.best_trials(filt) if r.profile == profile.name]
        if not found:
            what = f"shape {','.join(map(str, filt.shape))}" if filt.shape else "any problem"
            raise TunerError(f"no ok trials for {profile.name} ({what}{', ' + dtype if dtype else ''}) in the store; "
                             f"run `tuner search --gpu {profile.name}` first")
        rows.update((r.id, r) for r in found)
    return sorted(rows.values(), key=lambda r: r.id)


def build_kernel(row: TrialRow, arch: str, allow_rebuild: bool) -> BuiltKernel:
    """Render and compile the trial's variant; refuse when it is not the kernel the search measured."""
    from tuner.kernels.compiler import compile_source
    from tuner.kernels.manifest import load_manifest, render

    variant = Variant.from_stored(row.template, row.params)
    source = render(variant)
    result = compile_source(source, variant.name, arch)
    if not result.ok:
        raise TunerError(f"trial {row.id}: {variant.name} no longer compiles for {arch}: "
                         f"{result.log.strip().splitlines()[-1] if result.log.strip() else 'nvcc failed'}")
    if row.cubin_sha256:
        same = result.cubin_sha256 == row.cubin_sha256
        why = f"cubin sha256 {result.cubin_sha256[:12]} != stored {row.cubin_sha256[:12]}"
    else:  # nothing to compare the cubin with: fall back on the template's hash
        same = row.template_hash == load_manifest(row.template).source_hash
        why = "template hash differs from the one stored with the trial"
    if not same and not allow_rebuild:
        raise TunerError(f"trial {row.id}: the store's kernel no longer matches the template ({why}; the template "
                         f"or nvcc changed since the search); re-run the search, or pass --allow-rebuild to export "
                         f"the rebuilt kernel")
    return BuiltKernel(variant, source, result.cubin, rebuilt=not same)


def _dispatch_key(problem: Problem) -> dict[str, Any]:
    key = Key.of(problem.dtype, problem.head_dim, problem.causal, problem.heads, problem.heads_kv,
                 problem.seq_q, problem.seq_k)
    return dataclasses.asdict(key)


def _entry(row: TrialRow, built: BuiltKernel, run: Any) -> dict[str, Any]:
    p = row.problem
    return {
        "key": _dispatch_key(p),
        "kernel": built.variant.name,
        "trial_id": row.id,
        "problem": {"batch": p.batch, "heads": p.heads, "heads_kv": p.heads_kv, "seq_q": p.seq_q, "seq_k": p.seq_k,
                    "head_dim": p.head_dim, "dtype": p.dtype, "causal": p.causal, "layout": p.layout},
        "problem_label": p.label,
        "median_us": row.median_us,
        "p20_us": row.p20_us,
        "p80_us": row.p80_us,
        "tflops": row.tflops,
        "best_baseline_impl": row.best_baseline_impl,
        "best_baseline_us": row.best_baseline_us,
        "ratio_to_best_baseline": row.ratio_to_best_baseline,
        "rebuilt": built.rebuilt,
        "run": {"run_id": row.run_id, "gpu_name": row.gpu_name, "profile": row.profile,
                "driver": getattr(run, "driver", None), "cuda_version": getattr(run, "cuda_version", None),
                "torch_version": getattr(run, "torch_version", None),
                "tuner_version": getattr(run, "tuner_version", None)},
        "dispatch": True,
    }


def resolve_collisions(entries: list[dict[str, Any]]) -> None:
    """One entry per dispatch key: the largest tuned problem wins (long runs are where tuning pays)."""
    winners: dict[str, dict[str, Any]] = {}
    for e in entries:
        key = json.dumps(e["key"], sort_keys=True)
        p = e["problem"]
        work = (p["batch"] * p["heads"] * p["seq_q"] * p["seq_k"], -e["trial_id"])
        best = winners.get(key)
        if best is None or work > (best["problem"]["batch"] * best["problem"]["heads"] * best["problem"]["seq_q"]
                                   * best["problem"]["seq_k"], -best["trial_id"]):
            winners[key] = e
    for e in entries:
        winner = winners[json.dumps(e["key"], sort_keys=True)]
        e["dispatch"] = e is winner
        if e is not winner:
            e["shadowed_by"] = winner["trial_id"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_package_export(out: Path, name: str) -> bool:
    """`out` holds an earlier package export `name`: its manifest.json carries the tuner's provenance keys."""
    try:
        manifest = json.loads((out / name / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and all(k in manifest for k in _PROVENANCE_KEYS) and manifest["package"] == name


def _os_error(exc: OSError, out: Path, stage: Optional[Path] = None) -> TunerError:
    """One line naming the path and the OS reason (a staged path is named by where it was going)."""
    path = str(exc.filename or out)
    if stage is not None:
        path = path.replace(str(stage), str(out), 1)
    where = "" if path == str(out) else f" ({path})"
    return TunerError(f"cannot write the export to {out}{where}: {exc.strerror or exc}")


def check_out(out: Path, force: bool, ours: list[str], earlier_export: bool) -> None:
    """Refuse an out folder whose export paths (`ours`) hold anything but an earlier export of this name."""
    try:
        if out.exists() and not out.is_dir():
            raise TunerError(f"{out} exists and is not a folder; pass a folder to --out")
        if not (out.is_dir() and any(out.iterdir())):
            return
        present = [n for n in ours if os.path.lexists(out / n)]
    except OSError as exc:
        raise _os_error(exc, out) from None
    if not force:
        raise TunerError(f"{out} is not empty; pass --force to replace the earlier export there")
    if present and not earlier_export:  # --force replaces an export, never the user's own files
        raise TunerError(f"{out / present[0]} is not from an earlier tuner export; --force refuses to overwrite it "
                         f"(pick another --out or --name)")


def _swap_in(stage: Path, out: Path, backup: Path, names: list[str]) -> None:
    """Move the earlier export's `names` into `backup`, then the staged ones into `out`; undo all on failure."""
    moved: list[str] = []
    placed: list[str] = []
    try:
        for n in names:
            if os.path.lexists(out / n):
                os.replace(out / n, backup / n)
                moved.append(n)
        for n in names:
            if os.path.lexists(stage / n):
                os.replace(stage / n, out / n)
                placed.append(n)
    except OSError:
        for n in placed:  # best effort: put the earlier export back as it was
            with contextlib.suppress(OSError):
                os.replace(out / n, stage / n)
        for n in moved:
            with contextlib.suppress(OSError):
                os.replace(backup / n, out / n)
        raise


def write_staged(out: Path, names: list[str], write: Callable[[Path], list[Path]]) -> list[Path]:
    """Run `write(stage)` in a temporary folder inside `out`, then swap its `names` in (same file system: renames).

    A failed export leaves the earlier one in place and no half-written one; OSError -> one-line TunerError.
    """
    created = not out.exists()
    stage: Optional[Path] = None
    backup: Optional[Path] = None
    done = False
    try:
        out.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".tuner-export-", dir=out))
        rel = [p.relative_to(stage) for p in write(stage)]
        backup = Path(tempfile.mkdtemp(prefix=".tuner-previous-", dir=out))
        _swap_in(stage, out, backup, names)
        done = True
        return [out / r for r in rel]
    except OSError as exc:
        raise _os_error(exc, out, stage) from None
    finally:
        for tmp in (stage, backup):
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        if created and not done:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if still empty


def _pyproject(name: str) -> str:
    dist = name.replace("_", "-")
    return f"""[build-system]
requires = ["hatchling>=1.20"]
build-backend = "hatchling.build"

[project]
name = "{dist}"
version = "{PACKAGE_VERSION}"
description = "Tuned fused-attention CUDA kernels exported by FlashCore tuner"
requires-python = ">=3.10"
dependencies = ["torch>=2.4", "numpy>=1.24", "pycuda>=2024.1"]

# The whole package folder ships (cubins, sources, manifest.json), whatever a .gitignore says.
[tool.hatch.build.targets.wheel]
packages = ["{name}"]
ignore-vcs = true

[tool.hatch.build.targets.sdist]
include = ["{name}", "README.md"]
ignore-vcs = true
"""


def _readme(name: str, manifest: dict[str, Any]) -> str:
    rows = "\n".join(f"- {e['problem_label']}: `{e['kernel']}` (trial {e['trial_id']}, {e['median_us']:.1f} us)"
                     for e in manifest["entries"] if e["dispatch"])
    return (f"# {name}\n\nTuned attention kernels for {manifest['gpu']['display_name']} "
            f"({manifest['gpu']['arch']}), exported by FlashCore tuner {manifest['tuner_version']}.\n\n"
            f"```python\nfrom {name} import attention\nout = attention(q, k, v, causal=True)\n"
            f"print(attention.explain(q, k, v, causal=True))\n```\n\nTuned problems:\n\n{rows}\n\n"
            "Needs torch, numpy and pycuda. manifest.json holds the provenance and the sha256 of every kernel.\n")


def export(options: ExportOptions) -> ExportReport:
    """Export the best ok trials of `options.gpu` as a package or a header (see module doc)."""
    import tuner
    from tuner.kernels.compiler import BASE_OPTIONS, nvcc_version
    from tuner.kernels.manifest import load_manifest

    if options.format not in FORMATS:
        raise TunerError(f"unknown export format {options.format!r}; expected one of {', '.join(FORMATS)}")
    profile = load_profile(options.gpu)
    name = package_name(options)
    with open_store(options.db_url, create=False) as store:
        rows = select_trials(store, profile, options.shapes, options.dtype)
        runs = {r.run_id: store.trial_detail(r.id).run for r in rows}
    built: dict[str, BuiltKernel] = {}
    entries = []
    for row in rows:
        kernel = build_kernel(row, profile.nvcc_arch, options.allow_rebuild)
        built.setdefault(kernel.variant.name, kernel)
        entries.append(_entry(row, kernel, runs[row.run_id]))
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
        "templates": {t: {"source_hash": load_manifest(t).source_hash} for t in sorted({r.template for r in rows})},
        "kernels": {},
        "entries": entries,
    }
    if options.format == "header":
        from tuner.export.header import write_header

        return write_header(options, name, profile, manifest, built)
    return _write_package(options, name, profile, manifest, built)


def _write_package(options: ExportOptions, name: str, profile: GpuProfile, manifest: dict[str, Any],
                   built: dict[str, BuiltKernel]) -> ExportReport:
    from tuner.kernels.feasibility import launch_shape
    from tuner.kernels.manifest import load_manifest

    names = [name, "pyproject.toml", "README.md"]
    check_out(options.out, options.force, names, is_package_export(options.out, name))
    arch = profile.nvcc_arch

    def write(root: Path) -> list[Path]:
        pkg = root / name
        (pkg / "kernels").mkdir(parents=True)
        files = []
        for kname, k in sorted(built.items()):
            src_rel, cubin_rel = f"kernels/{kname}.cu", f"kernels/{kname}.{arch}.cubin"
            (pkg / src_rel).write_text(k.source)
            (pkg / cubin_rel).write_bytes(k.cubin)
            files += [pkg / src_rel, pkg / cubin_rel]
            manifest["kernels"][kname] = {
                "entry": kname, "template": k.variant.template, "params": k.variant.stored_params(),
                "launch": dataclasses.asdict(launch_shape(k.variant)),
                "min_compute_capability": list(load_manifest(k.variant.template).min_compute_capability),
                "source": src_rel, "source_sha256": _sha(k.source.encode()),
                "cubins": {arch: {"path": cubin_rel, "sha256": _sha(k.cubin)}},
            }
        tuner_dir = Path(__file__).resolve().parent.parent
        for src, dest in _RUNTIME_FILES:
            shutil.copyfile(tuner_dir / src, pkg / dest)
            files.append(pkg / dest)
        (pkg / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
        (root / "pyproject.toml").write_text(_pyproject(name))
        (root / "README.md").write_text(_readme(name, manifest))
        return files + [pkg / "manifest.json", root / "pyproject.toml", root / "README.md"]

    files = write_staged(options.out, names, write)
    return ExportReport(options.out, "package", name, manifest["entries"], len(built), files)
