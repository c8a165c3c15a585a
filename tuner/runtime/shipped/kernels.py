"""Manifest, integrity check and kernel loading of an exported package.

Part of the runtime every export ships (this folder, copied whole as the package's _runtime/). The
package's import verifies manifest.json against the sha256 its __init__.py embeds (the root of trust), then
every file of the package against manifest.json's record of them (as a wheel's RECORD), and refuses a file
the record does not list: a tampered cubin, manifest or runtime module is refused before it can be loaded.
Kernels load lazily (first call on a device): from the shipped cubin when it runs there, else compiled from
the shipped source by nvcc, where the CUDA toolkit is installed (allow-listed options, checked headers only).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from .launcher import AttentionKernel, GpuUnavailableError, LaunchShape

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the export's package folder (this file is in _runtime/)
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The nvcc options an export may record (it writes tuner.kernels.compiler.BASE_OPTIONS less ptxas -v): the JIT
# runs nvcc with them, so anything else (-ccbin runs a program, -I or --include-path reads other headers,
# -Xcompiler passes flags on) is refused.
_NVCC_OPTION = re.compile(r"-O[0-3]|-std=c\+\+\d\d|--use_fast_math|-lineinfo|-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.]*)?")
NVCC_OPTIONS_ALLOWED = "-O0..-O3, -std=c++NN, --use_fast_math, -lineinfo, -DNAME[=VALUE]"
# Files a package holds beside those its record lists: the root of trust and the record itself. Python's own
# __pycache__ folders are passed over (an import writes them).
_UNRECORDED = ("__init__.py", "manifest.json")
_sealed: dict[str, str] = {}  # "manifest": the sha256 of manifest.json the package's __init__.py embeds


class IntegrityError(ImportError):
    """manifest.json is missing or malformed, or a shipped file does not match the sha256 it records."""


@lru_cache(maxsize=1)
def manifest() -> dict[str, Any]:
    """manifest.json beside this folder, read once and checked for the fields the runtime relies on."""
    where = f"{PACKAGE_DIR.name}: manifest.json"
    try:
        raw = (PACKAGE_DIR / "manifest.json").read_bytes()
    except OSError as exc:
        raise IntegrityError(f"{where} cannot be read ({exc.strerror or exc}); reinstall or re-export") from None
    expected = _sealed.get("manifest")
    actual = hashlib.sha256(raw).hexdigest()
    if expected is not None and actual != expected:  # checked before it is parsed: nothing edited is read
        raise IntegrityError(
            f"{where} fails its integrity check (sha256 {actual[:16]}... != {expected[:16]}... in __init__.py): the "
            "file was changed after export; refusing to load it. Reinstall or re-export.")
    try:
        data = json.loads(raw.decode())
    except ValueError as exc:
        raise IntegrityError(f"{where} is not valid JSON ({exc}); reinstall or re-export") from None
    required = ("package", "version", "kernels", "entries", "nvcc_options")
    if not isinstance(data, dict) or any(key not in data for key in required):
        missing = [k for k in required if not isinstance(data, dict) or k not in data]
        raise IntegrityError(f"{where} lacks {', '.join(missing)}; re-export")
    problem = _malformed(data)
    if problem:
        raise IntegrityError(f"{where} is malformed: {problem}; re-export")
    return data


def _malformed(data: dict[str, Any]) -> Optional[str]:
    """The first field the runtime relies on that is absent or of the wrong kind (None: all well)."""
    if not isinstance(data["package"], str) or not isinstance(data["version"], str):
        return "package and version must be strings"
    if not isinstance(data["kernels"], dict) or not isinstance(data["entries"], list):
        return "kernels must be an object and entries a list"
    if not isinstance(data["nvcc_options"], list) or not all(isinstance(o, str) for o in data["nvcc_options"]):
        return "nvcc_options must be a list of strings"
    wrong_option = bad_nvcc_option(data["nvcc_options"])
    if wrong_option is not None:
        return f"nvcc_options holds {wrong_option!r}, not one an export writes ({NVCC_OPTIONS_ALLOWED})"
    wrong = _bad_digests(data.get("files", {}), "files (the record of the package's files)", "file")
    if wrong:
        return wrong
    for name, meta in data["kernels"].items():
        if not isinstance(meta, dict) or not isinstance(meta.get("cubins"), dict):
            return f"kernel {name} has no cubins object"
        for key in ("entry", "source"):
            if not isinstance(meta.get(key), str):
                return f"kernel {name}'s {key} is {meta.get(key)!r}, not a string"
        cc = meta.get("min_compute_capability")
        if not (isinstance(cc, list) and len(cc) == 2 and all(isinstance(x, int) for x in cc)):
            return f"kernel {name}'s min_compute_capability is {cc!r}, not [major, minor]"
        if not isinstance(meta.get("launch"), dict):
            return f"kernel {name} has no launch object"
        for flag in ("descales", "fp8", "kv_fp8", "packed"):  # absent before them: False (LaunchShape's defaults)
            if not isinstance(meta["launch"].get(flag, False), bool):
                return f"kernel {name}'s launch {flag} is {meta['launch'][flag]!r}, not true or false"
        wrong = _bad_mask(meta)
        if wrong:
            return f"kernel {name}'s {wrong}"
        hashes = [("source_sha256", meta.get("source_sha256"))]
        for arch, cubin in meta["cubins"].items():
            if not isinstance(cubin, dict) or not isinstance(cubin.get("path"), str):
                return f"kernel {name}'s {arch} cubin has no path"
            hashes.append((f"{arch} cubin sha256", cubin.get("sha256")))
        for what, digest in hashes:
            if not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
                return f"kernel {name}'s {what} is {digest!r}, not a sha256"
    for i, entry in enumerate(data["entries"]):
        key = entry.get("key") if isinstance(entry, dict) else None
        wrong = (_bad_mask(key) or _bad_form(key)) if isinstance(key, dict) else None
        if wrong:
            return f"entry {i}'s key {wrong}"
        launch = data["kernels"].get(str(entry.get("kernel")), {}).get("launch", {}) if isinstance(key, dict) else {}
        if isinstance(key, dict) and key.get("dtype") == "e4m3" and not launch.get("fp8"):
            return f"entry {i} is e4m3, but its kernel {entry.get('kernel')!r} does not launch as one (launch fp8)"
        if isinstance(key, dict) and bool(key.get("packed", False)) != bool(launch.get("packed", False)):
            return (f"entry {i} is {'' if key.get('packed') else 'not '}for packed sequences, but its kernel "
                    f"{entry.get('kernel')!r} {'does not launch' if key.get('packed') else 'launches'} as one "
                    f"(launch packed)")
        wrong = _bad_backward(data["kernels"], entry) if isinstance(key, dict) else None
        if wrong:
            return f"entry {i}'s {wrong}"
        if isinstance(key, dict) and str(key.get("dtype")).endswith("_kv_e4m3") and not launch.get("kv_fp8"):
            return (f"entry {i} is an FP8 KV cache's, but its kernel {entry.get('kernel')!r} does not launch as one "
                    f"(launch kv_fp8)")
    return _bad_digests(data.get("headers", {}), "headers", "header")


BACKWARD_LAUNCH = ("head_dim", "block_n", "threads", "smem_bytes", "aux_threads", "aux_rows", "lse_row_pad")


def _bad_backward(kernels: dict[str, Any], entry: dict[str, Any]) -> Optional[str]:
    """What is wrong with an entry's kernels as to pass (None: nothing): its kernel a forward one; its backward
    (absent or null before them: SDPA's) a backward kernel of the table whose launch facts are positive integers."""
    if kernels.get(str(entry.get("kernel")), {}).get("pass", "forward") != "forward":
        return f"kernel {entry.get('kernel')!r} is not a forward kernel"
    record = entry.get("backward")
    if record is None:
        return None
    meta = kernels.get(str(record.get("kernel"))) if isinstance(record, dict) else None
    if not isinstance(meta, dict) or meta.get("pass") != "backward":
        return f"backward {record!r} names no backward kernel of the kernels table"
    launch = meta["launch"]
    if not all(isinstance(launch.get(f), int) and not isinstance(launch.get(f), bool) and launch[f] > 0
               for f in BACKWARD_LAUNCH) or not isinstance(launch.get("dtype"), str):
        return f"backward kernel {record['kernel']}'s launch lacks positive integers {', '.join(BACKWARD_LAUNCH)}"
    return None


def _bad_digests(record: Any, name: str, item: str) -> Optional[str]:
    """What is wrong with a {relative path: sha256} record of the manifest (None: nothing)."""
    if not isinstance(record, dict):
        return f"{name} must be an object"
    for rel, digest in record.items():
        if not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
            return f"{item} {rel}'s sha256 is {digest!r}, not a sha256"
    return None


def bad_nvcc_option(options: list[str]) -> Optional[str]:
    """The first of `options` outside the allow-list (None: all allowed)."""
    return next((o for o in options if not _NVCC_OPTION.fullmatch(o)), None)


def _bad_mask(fields: dict[str, Any]) -> Optional[str]:
    """What is wrong with the optional mask fields of a kernel or an entry's key (None: absent or well-formed):
    window_left / window_right integers >= -1 and softcap a number >= 0. A manifest written before them has none
    (read as no window, no softcap)."""
    for side in ("window_left", "window_right"):
        value = fields.get(side, -1)
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            return f"{side} is {value!r}, not an integer >= -1"
    softcap = fields.get("softcap", 0.0)
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 <= softcap < float("inf"):
        return f"softcap is {softcap!r}, not a number >= 0"
    return None


def _bad_form(key: dict[str, Any]) -> Optional[str]:
    """What is wrong with an entry key's optional call form (None: absent or well-formed): page_size 0 (dense) or
    a page of 16 to 256 rows, seq_lens and packed true or false. A manifest written before them has none (dense)."""
    page = key.get("page_size", 0)
    if isinstance(page, bool) or page not in (0, 16, 32, 64, 128, 256):
        return f"page_size is {page!r}, not 0 (dense) or a page size of 16 to 256 rows"
    for flag in ("seq_lens", "packed"):
        if not isinstance(key.get(flag, False), bool):
            return f"{flag} is {key[flag]!r}, not true or false"
    return None


def __getattr__(name: str) -> Any:
    if name == "MANIFEST":  # read on first use, so that this folder imports in place (the tuner) too
        return manifest()
    raise AttributeError(name)


_loaded: dict[tuple[str, int], AttentionKernel] = {}
_failed: dict[tuple[str, int], str] = {}  # why a kernel cannot load on a device, once found
_loading = threading.Lock()  # two threads' first calls load a kernel once


def package_path(rel: Any) -> Path:
    """A file named by the manifest, which must lie inside the package (no absolute path, no '..')."""
    path = (PACKAGE_DIR / str(rel)).resolve()
    if not isinstance(rel, str) or PACKAGE_DIR not in path.parents:
        raise IntegrityError(f"{manifest()['package']}: manifest.json names {rel!r}, outside the package; refusing it")
    return path


def verified_bytes(rel: str, expected: str) -> bytes:
    """The bytes of a shipped file, read once and checked against its sha256 (what is checked is what is used)."""
    path = package_path(rel)
    try:
        data = path.read_bytes()
    except OSError:
        raise IntegrityError(f"{manifest()['package']}: {rel} is missing; reinstall or re-export the package") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise IntegrityError(
            f"{manifest()['package']}: {rel} fails its integrity check (sha256 {actual[:16]}... != {expected[:16]}... in "
            f"manifest.json): the file was changed after export; refusing to load it. Reinstall or re-export.")
    return data


def shipped_files() -> list[tuple[str, str]]:
    """(relative path, expected sha256) of every file manifest.json's record lists (_runtime/ included) and of
    every cubin, source and header its kernels name."""
    files = list(manifest().get("files", {}).items())
    for meta in manifest()["kernels"].values():
        files.append((meta["source"], meta["source_sha256"]))
        files.extend((c["path"], c["sha256"]) for c in meta["cubins"].values())
    files.extend(manifest().get("headers", {}).items())  # what the sources include (a JIT compile reads them)
    return files


def verify_package(manifest_sha256: str) -> None:
    """Raise IntegrityError naming the first file that is missing, altered, outside the package or not in its
    record. `manifest_sha256` is manifest.json's, as the package's __init__.py embeds it: the manifest holds
    every other file's sha256, so it is checked first (and read once: what is checked is what is used)."""
    _sealed["manifest"] = manifest_sha256
    manifest.cache_clear()
    if "files" not in manifest():
        raise IntegrityError(f"{manifest()['package']}: manifest.json has no record of the package's files; re-export")
    try:
        files = shipped_files()
    except (KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"{manifest()['package']}: manifest.json is malformed ({exc!r}); re-export") from None
    for rel, expected in files:
        verified_bytes(rel, expected)
    added = _unrecorded_file(set(manifest()["files"]))
    if added is not None:
        raise IntegrityError(
            f"{manifest()['package']}: {added} is not in manifest.json's record of the package's files: it was "
            "added after export; refusing to load the package. Remove it, or reinstall or re-export.")


def _unrecorded_file(record: set[str]) -> Optional[str]:
    """The first file (or link) in the package that `record` does not list, if any (__pycache__ passed over)."""
    import os

    for top, dirs, names in os.walk(PACKAGE_DIR):
        rel_top = Path(top).relative_to(PACKAGE_DIR)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" or os.path.islink(os.path.join(top, d)))
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]  # a linked folder is not walked: refused
        for entry in sorted(names) + links:
            rel = (rel_top / entry).as_posix()
            if rel not in record and rel not in _UNRECORDED:
                return rel
    return None


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
    arch = cubin_arch_for(manifest()["kernels"][kernel]["cubins"], cc)
    if arch:
        return f"shipped cubin {arch} (device compute capability {cc[0]}.{cc[1]})"
    return f"JIT compile of the shipped source for sm_{cc[0]}{cc[1]} (no shipped cubin runs on {cc[0]}.{cc[1]})"


def _jit_cubin(source: str, cc: tuple[int, int]) -> bytes:
    """The shipped source compiled by nvcc for compute capability `cc`, with the tuner's options (recorded at
    export, allow-listed) and the shipped headers alone: checked again now and copied to a fresh folder, so
    that nothing else in (or added to) the package folder can be included. Needs the CUDA toolkit; the
    shipped cubins do not."""
    import os
    import shutil
    import subprocess
    import tempfile

    nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    if not os.path.exists(nvcc):
        raise GpuUnavailableError(f"no shipped cubin runs on compute capability {cc[0]}.{cc[1]}, and nvcc (the CUDA "
                                  "toolkit) is not on PATH to compile the shipped source")
    # sm_90+ kernels may use arch-specific instructions (wgmma, setmaxnreg): build for e.g. sm_90a.
    arch = f"{cc[0]}{cc[1]}" + ("a" if cc[0] >= 9 else "")
    options = manifest()["nvcc_options"]
    wrong = bad_nvcc_option(options)
    if wrong is not None:  # refused on import too; checked where it is used
        raise IntegrityError(f"{manifest()['package']}: manifest.json's nvcc_options hold {wrong!r}; refusing to run "
                             f"nvcc with it (allowed: {NVCC_OPTIONS_ALLOWED})")
    with tempfile.TemporaryDirectory(prefix="tuned-attention-jit-") as tmp:
        include = Path(tmp) / "include"  # kernels/<rel> of the package -> include/<rel>, as the sources expect
        for rel, expected in manifest().get("headers", {}).items():  # what nvcc will include
            data = verified_bytes(rel, expected)
            parts = Path(rel).parts
            target = include.joinpath(*parts[1:]).resolve() if parts[:1] == ("kernels",) else include
            if include.resolve() not in target.parents:
                raise IntegrityError(f"{manifest()['package']}: manifest.json's header {rel!r} is not under kernels/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        src.write_text(source)
        command = [nvcc, "-cubin", *options, "-gencode", f"arch=compute_{arch},code=sm_{arch}",
                   "-I", str(include), "-o", str(out), str(src)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc could not compile the shipped source for sm_{arch}: "
                               f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return out.read_bytes()


def load_kernel(kernel: str, device: int) -> AttentionKernel:
    """The kernel loaded for `device` (once per process and device; any thread may call). A kernel that cannot
    load there (this card's compute capability or shared memory, no nvcc or a failed JIT compile, the driver
    refusing the module) raises GpuUnavailableError, which fallback="sdpa" takes; the failure is remembered, so
    later calls fall back without trying again (nvcc is not re-run on every call)."""
    return load_once(_loaded, _failed, kernel, device, _load)


def load_once(loaded: dict, failed: dict, kernel: str, device: int, load: Any,
              remembered: tuple = (RuntimeError,)) -> Any:
    """`load(kernel, device)` once per process, kernel and device, kept in `loaded` (any thread may call). A
    failure of the `remembered` kinds (GpuUnavailableError among them) is kept in `failed` and raised as
    GpuUnavailableError, then and on every later call; others (a ValueError: bad input) are not remembered."""
    got = loaded.get((kernel, device))
    if got is not None:
        return got
    with _loading:
        if (kernel, device) in failed:
            raise GpuUnavailableError(failed[(kernel, device)])
        if (kernel, device) not in loaded:
            try:
                loaded[(kernel, device)] = load(kernel, device)
            except remembered as exc:
                why = exc if isinstance(exc, RuntimeError) else repr(exc)
                failed[(kernel, device)] = (str(exc) if isinstance(exc, GpuUnavailableError)
                                            else f"{kernel} does not load on cuda:{device}: {why}")
                raise GpuUnavailableError(failed[(kernel, device)]) from None
    return loaded[(kernel, device)]


def _load(kernel: str, device: int) -> AttentionKernel:
    import torch

    if not torch.cuda.is_available():
        raise GpuUnavailableError("no CUDA GPU is visible to torch on this machine")
    meta = manifest()["kernels"][kernel]
    cc = torch.cuda.get_device_capability(device)
    need = tuple(meta["min_compute_capability"])
    if cc < need:
        raise RuntimeError(f"{kernel} needs compute capability {need[0]}.{need[1]}+, cuda:{device} has {cc[0]}.{cc[1]}")
    limit = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    smem = meta["launch"]["smem_bytes"]
    if limit and smem > limit:
        raise RuntimeError(f"{kernel} needs {smem} B shared memory per block; cuda:{device} allows {limit} B")
    return AttentionKernel(machine_code(meta, cc), meta["entry"], LaunchShape(**meta["launch"]), device)


def machine_code(meta: dict, cc: tuple[int, int]) -> bytes:
    """A kernels-table entry's cubin for a card of capability `cc`: the shipped one for its arch, else the shipped
    source compiled here."""
    arch = cubin_arch_for(meta["cubins"], cc)
    if arch:  # checked again: the file may have changed since import
        return verified_bytes(meta["cubins"][arch]["path"], meta["cubins"][arch]["sha256"])
    # the source is checked like a cubin: it is what the JIT turns into machine code
    return _jit_cubin(verified_bytes(meta["source"], meta["source_sha256"]).decode(), cc)
