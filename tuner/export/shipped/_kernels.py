"""Manifest, integrity check and kernel loading of an exported package.

Copied verbatim into every package written by `tuner export`. The import
verifies every shipped file against the sha256 in manifest.json, so a
tampered cubin is refused before it can be loaded. Kernels load lazily
(first call): from the shipped cubin when it runs on the device, else
JIT-compiled from the shipped source with PyCUDA's compiler.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Optional

from ._launcher import AttentionKernel, LaunchShape, bind_torch_context

PACKAGE_DIR = Path(__file__).resolve().parent


class IntegrityError(ImportError):
    """manifest.json is missing or malformed, or a shipped file does not match the sha256 it records."""


def _read_manifest() -> dict[str, Any]:
    where = f"{PACKAGE_DIR.name}: manifest.json"
    try:
        manifest = json.loads((PACKAGE_DIR / "manifest.json").read_text())
    except OSError as exc:
        raise IntegrityError(f"{where} cannot be read ({exc.strerror or exc}); reinstall or re-export") from None
    except ValueError as exc:
        raise IntegrityError(f"{where} is not valid JSON ({exc}); reinstall or re-export") from None
    required = ("package", "version", "kernels", "entries", "nvcc_options")
    if not isinstance(manifest, dict) or any(key not in manifest for key in required):
        raise IntegrityError(f"{where} lacks {', '.join(k for k in required if k not in manifest)}; re-export")
    return manifest


MANIFEST: dict[str, Any] = _read_manifest()
_loaded: dict[str, AttentionKernel] = {}


def package_path(rel: Any) -> Path:
    """A file named by the manifest, which must lie inside the package (no absolute path, no '..')."""
    path = (PACKAGE_DIR / str(rel)).resolve()
    if not isinstance(rel, str) or PACKAGE_DIR not in path.parents:
        raise IntegrityError(f"{MANIFEST['package']}: manifest.json names {rel!r}, outside the package; refusing it")
    return path


def verified_bytes(rel: str, expected: str) -> bytes:
    """The bytes of a shipped file, read once and checked against its sha256 (what is checked is what is used)."""
    path = package_path(rel)
    try:
        data = path.read_bytes()
    except OSError:
        raise IntegrityError(f"{MANIFEST['package']}: {rel} is missing; reinstall or re-export the package") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise IntegrityError(
            f"{MANIFEST['package']}: {rel} fails its integrity check (sha256 {actual[:16]}... != {expected[:16]}... in "
            f"manifest.json): the file was changed after export; refusing to load it. Reinstall or re-export.")
    return data


def shipped_files() -> list[tuple[str, str]]:
    """(relative path, expected sha256) of every cubin, source and header in the manifest."""
    files = []
    for meta in MANIFEST["kernels"].values():
        files.append((meta["source"], meta["source_sha256"]))
        files.extend((c["path"], c["sha256"]) for c in meta["cubins"].values())
    files.extend(MANIFEST.get("headers", {}).items())  # what the sources include (a JIT compile reads them)
    return files


def verify_package() -> None:
    """Raise IntegrityError naming the first file that is missing, altered or outside the package."""
    try:
        files = shipped_files()
    except (KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"{MANIFEST['package']}: manifest.json is malformed ({exc!r}); re-export") from None
    for rel, expected in files:
        verified_bytes(rel, expected)


def _arch_parts(arch: str) -> tuple[int, int, bool]:
    m = re.fullmatch(r"sm_(\d+)(\d)(a?)", arch)
    if not m:
        raise ValueError(f"malformed arch {arch!r}")
    return int(m.group(1)), int(m.group(2)), bool(m.group(3))


def cubin_arch_for(cubins: dict[str, Any], cc: tuple[int, int]) -> Optional[str]:
    """The shipped cubin arch that runs on compute capability `cc`, if any.

    A cubin for sm_XY runs on X.Z with Z >= Y; an arch-specific one (sm_90a) only on X.Y itself.
    """
    fits = []
    for arch in cubins:
        major, minor, specific = _arch_parts(arch)
        if major == cc[0] and (minor == cc[1] if specific else minor <= cc[1]):
            fits.append((minor, specific, arch))
    return max(fits)[2] if fits else None


def code_source(kernel: str, cc: Optional[tuple[int, int]]) -> str:
    """Where `kernel`'s machine code comes from on a device of capability `cc` (for explain())."""
    if cc is None:
        return "no CUDA device: nothing would be loaded"
    arch = cubin_arch_for(MANIFEST["kernels"][kernel]["cubins"], cc)
    if arch:
        return f"shipped cubin {arch} (device compute capability {cc[0]}.{cc[1]})"
    return f"JIT compile of the shipped source for sm_{cc[0]}{cc[1]} (no shipped cubin runs on {cc[0]}.{cc[1]})"


def _jit_cubin(source: str, cc: tuple[int, int]) -> bytes:
    from pycuda.compiler import compile as nvcc_compile

    # The source already declares its entry point extern "C"; the options are the tuner's, recorded at export.
    options = list(MANIFEST["nvcc_options"])
    # sm_90+ kernels may use arch-specific instructions (wgmma, setmaxnreg): build for e.g. sm_90a.
    arch = f"sm_{cc[0]}{cc[1]}" + ("a" if cc[0] >= 9 else "")
    for rel, expected in MANIFEST.get("headers", {}).items():  # what nvcc will include, checked again now
        verified_bytes(rel, expected)
    return nvcc_compile(source, options=options, arch=arch, no_extern_c=True,
                        include_dirs=[str(PACKAGE_DIR / "kernels")])


def load_kernel(kernel: str, device: int) -> AttentionKernel:
    """Load (once per process) the kernel onto `device` in torch's CUDA context."""
    if kernel in _loaded:
        return _loaded[kernel]
    import torch

    bind_torch_context(device)
    meta = MANIFEST["kernels"][kernel]
    cc = torch.cuda.get_device_capability(device)
    need = tuple(meta["min_compute_capability"])
    if cc < need:
        raise RuntimeError(f"{kernel} needs compute capability {need[0]}.{need[1]}+, cuda:{device} has {cc[0]}.{cc[1]}")
    limit = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    smem = meta["launch"]["smem_bytes"]
    if limit and smem > limit:
        raise RuntimeError(f"{kernel} needs {smem} B shared memory per block; cuda:{device} allows {limit} B")
    arch = cubin_arch_for(meta["cubins"], cc)
    if arch:  # checked again: the file may have changed since import
        cubin = verified_bytes(meta["cubins"][arch]["path"], meta["cubins"][arch]["sha256"])
    else:  # the source is checked like a cubin: it is what the JIT turns into machine code
        cubin = _jit_cubin(verified_bytes(meta["source"], meta["source_sha256"]).decode(), cc)
    shape = LaunchShape(**meta["launch"])
    _loaded[kernel] = AttentionKernel(cubin, meta["entry"], shape, device)
    return _loaded[kernel]
