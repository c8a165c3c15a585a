"""nvcc invocation, ptxas statistics and a content-hash cache of cubins.

We call nvcc the way PyCUDA's compiler does (source -> cubin), but directly,
because we also need ptxas's resource report (registers, spills) and because
compiling must work on machines without a GPU driver (CI, a compile pool).
The cubin is loaded through the CUDA driver's ctypes door, tuner/runtime/shipped/cuda_driver.py.

Headers: a rendered template `#include`s headers by paths relative to the
templates folders (e.g. "common/utils.h", "attn_fwd_wgmma/config.h"). The
headers reachable from the source (tuner.kernels.manifest.find_headers) are
part of the cache key, by name and content, and are copied into the build
folder, which nvcc gets as its include dir: nvcc sees exactly the hashed
files, and the paths -lineinfo records do not depend on where the templates
are installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import platformdirs

from tuner.errors import TunerError
from tuner.kernels.manifest import find_headers, template_folders

# -DFC_LITE_CUDA_TYPES: the templates declare the few CUDA element types and conversions they use
# (kernel_templates/common/cuda_types.h) instead of parsing cuda_fp16.h, cuda_bf16.h and cuda_fp8.h, about
# 0.16 of a compile's ~1 CPU-s; the cubin is the same bytes (tests/test_lite_cuda_types.py).
BASE_OPTIONS = ("-O3", "-std=c++17", "--ptxas-options=-v", "-DFC_LITE_CUDA_TYPES")
# -lineinfo maps SASS to source lines for ncu's source view (tuner profile builds with it). It only adds
# debug sections (the .text is the same), but those record the build folder, so a search's cubins,
# whose hashes export compares across machines, are built without it.
LINEINFO = "-lineinfo"


@dataclass(frozen=True)
class CompileResult:
    ok: bool
    entry: str
    arch: str
    cubin_path: Path | None
    cubin_sha256: str
    registers: int
    spill_bytes: int  # spill stores + spill loads
    stack_bytes: int
    static_smem_bytes: int
    seconds: float
    log: str
    cached: bool = False

    @property
    def cubin(self) -> bytes:
        if self.cubin_path is None:
            raise TunerError(f"{self.entry}: no cubin (compile failed)")
        return self.cubin_path.read_bytes()


def find_nvcc() -> str:
    nvcc = shutil.which("nvcc") or (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc") if "CUDA_HOME" in os.environ else None)
    if not nvcc or not os.path.exists(nvcc):
        raise TunerError("nvcc not found: install the CUDA toolkit or put nvcc on PATH (or set CUDA_HOME)")
    return nvcc


@lru_cache(maxsize=None)
def nvcc_version() -> str:
    out = subprocess.run([find_nvcc(), "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"release [\d.]+, V([\d.]+)", out)
    return match.group(1) if match else out.strip().splitlines()[-1]


def arch_flags(arch: str) -> list[str]:
    """-gencode for one real arch; 'sm_90a' needs the compute_90a virtual arch."""
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise TunerError(f"malformed GPU arch {arch!r}; expected e.g. sm_80 or sm_90a")
    return ["-gencode", f"arch=compute_{arch[3:]},code={arch}"]


def cache_root() -> Path:
    """The tuner's cache folder (TUNER_CACHE_DIR, else the user's cache dir): cubins/, fa4/."""
    return Path(os.environ.get("TUNER_CACHE_DIR") or platformdirs.user_cache_dir("flashcore-tuner"))


def cache_dir() -> Path:
    path = cache_root() / "cubins"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_key(source: str, arch: str, options: tuple[str, ...] = BASE_OPTIONS,
              headers: dict[str, bytes] | None = None) -> str:
    """Content hash of one compile: source, arch, options, nvcc's version and
    the headers the source includes (relative name -> content)."""
    text = "\0".join([source, arch, *options, nvcc_version()])
    for rel, content in sorted((headers or {}).items()):
        text += f"\0{rel}\0{hashlib.sha256(content).hexdigest()}"
    return hashlib.sha256(text.encode()).hexdigest()


def _write_pinned(path: Path, data: bytes) -> None:
    """Write atomically with a fixed mtime: -lineinfo records files' mtimes, and
    concurrent compiles of one key write the same bytes (whoever wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(data)
    os.utime(tmp, (0, 0))
    os.replace(tmp, path)


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str, entry: str) -> dict[str, int]:
    """Registers, spills, stack and static smem of `entry` from a ptxas -v log."""
    stats = {"registers": 0, "spill_bytes": 0, "stack_bytes": 0, "static_smem_bytes": 0}
    current = None
    for line in log.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            current = m.group(1)
            continue
        if current != entry:
            continue
        if m := _PTXAS_STACK.search(line):
            stats["stack_bytes"] = int(m.group(1))
            stats["spill_bytes"] = int(m.group(2)) + int(m.group(3))
        if m := _PTXAS_REGS.search(line):
            stats["registers"] = int(m.group(1))
        if m := _PTXAS_SMEM.search(line):
            stats["static_smem_bytes"] = int(m.group(1))
    return stats


def _private_build_folder() -> Path:
    """A fresh folder only this user can enter, under the user's cache (never a shared, guessable /tmp
    path that another user could have planted as a symlink)."""
    root = cache_dir().parent / "build"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="nvcc-", dir=root))


def compile_source(source: str, entry: str, arch: str, *, use_cache: bool = True, timeout_s: float = 300.0,
                   include_dirs: tuple[str | os.PathLike, ...] | None = None, lineinfo: bool = False) -> CompileResult:
    """Compile CUDA source to a cubin for `arch`; failures are a result, not an exception.

    Quoted #includes resolve in `include_dirs` (overlaid, earlier ones win;
    default: the templates folders, tuner.kernels.manifest.template_folders()).
    """
    dirs = template_folders() if include_dirs is None else tuple(Path(d) for d in include_dirs)
    try:
        headers = {rel: path.read_bytes() for rel, path in find_headers(source, dirs).items()}
    except (OSError, TunerError) as exc:
        return CompileResult(False, entry, arch, None, "", 0, 0, 0, 0, 0.0, f"cannot read the included headers: {exc}")
    options = BASE_OPTIONS + ((LINEINFO,) if lineinfo else ())
    key = cache_key(source, arch, options, headers=headers)
    cdir = cache_dir()
    cubin_path, meta_path = cdir / f"{key}.cubin", cdir / f"{key}.json"
    if use_cache and cubin_path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        meta.update(cubin_path=cubin_path, cached=True)
        return CompileResult(**meta)
    start = time.perf_counter()
    build = _private_build_folder()
    try:
        return _compile_in(build, source, headers, entry, arch, options, timeout_s, start, cubin_path, meta_path)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _compile_in(build: Path, source: str, headers: dict[str, bytes], entry: str, arch: str, options: tuple[str, ...],
                timeout_s: float, start: float, cubin_path: Path, meta_path: Path) -> CompileResult:
    """nvcc in `build`; the result (cubin and ptxas statistics) is written to the cache atomically."""
    src = build / f"{entry}.cu"
    _write_pinned(src, source.encode())
    include = build / "include"
    for rel, content in headers.items():
        _write_pinned(include / rel, content)
    out = build / f"{entry}.{os.getpid()}.{threading.get_ident()}.cubin"
    cmd = [find_nvcc(), "-cubin", *options, *arch_flags(arch), *(["-I", str(include)] if headers else []),
           "-o", str(out), str(src)]
    try:
        # Own session: a Ctrl-C at the terminal stops the search after the current
        # trial, and must not kill nvcc mid-compile (that would store a bogus compile_error).
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False,
                              start_new_session=True)
        log, ok = proc.stdout + proc.stderr, proc.returncode == 0 and out.exists()
    except subprocess.TimeoutExpired:
        log, ok = f"nvcc timed out after {timeout_s:.0f} s", False
    seconds = time.perf_counter() - start
    log = log.replace(str(build) + "/", "")
    data = out.read_bytes() if ok else b""
    out.unlink(missing_ok=True)
    if not ok:
        return CompileResult(False, entry, arch, None, "", 0, 0, 0, 0, seconds, log)
    stats = parse_ptxas(log, entry)
    result = CompileResult(True, entry, arch, None, hashlib.sha256(data).hexdigest(), seconds=seconds, log=log, **stats)
    # Write atomically so concurrent compiles of the same key never see half a file.
    for path, payload in ((cubin_path, data), (meta_path, json.dumps({k: v for k, v in asdict(result).items() if k not in ("cubin_path", "cached")}).encode())):
        tmp_path = path.with_suffix(path.suffix + f".{os.getpid()}.{threading.get_ident()}.tmp")  # threads share a pid
        tmp_path.write_bytes(payload)
        os.replace(tmp_path, path)
    return CompileResult(**{**asdict(result), "cubin_path": cubin_path})
