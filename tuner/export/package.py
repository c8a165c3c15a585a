"""tuner export --format package: an importable, pip-installable package of the tuned kernels.

The package is self-contained: verbatim copies of tuner/runtime/shipped/launcher.py
and of the runtime modules in tuner/export/shipped/, the cubins for the profile's arch,
the rendered source of each kernel (JIT-compiled where no cubin fits) and
manifest.json (dispatch table, provenance, the record of every file's sha256), whose own sha256
__init__.py embeds. It never imports `tuner`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

from tuner.dtypes import spec
from tuner.export.options import PACKAGE_VERSION, ExportOptions, ExportReport
from tuner.export.selection import ExportedKernel
from tuner.export.staging import check_out, write_staged
from tuner.kernels.manifest import load_manifest
from tuner.profiles import GpuProfile

RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime" / "shipped"  # copied whole as <package>/_runtime
_PACKAGE_INIT = '''"""Tuned fused-attention kernels exported by FlashCore tuner (provenance in manifest.json).

    from {name} import attention
    out = attention(q, k, v, causal=True)       # q [B, H, Sq, D], k/v [B, Hkv, Sk, D] on CUDA
    out = attention(q, k_cache, v_cache, block_table=table, seq_lens=lens)  # a paged cache (decode)
    out = attention(q, k, v, causal=True, window_size=(4095, -1), softcap=50.0)  # a sliding window, a softcap
    out = attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)  # float8_e4m3fn, descales [B, Hkv]
    print(attention.explain(q, k, v, causal=True))
    out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True)  # packed
    {name}.register_transformers()             # attn_implementation="tuned_attention" in transformers

Needs torch alone (and the NVIDIA driver to run). Importing checks manifest.json against the sha256 below,
then every file of the package against manifest.json's record (a file it does not list is refused);
_runtime/ is FlashCore tuner's runtime, as the tuner itself runs it.
"""

import hashlib as _hashlib
from pathlib import Path as _Path

# The root of trust, written at export: the sha256 of manifest.json (its record holds every other file's)
# and of the runtime modules, checked here before any of them runs (they run the rest of the check).
_MANIFEST_SHA256 = "{manifest_sha256}"
_RUNTIME_SHA256 = {runtime}


def _check_runtime() -> None:
    here = _Path(__file__).resolve().parent
    for rel, expected in _RUNTIME_SHA256.items():
        try:
            actual = _hashlib.sha256((here / rel).read_bytes()).hexdigest()
        except OSError:
            actual = "missing"
        if actual != expected:
            raise ImportError(__name__ + ": " + rel + " fails its integrity check (sha256 " + actual[:16]
                              + "... != " + expected[:16] + "... in __init__.py): the file was changed after "
                              "export; refusing to load it. Reinstall or re-export.")


_check_runtime()

from ._runtime.kernels import IntegrityError, manifest, verify_package  # noqa: E402 - only once checked

verify_package(_MANIFEST_SHA256)

from ._runtime.api import attention, explain  # noqa: E402 - only after the integrity check
from ._runtime.choice import table as _table  # noqa: E402
from ._runtime.hf import register_transformers  # noqa: E402
from ._runtime.launcher import AttentionInputError, GpuUnavailableError  # noqa: E402
from ._runtime.varlen import attention_varlen, explain_varlen  # noqa: E402

MANIFEST = manifest()
attention.table = _table()  # type: ignore[attr-defined]
__version__: str = MANIFEST["version"]
__all__ = ["AttentionInputError", "GpuUnavailableError", "IntegrityError", "MANIFEST", "attention",
           "attention_varlen", "explain", "explain_varlen", "register_transformers"]
'''
# What a manifest.json written by this module always holds: how --force tells an earlier export from user files.
_PROVENANCE_KEYS = ("format", "package", "version", "tuner_version", "exported_at", "gpu", "kernels", "entries")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def seal(pkg: Path) -> None:
    """(Re)write pkg/__init__.py, the root of trust of the package's import check, with the sha256 of
    pkg/manifest.json and of the runtime modules its record lists. Run after any change to the manifest
    (export --check records its cells there)."""
    raw = (pkg / "manifest.json").read_bytes()
    record = json.loads(raw)["files"]
    runtime = "".join(f"\n    {rel!r}: {sha!r}," for rel, sha in sorted(record.items()) if rel.startswith("_runtime/"))
    (pkg / "__init__.py").write_text(_PACKAGE_INIT.format(name=pkg.name, manifest_sha256=_sha(raw),
                                                          runtime="{" + runtime + "\n}"))


def is_package_export(out: Path, name: str) -> bool:
    """`out` holds an earlier package export `name`: its manifest.json carries the tuner's provenance keys."""
    try:
        manifest = json.loads((out / name / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and all(k in manifest for k in _PROVENANCE_KEYS) and manifest["package"] == name


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
dependencies = ["torch>=2.4"]

# The whole package folder ships (cubins, sources, manifest.json), whatever a .gitignore says.
[tool.hatch.build.targets.wheel]
packages = ["{name}"]
ignore-vcs = true

[tool.hatch.build.targets.sdist]
include = ["{name}", "README.md"]
ignore-vcs = true
"""


def _example(key: dict[str, Any]) -> str:
    """The README's example: a call of a tuned combination (its dtype, head dim, causality, window, softcap)."""
    call = f"causal={key['causal']}"
    if key.get("window_left", -1) >= 0 or key.get("window_right", -1) >= 0:
        call += f", window_size=({key['window_left']}, {key['window_right']})"
    if key.get("softcap"):
        call += f", softcap={key['softcap']:g}"
    shape = f"1, 8, 1024, {key['head_dim']}"
    s = spec(key["dtype"])
    q, kv = f"torch.{s.query.torch}", f"torch.{s.kv.torch}"
    if s.fp8 and not s.fp8_kv:  # FP8 inputs with their descales (float32 [B, Hkv]: real = stored * descale)
        return (f"q = k = v = torch.randn({shape}, device=\"cuda\").to({q})\n"
                "one = torch.ones(1, 8, device=\"cuda\")  # float32 [B, Hkv]: real = stored * descale\n"
                "scales = dict(q_descale=one, k_descale=one, v_descale=one)\n"
                f"out = attention(q, k, v, {call}, **scales)  # {s.output.torch}\n"
                f"print(attention.explain(q, k, v, {call}, **scales))\n")
    if s.fp8_kv:  # an FP8 KV cache: 16-bit q, e4m3 k and v with their scales (decode)
        return (f"q = torch.randn(1, 32, 1, {key['head_dim']}, dtype={q}, device=\"cuda\")\n"
                f"k = v = torch.randn(1, 8, 4096, {key['head_dim']}, device=\"cuda\").to({kv})\n"
                "one = torch.ones((), device=\"cuda\")  # float32: one, [Hkv] or [B, Hkv]; real = stored * scale\n"
                f"out = attention(q, k, v, {call}, k_scale=one, v_scale=one)\n"
                f"print(attention.explain(q, k, v, {call}, k_scale=one, v_scale=one))\n")
    return (f"q = k = v = torch.randn({shape}, dtype={q}, device=\"cuda\")\n"
            f"out = attention(q, k, v, {call})\nprint(attention.explain(q, k, v, {call}))\n")


def _readme(name: str, manifest: dict[str, Any]) -> str:
    chosen = [e for e in manifest["entries"] if e["dispatch"]]
    rows = "\n".join(f"- {e['problem_label']}: `{e['kernel']}` (trial {e['trial_id']}, {e['median_us']:.1f} us"
                     f"{', replayed' if e['run'].get('replayed_from') else ''})" for e in chosen)
    # A replayed run measured nothing: said where the timings are listed, as the manifest and explain() say it.
    replayed = ("**REPLAYED**: the timings marked replayed were answered from a recording "
                f"({', '.join(manifest['replayed_from'])}) by `tuner search --backend replay`, not measured on a "
                "GPU; re-run the search on the card before relying on them.\n\n") if manifest["replayed_from"] else ""
    # The example calls a combination that was tuned (dtype, head dim, causality of the first entry).
    key = chosen[0]["key"] if chosen else {"dtype": "fp16", "head_dim": 64, "causal": False}
    return (f"# {name}\n\nTuned attention kernels for {manifest['gpu']['display_name']} "
            f"({manifest['gpu']['arch']}), exported by FlashCore tuner {manifest['tuner_version']}.\n\n"
            f"```python\nimport torch\nfrom {name} import attention\n{_example(key)}```\n\n"
            f"Tuned problems (other shapes use the nearest tuned one; `fallback=\"sdpa\"` sends what no "
            f"kernel takes to torch SDPA):\n\n{rows}\n\n{replayed}"
            "Needs torch alone (the NVIDIA driver to run; nvcc only for a GPU no shipped cubin runs on). "
            "manifest.json holds the provenance and the sha256 of every kernel.\n")


def write_package(options: ExportOptions, name: str, profile: GpuProfile, manifest: dict[str, Any],
                  built: dict[str, ExportedKernel],
                  verify: Optional[Callable[[Path], None]] = None) -> ExportReport:
    """The package in options.out (staged, `verify`-ed there, then swapped in for an earlier one)."""
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
                # The problem's mask compiled in (FlashAttention's window_size, -1 unbounded; softcap 0 off).
                "window_left": k.variant.window_left, "window_right": k.variant.window_right,
                "softcap": k.variant.softcap,
                # A backward kernel's launch facts are its own (shipped/backward_kernel.BackwardShape).
                "launch": k.backward if k.backward is not None else dataclasses.asdict(k.built.shape),
                "pass": "backward" if k.backward is not None else "forward",
                "min_compute_capability": list(load_manifest(k.variant.template).min_compute_capability),
                "source": src_rel, "source_sha256": _sha(k.source.encode()),
                "cubins": {arch: {"path": cubin_rel, "sha256": _sha(k.cubin)}},
            }
        # The headers the kernel sources include (common/, <template>/), beside them, each with its sha256:
        # a JIT compile (or a user's nvcc) of kernels/<name>.cu needs them. One copy per path.
        headers = {rel: path for k in built.values()
                   for rel, path in list(load_manifest(k.variant.template).files.items())[1:]}
        manifest["headers"] = {}
        for rel, path in sorted(headers.items()):
            data = path.read_bytes()
            (pkg / "kernels" / rel).parent.mkdir(parents=True, exist_ok=True)
            (pkg / "kernels" / rel).write_bytes(data)
            manifest["headers"][f"kernels/{rel}"] = _sha(data)
            files.append(pkg / "kernels" / rel)
        shutil.copytree(RUNTIME_DIR, pkg / "_runtime", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        files += sorted(p for p in (pkg / "_runtime").rglob("*") if p.is_file())
        # The record (as a wheel's RECORD): every file but __init__.py, which holds the manifest's sha256.
        manifest["files"] = {p.relative_to(pkg).as_posix(): _sha(p.read_bytes()) for p in files}
        (pkg / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
        seal(pkg)
        files.append(pkg / "__init__.py")
        (root / "pyproject.toml").write_text(_pyproject(name))
        (root / "README.md").write_text(_readme(name, manifest))
        return files + [pkg / "manifest.json", root / "pyproject.toml", root / "README.md"]

    files = write_staged(options.out, names, write, verify)
    return ExportReport(options.out, "package", name, manifest["entries"], len(built), files)
