"""nvcc invocation, ptxas statistics and a content-hash cache of cubins.

We call nvcc the way PyCUDA's compiler does (source -> cubin), but directly,
because we also need ptxas's resource report (registers, spills) and because
compiling must work on machines without a GPU driver (CI, a compile pool).
The cubin is loaded with PyCUDA in tuner.runtime.driver.
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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import platformdirs

from tuner.errors import TunerError

BASE_OPTIONS = ("-O3", "-std=c++17", "--ptxas-options=-v", "-lineinfo")


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


def cache_dir() -> Path:
    path = Path(os.environ.get("TUNER_CACHE_DIR") or platformdirs.user_cache_dir("flashcore-tuner")) / "cubins"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_key(source: str, arch: str, options: tuple[str, ...] = BASE_OPTIONS) -> str:
    text = "\0".join([source, arch, *options, nvcc_version()])
    return hashlib.sha256(text.encode()).hexdigest()


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


def compile_source(source: str, entry: str, arch: str, *, use_cache: bool = True, timeout_s: float = 300.0) -> CompileResult:
    """Compile CUDA source to a cubin for `arch`; failures are a result, not an exception."""
    key = cache_key(source, arch)
    cdir = cache_dir()
    cubin_path, meta_path = cdir / f"{key}.cubin", cdir / f"{key}.json"
    if use_cache and cubin_path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        meta.update(cubin_path=cubin_path, cached=True)
        return CompileResult(**meta)
    start = time.perf_counter()
    # -lineinfo embeds the source path in the cubin: build in a directory named
    # after the content key so the same source always yields the same bytes
    # (export compares cubin hashes across machines and cache wipes).
    build = Path(tempfile.gettempdir()) / "tuner-nvcc" / key[:32]
    build.mkdir(parents=True, exist_ok=True)
    src = build / f"{entry}.cu"
    tmp_src = build / f"{entry}.cu.{os.getpid()}.{threading.get_ident()}"
    tmp_src.write_text(source)
    os.utime(tmp_src, (0, 0))  # the line table records the source's mtime: pin it
    os.replace(tmp_src, src)  # identical content (and mtime) whoever wins
    out = build / f"{entry}.{os.getpid()}.{threading.get_ident()}.cubin"
    cmd = [find_nvcc(), "-cubin", *BASE_OPTIONS, *arch_flags(arch), "-o", str(out), str(src)]
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


def compile_many(jobs: list[tuple[str, str, str]], workers: int | None = None) -> list[CompileResult]:
    """Compile (source, entry, arch) jobs in a process pool, results in order."""
    workers = workers or max(1, (os.cpu_count() or 2))
    if workers == 1 or len(jobs) <= 1:
        return [compile_source(*job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_compile_job, jobs))


def _compile_job(job: tuple[str, str, str]) -> CompileResult:
    return compile_source(*job)
