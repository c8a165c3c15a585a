"""tuner export (CPU): the package, its manifest, integrity check, dispatch table, SDPA fallback, CLI."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from header_build import assert_user_kernel_builds, build_host_lookup

from tests.cli_helpers import run_tuner
from tuner.errors import TunerError
from tuner.export.run import ExportOptions, export
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.timed import Timing
from tuner.status import TrialStatus
from tuner.store import BaselineRecord, RunInfo, TrialRecord, open_store

# --- a results store whose ok trials carry the sha256 of real local cubins ------------------

TEMPLATE = "attn_fwd_mma"
PROFILE = "h100"
GPU_NAME = "NVIDIA H100 80GB HBM3"

BIG = Problem(2, 8, 2048, 2048, 64)                                # fp16 D64, buckets 11/11
SMALL = Problem(2, 8, 256, 256, 64)                                # fp16 D64, buckets 8/8
SHADOWED = Problem(2, 6, 2048, 2048, 64)                           # same key as BIG (B x H bucket 4), less work
GQA_CAUSAL = Problem(1, 16, 1024, 1024, 128, dtype="bf16", causal=True, heads_kv=4)  # group 4

_COMMON = dict(NUM_WARPS=4, KV_SPLIT=1, STAGES=2, Q_IN_REGS=True, MIN_BLOCKS=1, LAZY_RESCALE=False)
PARAMS = {
    "big": dict(_COMMON, BLOCK_M=64, BLOCK_N=64, SWIZZLE="xor"),
    "small": dict(_COMMON, BLOCK_M=64, BLOCK_N=32, SWIZZLE="pad"),
    "gqa": dict(_COMMON, BLOCK_M=64, BLOCK_N=32, SWIZZLE="xor"),
    "slow": dict(_COMMON, BLOCK_M=64, BLOCK_N=64, SWIZZLE="none", STAGES=1),
}


@dataclass(frozen=True)
class ExportStore:
    url: str
    trial_ids: dict[str, int]  # "big", "small", "shadowed", "gqa", "slow", "incorrect"
    names: dict[str, str]  # variant names of PARAMS


def variant(problem: Problem, params: dict) -> Variant:
    return Variant(TEMPLATE, problem.head_dim, problem.dtype, problem.causal, params)


def compiled_sha(v: Variant) -> str:
    from tuner.runtime.build import build

    built = build(v, load_profile(PROFILE).nvcc_arch)
    assert built.ok, built.compiled.log[-2000:]
    return built.compiled.cubin_sha256


def write_export_store(url: str) -> ExportStore:
    """Trials as `tuner search` would store them (real cubin sha256s; made-up timings)."""
    from tuner.kernels.manifest import load_manifest

    thash = load_manifest(TEMPLATE).source_hash
    plan = [("big", BIG, "big", 40.0), ("slow", BIG, "slow", 55.0), ("small", SMALL, "small", 9.0),
            ("shadowed", SHADOWED, "small", 25.0), ("gqa", GQA_CAUSAL, "gqa", 30.0)]
    ids, names = {}, {}
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name=GPU_NAME, profile=PROFILE, driver="580.65.06", cuda_version="12.8",
                                      torch_version="2.9.0", tuner_version="0.1.0", host="test"))
        for problem in (BIG, SMALL, SHADOWED, GQA_CAUSAL):
            store.add_baseline(BaselineRecord(run_id=run, problem=problem, impl="sdpa_flash", timing=Timing(50.0)))
        for label, problem, pkey, us in plan:
            v = variant(problem, PARAMS[pkey])
            names[pkey] = v.name
            ids[label] = store.add_trial(TrialRecord(
                run_id=run, problem=problem, template=TEMPLATE, template_hash=thash, params=v.stored_params(),
                variant_name=v.name, status=TrialStatus.OK, timing=Timing(us, us * 0.99, us * 1.01),
                rel_error=3e-4, cubin_sha256=compiled_sha(v)))
        v = variant(BIG, dict(_COMMON, BLOCK_M=128, BLOCK_N=64, SWIZZLE="xor"))
        ids["incorrect"] = store.add_trial(TrialRecord(
            run_id=run, problem=BIG, template=TEMPLATE, template_hash=thash, params=v.stored_params(),
            variant_name=v.name, status=TrialStatus.INCORRECT, timing=Timing(1.0), rel_error=0.5))
        store.finish_run(run)
    return ExportStore(url, ids, names)


def import_exported(out: Path, name: str) -> ModuleType:
    """Import an exported package from its folder (a unique name per test: its op registers once)."""
    sys.path.insert(0, str(out))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(out))


pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (export recompiles cubins)")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def export_store(tmp_path_factory) -> ExportStore:
    return write_export_store(f"sqlite:///{tmp_path_factory.mktemp('export_store') / 'results.db'}")


def _unique(prefix: str = "attn") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def reseal(pkg: Path) -> None:
    """Seal pkg's edited manifest.json as an export would (its sha256 into __init__.py): to test what the
    runtime makes of such a manifest past the hash check, which refuses any edit of an export's."""
    from tuner.export.package import seal

    seal(pkg)


def _edited_copy(report, tmp_path, prefix: str, edit) -> str:
    """A copy of the exported package under a new name, its manifest.json changed by edit(manifest) (sealed)."""
    name = _unique(prefix)
    shutil.copytree(report.out / report.package, tmp_path / name)
    path = tmp_path / name / "manifest.json"
    m = json.loads(path.read_text())
    m["package"] = name
    edit(m)
    path.write_text(json.dumps(m))
    reseal(tmp_path / name)
    return name


@pytest.fixture(scope="module")
def exported(export_store, tmp_path_factory):
    """(report, imported module) of one package export, imported in this process."""
    name = _unique()
    out = tmp_path_factory.mktemp("exported") / name
    report = export(ExportOptions(gpu="h100", out=out, db_url=export_store.url))
    return report, import_exported(out, name)


# --- package contents and manifest -------------------------------------------------------


def test_package_layout_and_manifest(exported, export_store) -> None:
    report, mod = exported
    pkg = report.out / report.package
    assert (pkg / "__init__.py").is_file() and (pkg / "manifest.json").is_file()
    assert (report.out / "pyproject.toml").is_file() and (report.out / "README.md").is_file()
    # One runtime for the tuner and every export: its folder, copied whole.
    runtime = ROOT / "tuner" / "runtime" / "shipped"
    ours = sorted(p.relative_to(runtime) for p in runtime.rglob("*.py"))
    assert ours and sorted(p.relative_to(pkg / "_runtime") for p in (pkg / "_runtime").rglob("*.py")) == ours
    assert all((pkg / "_runtime" / rel).read_bytes() == (runtime / rel).read_bytes() for rel in ours)
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["package"] == report.package and m["tuner_version"] and m["nvcc_version"]
    assert m["gpu"]["profile"] == "h100" and m["gpu"]["arch"] == "sm_90a" and m["gpu"]["gpu_names"] == ["NVIDIA H100 80GB HBM3"]
    ids = export_store.trial_ids
    by_trial = {e["trial_id"]: e for e in m["entries"]}
    # Best ok trial per problem only: neither the slower nor the incorrect trial.
    assert set(by_trial) == {ids["big"], ids["small"], ids["shadowed"], ids["gqa"]}
    big = by_trial[ids["big"]]
    assert big["median_us"] == 40.0 and big["ratio_to_best_baseline"] == pytest.approx(50.0 / 40.0)
    assert big["best_baseline_impl"] == "sdpa_flash"
    assert big["run"]["driver"] == "580.65.06" and big["run"]["cuda_version"] == "12.8"
    assert big["run"]["torch_version"] == "2.9.0" and big["run"]["tuner_version"] == "0.1.0"
    assert m["replayed_from"] == [] and big["run"]["replayed_from"] is None  # measured on a GPU
    assert big["key"] == {"dtype": "fp16", "head_dim": 64, "causal": False, "group": 1, "sq_bucket": 11, "sk_bucket": 11,
                          "bh_bucket": 4, "window_left": -1, "window_right": -1, "softcap": 0.0,  # B2 x H8 = 16
                          "page_size": 0, "seq_lens": False,  # dense K/V, every row at full length
                          "packed": False}  # not packed sequences
    assert by_trial[ids["gqa"]]["key"]["group"] == 4 and by_trial[ids["gqa"]]["key"]["causal"] is True
    # Same key as BIG with less work: kept for provenance, out of dispatch.
    assert by_trial[ids["shadowed"]]["dispatch"] is False and by_trial[ids["shadowed"]]["shadowed_by"] == ids["big"]
    assert len(m["kernels"]) == report.kernels == 3
    for kname, meta in m["kernels"].items():
        cubin = (pkg / meta["cubins"]["sm_90a"]["path"]).read_bytes()
        assert hashlib.sha256(cubin).hexdigest() == meta["cubins"]["sm_90a"]["sha256"]
        src = (pkg / meta["source"]).read_text()
        assert hashlib.sha256(src.encode()).hexdigest() == meta["source_sha256"]
        assert f"{kname}(ATTN_FWD_PARAMS)" in src and meta["launch"]["threads"] == 128
    assert mod.__version__ == m["version"] and mod.MANIFEST["package"] == report.package


def test_runtime_never_imports_tuner(exported) -> None:
    report, _ = exported
    for path in (report.out / report.package).glob("*.py"):
        text = path.read_text()
        assert "import tuner" not in text and "from tuner" not in text, path.name


# --- behaviour without a GPU ---------------------------------------------------------------


def _qkv(b=1, h=4, hkv=4, sq=64, sk=64, d=64, dtype=None, bshd=False):
    import torch

    dtype = dtype or torch.float16
    gen = torch.Generator().manual_seed(0)

    def t(heads, seq):
        if bshd:
            return torch.randn(b, seq, heads, d, generator=gen).to(dtype).transpose(1, 2)
        return torch.randn(b, heads, seq, d, generator=gen).to(dtype)

    return t(h, sq), t(hkv, sk), t(hkv, sk)


@pytest.mark.parametrize("case", ["not_tensors", "kv_lengths_differ", "no_kv_heads", "no_keys"])
def test_what_nothing_can_compute_raises_even_with_the_sdpa_fallback(exported, case) -> None:
    """SDPA would return NaN or zeros for these: the package raises instead, fallback or not."""
    import torch

    _, mod = exported
    q, k, v = _qkv(dtype=torch.float32)
    if case == "not_tensors":
        q = q.tolist()
    elif case == "kv_lengths_differ":
        v = v[:, :, :10]
    elif case == "no_kv_heads":
        k, v = k[:, :0], v[:, :0]
    else:
        k, v = k[:, :, :0], v[:, :, :0]
    for fallback in (None, "sdpa"):
        with pytest.raises(mod.AttentionInputError):
            mod.attention(q, k, v, fallback=fallback)


def test_cpu_tensors_get_a_clear_error(exported) -> None:
    _, mod = exported
    q, k, v = _qkv()
    with pytest.raises(mod.AttentionInputError, match="must be a CUDA tensor"):
        mod.attention(q, k, v)
    with pytest.raises(ValueError, match="fallback must be None or 'sdpa'"):
        mod.attention(q, k, v, fallback="cudnn")


@pytest.mark.parametrize("case", [
    dict(sq=64, sk=64, causal=False),
    dict(sq=40, sk=96, causal=True),           # bottom-right causal, Sq < Sk
    dict(h=8, hkv=2, sq=33, sk=70, causal=True),  # GQA
    dict(sq=50, sk=50, bshd=True),             # BSHD passed as x.transpose(1, 2)
    dict(d=80),                                # head dim no kernel has
], ids=["plain", "causal_sq_lt_sk", "gqa_causal", "bshd", "d80"])
def test_sdpa_fallback_runs_on_cpu(exported, case) -> None:
    import torch

    from tuner.runtime.verify import reference

    _, mod = exported
    causal = case.pop("causal", False)
    q, k, v = _qkv(dtype=torch.float32, **case)
    out = mod.attention(q, k, v, causal=causal, fallback="sdpa")
    ref, _ = reference(q, k, v, causal)
    assert out.shape == q.shape and out.stride() == torch.empty_like(q).stride()
    # CPU SDPA's fp32 kernel differs from the fp32 reference (another summation order) by up to ~5e-5 in some processes
    # (seen once in ~10 runs); a wrong mask or GQA mapping is off by ~1e-1, so 1e-4 still tells them apart.
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_unsupported_inputs_name_the_limit(exported) -> None:
    import torch

    _, mod = exported
    q, k, v = _qkv(d=80)
    assert "head dim 80 is not supported for non-causal fp16: tuned head dims are [64]" in mod.explain(q, k, v).error
    q, k, v = _qkv(d=128)
    assert "non-causal attention in bf16" not in (mod.explain(q, k, v).error or "")
    q, k, v = _qkv(d=128, dtype=torch.bfloat16)
    assert "non-causal attention in bf16 is not supported" in mod.explain(q, k, v).error
    q, k, v = _qkv(dtype=torch.float32)
    assert "float16 or bfloat16" in mod.explain(q, k, v).error
    assert "q must have rank 4 [B, H, S, D] (got shape (4, 64, 64))" in mod.explain(q[0], k[0], v[0]).error
    with pytest.raises(mod.AttentionInputError, match="CUDA tensor"):
        mod.attention(q[0], k[0], v[0])
    qh, kh, vh = _qkv()
    assert "q, k and v must have one dtype (got torch.float32, torch.float16" in mod.explain(qh.float(), kh, vh).error


# --- dispatch table ---------------------------------------------------------------------------


@pytest.mark.parametrize("seq,expect,exact", [
    (2048, "big", True), (1500, "big", True),   # bucket 11 = (1024, 2048]
    (700, "big", False),                        # bucket 10: 11 is 2 away, 8 is 4 away
    (300, "small", False),                      # bucket 9: 8 is 2 away
    (200, "small", True), (4, "small", False), (100000, "big", False),
])
def test_nearest_bucket_choice(exported, export_store, seq, expect, exact) -> None:
    _, mod = exported
    q, k, v = _qkv(h=2, hkv=2, sq=seq, sk=seq) if seq < 5000 else _qkv(h=1, hkv=1, sq=1, sk=1)
    if seq >= 5000:  # don't allocate: explain reads shapes only
        import torch

        q = torch.empty(1, 2, seq, 64, dtype=torch.float16, device="meta")
        k = v = torch.empty(1, 2, seq, 64, dtype=torch.float16, device="meta")
    ex = mod.attention.explain(q, k, v)
    assert ex.kernel == export_store.names[expect] and ex.exact is exact
    assert ex.trial_id == export_store.trial_ids[expect]
    assert ("exact match" in ex.reason) if exact else ("nearest tuned bucket" in ex.reason)
    text = str(ex)
    assert export_store.names[expect] in text and "must be a CUDA tensor" in text and "dispatch key: fp16 D64" in text


def test_explain_gqa_and_arch(exported, export_store) -> None:
    import torch

    _, mod = exported
    q = torch.empty(1, 32, 3000, 128, dtype=torch.bfloat16, device="meta")
    k = v = torch.empty(1, 4, 3000, 128, dtype=torch.bfloat16, device="meta")
    ex = mod.explain(q, k, v, causal=True)
    assert ex.kernel == export_store.names["gqa"] and not ex.exact
    assert "tuned for GQA group 4, not 8" in ex.reason and "log2 distance 4" in ex.reason  # buckets 12/12 vs 10/10
    kernels = mod._runtime.kernels
    assert kernels.cubin_arch_for({"sm_90a": {}}, (9, 0)) == "sm_90a"
    assert kernels.cubin_arch_for({"sm_90a": {}}, (10, 0)) is None
    assert kernels.cubin_arch_for({"sm_80": {}, "sm_86": {}}, (8, 9)) == "sm_86"
    assert "JIT compile" in kernels.code_source(ex.kernel, (8, 9))
    assert "shipped cubin sm_90a" in kernels.code_source(ex.kernel, (9, 0))


def test_bucket_function(exported) -> None:
    _, mod = exported
    seq_bucket = mod._runtime.dispatch.seq_bucket
    assert [seq_bucket(n) for n in (1, 2, 3, 4, 5, 1024, 1025, 2048, 2049)] == [0, 1, 2, 2, 3, 10, 11, 11, 12]


# --- torch.compile -----------------------------------------------------------------------------


def test_custom_op_traces_under_torch_compile(exported) -> None:
    import torch

    _, mod = exported
    assert hasattr(getattr(torch.ops, mod.MANIFEST["package"]), "attention")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, q, k, v):
            return self.proj(mod.attention(q, k, v, causal=True, fallback="sdpa"))

    block = Block()
    q, k, v = _qkv(dtype=torch.float32, sq=32, sk=48)
    eager = block(q, k, v)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), eager)
    # The fake implementation gives the output's metadata without running anything.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as fake_mode:
        fq, fk, fv = (fake_mode.from_tensor(t) for t in (q, k, v))
        op = getattr(torch.ops, mod.MANIFEST["package"]).attention
        assert op(fq, fk, fv, True, None, None).shape == q.shape


# --- integrity --------------------------------------------------------------------------------


def _import_in_subprocess(out: Path, name: str) -> subprocess.CompletedProcess:
    code = f"import sys; sys.path.insert(0, {str(out)!r}); import {name}; print('imported', 'tuner' in sys.modules)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=out, timeout=120)


def test_tampered_cubin_is_refused(export_store, tmp_path) -> None:
    name = _unique()
    out = tmp_path / name
    export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, shapes=("2,8,256,64",)))
    ok = _import_in_subprocess(out, name)
    assert ok.returncode == 0 and "imported False" in ok.stdout, ok.stderr
    cubin = next((out / name / "kernels").glob("*.cubin"))
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.write_bytes(bytes(data))
    bad = _import_in_subprocess(out, name)
    assert bad.returncode != 0
    assert "IntegrityError" in bad.stderr and f"kernels/{cubin.name} fails its integrity check" in bad.stderr
    assert "refusing to load it" in bad.stderr


@pytest.mark.parametrize("damage", ["no_manifest", "not_json", "no_kernels", "path_outside", "null_sha256",
                                    "cubin_sha256_number", "header_sha256_null", "kernels_a_list", "page_size_12",
                                    "seq_lens_string"])
def test_a_broken_manifest_is_an_integrity_error(export_store, tmp_path, damage) -> None:
    name = _unique("broken")
    out = tmp_path / name
    export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, shapes=("2,8,256,64",)))
    manifest_path = out / name / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    if damage == "no_manifest":
        manifest_path.unlink()
    elif damage == "not_json":
        manifest_path.write_text(manifest_path.read_text()[:-40])
    elif damage == "no_kernels":
        del manifest["kernels"]
        manifest_path.write_text(json.dumps(manifest))
    elif damage in ("page_size_12", "seq_lens_string"):  # a call form no call has: refused on import
        key = manifest["entries"][0]["key"]
        key.update(page_size=12) if damage == "page_size_12" else key.update(seq_lens="yes")
        manifest_path.write_text(json.dumps(manifest))
    elif damage in ("null_sha256", "cubin_sha256_number", "header_sha256_null", "kernels_a_list"):
        kernel = next(iter(manifest["kernels"].values()))
        if damage == "null_sha256":
            kernel["source_sha256"] = None
        elif damage == "cubin_sha256_number":
            next(iter(kernel["cubins"].values()))["sha256"] = 12
        elif damage == "header_sha256_null":
            manifest["headers"][next(iter(manifest["headers"]))] = None
        else:
            manifest["kernels"] = list(manifest["kernels"].values())
        manifest_path.write_text(json.dumps(manifest))
    else:  # a path that leaves the package, with the hash of what is there
        outside = tmp_path / "outside.bin"
        outside.write_bytes(b"not a cubin")
        kernel = next(iter(manifest["kernels"].values()))
        kernel["source"] = str(outside)
        kernel["source_sha256"] = hashlib.sha256(b"not a cubin").hexdigest()
        manifest_path.write_text(json.dumps(manifest))
    if damage not in ("no_manifest", "not_json", "no_kernels"):  # sealed: the runtime's own checks refuse it
        reseal(out / name)
    bad = _import_in_subprocess(out, name)
    assert bad.returncode != 0
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{name}._runtime.kernels.IntegrityError: {name}"), bad.stderr
    assert "JSONDecodeError" not in bad.stderr and "FileNotFoundError" not in bad.stderr and "KeyError" not in last
    assert "TypeError" not in bad.stderr and "AttributeError" not in bad.stderr


def _import_fails(out: Path, name: str) -> str:
    """The one-line reason an in-process import of out/name is refused (an IntegrityError, an ImportError)."""
    with pytest.raises(ImportError) as info:
        import_exported(out, name)
    assert "\n" not in str(info.value)
    return str(info.value)


_MANIFEST_EDITS = {
    "threads": lambda m: next(iter(m["kernels"].values()))["launch"].update(threads=1024),
    "smem_bytes": lambda m: next(iter(m["kernels"].values()))["launch"].update(smem_bytes=1),
    "block_m": lambda m: next(iter(m["kernels"].values()))["launch"].update(block_m=128),
    "entry": lambda m: next(iter(m["kernels"].values())).update(entry="other_kernel"),
    "nvcc_options": lambda m: m["nvcc_options"].extend(["-ccbin", "/tmp/program"]),
}


@pytest.mark.parametrize("edit", sorted(_MANIFEST_EDITS))
def test_an_edited_manifest_is_refused_on_import(exported, tmp_path, edit) -> None:
    """manifest.json's sha256 is in __init__.py (the root of trust): any edit of it is refused before it is read."""
    report, _ = exported
    name = _edited_copy(report, tmp_path, "edited", lambda m: None)  # a sealed copy that imports
    path = tmp_path / name / "manifest.json"
    manifest = json.loads(path.read_text())
    _MANIFEST_EDITS[edit](manifest)
    path.write_text(json.dumps(manifest))
    reason = _import_fails(tmp_path, name)
    assert reason.startswith(f"{name}: manifest.json fails its integrity check (sha256 "), reason
    assert "in __init__.py): the file was changed after export; refusing to load it" in reason


@pytest.mark.parametrize("change", ["header_added", "cubin_added", "runtime_edited", "runtime_added",
                                    "kernels_module_edited", "cubin_replaced"])
def test_a_file_added_or_changed_in_the_package_is_refused_on_import(exported, tmp_path, change) -> None:
    """manifest.json's record lists every file with its sha256: a file it does not list, or whose bytes differ,
    is refused with one line naming it (_runtime/ included, checked before any of it runs)."""
    report, _ = exported
    name = _edited_copy(report, tmp_path, "added", lambda m: None)
    pkg = tmp_path / name
    cubin = next((pkg / "kernels").glob("*.cubin"))
    rel = {"header_added": "kernels/cuda_fp16.h", "cubin_added": "kernels/extra.sm_90a.cubin",
           "runtime_edited": "_runtime/dispatch.py", "runtime_added": "_runtime/sitecustomize.py",
           "kernels_module_edited": "_runtime/kernels.py", "cubin_replaced": f"kernels/{cubin.name}"}[change]
    if change.endswith("_edited"):
        (pkg / rel).write_text((pkg / rel).read_text() + "\nprint('ran')\n")
    elif change == "cubin_replaced":
        (pkg / rel).write_bytes(next(p for p in (pkg / "kernels").glob("*.cubin") if p != cubin).read_bytes())
    else:
        (pkg / rel).write_bytes(cubin.read_bytes() if rel.endswith(".cubin") else b"#pragma once\n")
    reason = _import_fails(tmp_path, name)
    if change.endswith("_added"):
        assert reason == (f"{name}: {rel} is not in manifest.json's record of the package's files: it was added "
                          "after export; refusing to load the package. Remove it, or reinstall or re-export.")
    else:
        assert reason.startswith(f"{name}: {rel} fails its integrity check (sha256 "), reason


def test_the_record_lists_every_file_of_the_package(exported) -> None:
    report, mod = exported
    pkg = report.out / report.package
    files = {p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert set(mod.MANIFEST["files"]) == files - {"__init__.py", "manifest.json"}
    assert all(hashlib.sha256((pkg / rel).read_bytes()).hexdigest() == sha for rel, sha in mod.MANIFEST["files"].items())
    init = (pkg / "__init__.py").read_text()
    assert f'_MANIFEST_SHA256 = "{hashlib.sha256((pkg / "manifest.json").read_bytes()).hexdigest()}"' in init


@pytest.mark.parametrize("option", ["-ccbin", "-I/tmp", "--include-path=/tmp", "-Xcompiler", "--compiler-bindir=/x",
                                    "-DX;rm"])
def test_nvcc_options_are_an_allow_list(exported, tmp_path, monkeypatch, option) -> None:
    """Even in a sealed manifest (one the exporter wrote), nvcc_options holds only what an export writes:
    anything else is refused on import, and the JIT never runs nvcc with it."""
    report, mod = exported
    name = _edited_copy(report, tmp_path, "nvccopt", lambda m: m["nvcc_options"].append(option))
    reason = _import_fails(tmp_path, name)
    assert reason.startswith(f"{name}: manifest.json is malformed: nvcc_options holds {option!r}, not one an export "
                             "writes (-O0..-O3, -std=c++NN, --use_fast_math, -lineinfo, -DNAME[=VALUE])"), reason
    ran = tmp_path / "ran"
    fake = tmp_path / "bin" / "nvcc"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {ran}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setitem(mod._runtime.kernels.manifest(), "nvcc_options", ["-O3", option, "/bin/true"])
    with pytest.raises(mod.IntegrityError, match="refusing to run nvcc with it"):
        mod._runtime.kernels._jit_cubin("src", (8, 9))
    assert not ran.exists()


def test_the_jit_path_checks_the_source_it_compiles(exported) -> None:
    """After import, a changed source is refused before it reaches the compiler (like a changed cubin)."""
    report, mod = exported
    meta = next(iter(mod.MANIFEST["kernels"].values()))
    source = report.out / report.package / meta["source"]
    original = source.read_bytes()
    try:
        source.write_bytes(original + b"\n// injected\n")
        with pytest.raises(mod.IntegrityError, match="fails its integrity check"):
            mod._runtime.kernels.verified_bytes(meta["source"], meta["source_sha256"])
    finally:
        source.write_bytes(original)
    assert mod._runtime.kernels.verified_bytes(meta["source"], meta["source_sha256"]) == original


def test_a_cubin_changed_in_the_compile_cache_is_not_exported(export_store, tmp_path) -> None:
    """Export hashes the bytes it ships, not the cache's record of them."""
    from tuner.kernels.variant import Variant
    from tuner.runtime.build import build
    from tuner.store import open_store

    with open_store(export_store.url, create=False) as store:
        row = store.trial_detail(export_store.trial_ids["small"])
    built = build(Variant.from_stored(row.template, row.params), load_profile(PROFILE).nvcc_arch)
    cached = built.compiled.cubin_path
    original = cached.read_bytes()
    try:
        tampered = bytearray(original)
        tampered[len(tampered) // 2] ^= 0xFF
        cached.write_bytes(bytes(tampered))
        with pytest.raises(TunerError, match="no longer matches"):
            export(ExportOptions(gpu="h100", out=tmp_path / "a", db_url=export_store.url, shapes=("2,8,256,64",)))
    finally:
        cached.write_bytes(original)


def test_pip_install_elsewhere(export_store, tmp_path) -> None:
    """pip install DIR (no deps, no build isolation: offline) into a fresh folder, import from there."""
    pytest.importorskip("hatchling", reason="hatchling builds the exported package")
    name = _unique("myattn")
    out = tmp_path / "src"
    export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, name=name, dtype="fp16"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                    "--target", str(target), str(out)], check=True, capture_output=True, timeout=300)
    assert (target / name / "manifest.json").is_file() and list((target / name / "kernels").glob("*.cubin"))
    metadata = next(target.glob("*.dist-info")) / "METADATA"
    requires = [line.split(":", 1)[1].strip() for line in metadata.read_text().splitlines()
                if line.startswith("Requires-Dist:")]
    assert requires == ["torch>=2.4"]  # torch alone: no PyCUDA, nothing that needs the CUDA toolkit to build
    # pycuda made unimportable and no nvcc on PATH: the package must not need either to import and explain.
    code = (f"import sys; sys.path.insert(0, {str(target)!r}); sys.modules['pycuda'] = None\n"
            f"import torch\nfrom {name} import attention\n"
            "q = torch.randn(1, 2, 8, 64)\nout = attention(q, q, q, fallback='sdpa')\n"
            "assert 'tuner' not in sys.modules\nprint('ok', attention.explain(q.half(), q.half(), q.half()).kernel)")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "PYTHONPATH")} | {"PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ok attn_fwd_mma_d64_fp16_")


# --- refusals ---------------------------------------------------------------------------------


def test_cubin_mismatch_is_refused_unless_allowed(export_store, tmp_path) -> None:
    src = Path(export_store.url.removeprefix("sqlite:///"))
    copy = tmp_path / "stale.db"
    shutil.copyfile(src, copy)
    import sqlite3

    with sqlite3.connect(copy) as db:
        db.execute("UPDATE trials SET cubin_sha256 = ? WHERE id = ?", ("0" * 64, export_store.trial_ids["small"]))
    url = f"sqlite:///{copy}"
    with pytest.raises(TunerError, match="no longer matches the template.*--allow-rebuild"):
        export(ExportOptions(gpu="h100", out=tmp_path / "a", db_url=url))
    report = export(ExportOptions(gpu="h100", out=tmp_path / "b", db_url=url, allow_rebuild=True))
    rebuilt = {e["trial_id"]: e["rebuilt"] for e in report.entries}
    assert rebuilt[export_store.trial_ids["small"]] is True and rebuilt[export_store.trial_ids["big"]] is False


def test_export_errors(export_store, tmp_path) -> None:
    with pytest.raises(TunerError, match="no ok trials for l4"):
        export(ExportOptions(gpu="l4", out=tmp_path / "x", db_url=export_store.url))
    with pytest.raises(TunerError, match="not a usable Python identifier"):
        export(ExportOptions(gpu="h100", out=tmp_path / "my-attn.v2", db_url=export_store.url))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(TunerError, match="not empty; pass --force"):
        export(ExportOptions(gpu="h100", out=tmp_path / "full", db_url=export_store.url))
    export(ExportOptions(gpu="h100", out=tmp_path / "full", db_url=export_store.url, force=True, name="again"))
    assert (tmp_path / "full" / "keep.txt").exists() and (tmp_path / "full" / "again" / "manifest.json").exists()


# --- CLI and header ---------------------------------------------------------------------------


def test_cli_export_package_and_errors(export_store, tmp_path) -> None:
    out = tmp_path / "cli_pkg"
    res = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(out), "--shape", "2,8,2048,64",
                    "--shape", "1,16,1024,128")
    assert res.exit_code == 0, res.stderr
    assert "exported package cli_pkg: 2 entries, 2 kernels" in res.stdout
    missing = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(tmp_path / "w"),
                        "--shape", "1,16,1024,128", "--dtype", "fp16")  # tuned in bf16 only
    assert missing.exit_code == 2 and "no ok trials for h100 (shape 1,16,1024,1024,128, fp16)" in missing.stderr
    bad = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(tmp_path / "y"), "--all",
                    "--shape", "2,8,2048,64")
    assert bad.exit_code == 2 and bad.stderr.strip() == "error: give one of --shape, --all and --model"
    none = run_tuner("--db", export_store.url, "export", "--gpu", "a100", "--out", str(tmp_path / "z"))
    assert none.exit_code == 2 and none.stderr.count("\n") == 1 and "no ok trials for a100" in none.stderr


def test_header_export(export_store, tmp_path) -> None:
    out = tmp_path / "hdr"
    res = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(out), "--format", "header",
                    "--name", "fc_tuned")
    assert res.exit_code == 0, res.stderr
    header = (out / "fc_tuned.h").read_text()
    assert (out / "attn_fwd_mma.cu").is_file()
    assert "namespace fc_tuned {" in header and "namespace h100 {" in header
    assert "struct fp16_d64_noncausal_g1_sq11_sk11_bh4 {" in header
    assert ("using Config = fc::AttnConfig<half, 64, 64, 64, 4, 1, fc::Swizzle::Xor, 2, true, 1, false, false, "
            "fc::NoMask>;") in header
    assert "struct bf16_d128_causal_g4_sq10_sk10_bh" in header and "static constexpr int BLOCK_N = 32;" in header
    assert "sq11" in header and "sq8" in header
    # Each bucket says whether the package would route it to SDPA (here every kernel beat SDPA's 50 us).
    assert header.count("SLOWER_THAN_SDPA = false;") == header.count("  using Config =") == 3


@pytest.mark.nvcc
def test_header_instantiates_with_nvcc(export_store, tmp_path) -> None:
    out = tmp_path / "hdr"
    export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, format="header", name="fc_tuned",
                         shapes=("2,8,256,64",)))
    assert_user_kernel_builds(out, "attn_fwd_mma.cu", "fc_tuned.h",
                              "fc_tuned::h100::fp16_d64_noncausal_g1_sq8_sk8_bh4::Config",
                              "int pick() { return fc_tuned::h100::nearest_bucket(0, 64, false, 1, 9, 9, 4); }\n")


# --- --force, staged writes, unwritable --out ---------------------------------------------------


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _no_staging_left(out: Path) -> bool:
    return not [p for p in out.iterdir() if p.name.startswith(".tuner-")]


def test_force_refuses_a_folder_that_is_not_an_export(export_store, tmp_path) -> None:
    out = tmp_path / "myproj"  # the package name defaults to the folder's name: myproj/myproj/
    (out / "myproj").mkdir(parents=True)
    (out / "myproj" / "core.py").write_text("def main(): ...\n")
    (out / "README.md").write_text("# my project\n")
    (out / "pyproject.toml").write_text("[project]\nname = 'myproj'\n")
    before = _snapshot(out)
    res = run_tuner("--db", export_store.url, "export", "--gpu", "h100", "--out", str(out), "--force")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"{out / 'myproj'} is not from an earlier tuner export; --force refuses to overwrite it" in res.stderr
    assert _snapshot(out) == before and _no_staging_left(out)
    # A user README alone is refused too; a folder with none of the export's paths is written into.
    (out / "README.md").unlink()
    with pytest.raises(TunerError, match="pyproject.toml is not from an earlier tuner export"):
        export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, force=True, name="other"))
    hdr = tmp_path / "hdr"
    hdr.mkdir()
    (hdr / "fc_tuned.h").write_text("// my own header\n")
    with pytest.raises(TunerError, match="fc_tuned.h is not from an earlier tuner export"):
        export(ExportOptions(gpu="h100", out=hdr, db_url=export_store.url, format="header", name="fc_tuned",
                             force=True, shapes=("2,8,256,64",)))
    assert (hdr / "fc_tuned.h").read_text() == "// my own header\n"


def test_force_replaces_an_earlier_export(export_store, tmp_path) -> None:
    name = _unique("rep")
    out = tmp_path / "proj"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    first = export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, name=name, force=True,
                                 shapes=("2,8,256,64",)))
    old_cubins = {p.name for p in (out / name / "kernels").glob("*.cubin")}
    second = export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, name=name, force=True,
                                  shapes=("2,8,2048,64",)))
    assert [e["trial_id"] for e in first.entries] == [export_store.trial_ids["small"]]
    manifest = json.loads((out / name / "manifest.json").read_text())
    assert [e["trial_id"] for e in manifest["entries"]] == [export_store.trial_ids["big"]]
    new_cubins = {p.name for p in (out / name / "kernels").glob("*.cubin")}
    assert new_cubins and not new_cubins & old_cubins  # a fresh package folder: nothing stale left
    assert all(f.is_file() for f in second.files) and (out / "keep.txt").read_text() == "mine"
    assert _no_staging_left(out)
    # Header exports: --force replaces the header an earlier export wrote.
    hdr = tmp_path / "hdr"
    for shape in ("2,8,256,64", "2,8,2048,64"):
        export(ExportOptions(gpu="h100", out=hdr, db_url=export_store.url, format="header", name="fc_tuned",
                             force=True, shapes=(shape,)))
    assert "sq11_sk11_bh4" in (hdr / "fc_tuned.h").read_text() and _no_staging_left(hdr)


def test_failed_export_keeps_the_earlier_one(export_store, tmp_path, monkeypatch) -> None:
    import errno

    import tuner.export.staging as export_mod

    name = _unique("keep")
    out = tmp_path / "proj"
    export(ExportOptions(gpu="h100", out=out, db_url=export_store.url, name=name, shapes=("2,8,256,64",)))
    before = _snapshot(out)
    options = ExportOptions(gpu="h100", out=out, db_url=export_store.url, name=name, force=True)

    write_text = Path.write_text

    def full_disk(self: Path, *args, **kwargs):  # the disk fills up after the package folder was written
        if self.name == "README.md":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(TunerError) as info:
        export(options)
    assert str(info.value) == f"cannot write the export to {out} ({out / 'README.md'}): No space left on device"
    assert _snapshot(out) == before and _no_staging_left(out)
    monkeypatch.undo()

    replace, calls = os.replace, []

    def failing_replace(src, dst):  # fails while swapping in: after the old files moved out, one new one in
        calls.append(src)
        if len(calls) == 5:
            raise OSError(errno.EIO, "Input/output error", str(src))
        return replace(src, dst)

    monkeypatch.setattr(export_mod.os, "replace", failing_replace)
    with pytest.raises(TunerError, match="Input/output error"):
        export(options)
    assert len(calls) > 5 and _snapshot(out) == before and _no_staging_left(out)


def test_unwritable_out_is_a_one_line_error(export_store, tmp_path) -> None:
    base = ("--db", export_store.url, "export", "--gpu", "h100", "--shape", "2,8,256,64", "--out")
    res = run_tuner(*base, "/proc/tuner_export_test/pkg")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("error: cannot write the export to /proc/tuner_export_test/pkg")
    file = tmp_path / "afile"
    file.write_text("x")
    res = run_tuner(*base, str(file), "--name", "pkg")
    assert res.exit_code == 2 and res.stderr.strip() == f"error: {file} exists and is not a folder; pass a folder to --out"
    res = run_tuner(*base, str(file / "sub"), "--name", "pkg")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert f"cannot write the export to {file / 'sub'}" in res.stderr and "Not a directory" in res.stderr
    assert file.read_text() == "x"


# --- nvcc options, one dispatch rule ----------------------------------------------------------


def test_manifest_records_nvcc_options_for_the_jit(exported, monkeypatch, tmp_path) -> None:
    """Where no shipped cubin runs, the package runs nvcc with the tuner's options and its own headers."""
    from tuner.kernels.compiler import BASE_OPTIONS

    report, mod = exported
    options = json.loads((report.out / report.package / "manifest.json").read_text())["nvcc_options"]
    assert options == [o for o in BASE_OPTIONS if not o.startswith("--ptxas-options")] and "-O3" in options
    fake = tmp_path / "bin" / "nvcc"  # records its arguments and writes the -o file
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"$@\" > " + str(tmp_path / "args") + "\n"  # and lists the -I folder
                    "while [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then printf cubin > \"$2\"; fi;\n"
                    f"if [ \"$1\" = -I ]; then (cd \"$2\" && {shutil.which('find')} . -type f) > {tmp_path / 'seen'}; fi;\n"
                    "shift; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    pkg = report.out.resolve() / report.package
    added = pkg / "kernels" / "cuda_fp16.h"  # added after import: never reaches nvcc
    added.write_text("#error shadowed\n")
    try:
        assert mod._runtime.kernels._jit_cubin("src", (8, 9)) == b"cubin"
    finally:
        added.unlink()
    args = (tmp_path / "args").read_text().split()
    assert args[:1 + len(options)] == ["-cubin", *options]
    assert "arch=compute_89,code=sm_89" in args
    # The package's checked headers alone, copied to a fresh folder (not -I into the package folder).
    include = Path(args[args.index("-I") + 1])
    assert args.count("-I") == 1 and pkg not in include.parents and include != pkg / "kernels"
    headers = json.loads((pkg / "manifest.json").read_text())["headers"]
    seen = sorted((tmp_path / "seen").read_text().split())
    assert seen == sorted("./" + rel.removeprefix("kernels/") for rel in headers)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(mod.GpuUnavailableError, match="nvcc"):
        mod._runtime.kernels._jit_cubin("src", (8, 9))


def test_a_kernel_that_cannot_load_on_this_card_is_found_once_and_falls_back(exported, monkeypatch) -> None:
    """A card below the kernel's compute capability (or shared memory, or a failed JIT compile) raises
    GpuUnavailableError, which fallback="sdpa" takes, on every path; it is found once, not on every call."""
    _, mod = exported
    kernels = mod._runtime.kernels
    tried = []

    def refuse(kernel, device):
        tried.append(kernel)
        raise RuntimeError(f"{kernel} needs compute capability 9.0+, cuda:{device} has 8.0")

    monkeypatch.setattr(kernels, "_load", refuse)
    monkeypatch.setattr(kernels, "_failed", {})
    name = next(iter(mod.MANIFEST["kernels"]))
    for _ in range(3):
        with pytest.raises(mod.GpuUnavailableError, match=f"^{name} does not load on cuda:0: .*capability 9.0"):
            kernels.load_kernel(name, 0)
    assert tried == [name]


def test_a_shipped_source_compiles_with_the_shipped_headers_alone(exported, tmp_path) -> None:
    """The package carries every header its sources include (hashed like them): nvcc needs nothing else."""
    report, mod = exported
    moved = tmp_path / "elsewhere"
    shutil.copytree(report.out / report.package / "kernels", moved)  # away from kernel_templates/
    headers = json.loads((report.out / report.package / "manifest.json").read_text())["headers"]
    assert any(rel.startswith("kernels/common/") for rel in headers)
    meta = next(iter(mod.MANIFEST["kernels"].values()))
    source = moved / Path(meta["source"]).name
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    out = subprocess.run([nvcc, "-cubin", "-std=c++17", "-gencode", "arch=compute_80,code=sm_80", "-o",
                          str(tmp_path / "k.cubin"), str(source)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def _synthetic_header_inputs():
    from tuner.export.selection import ExportedKernel
    from tuner.kernels.compiler import CompileResult
    from tuner.kernels.render import config_type
    from tuner.runtime.build import BuiltKernel, launch_shape

    kernels = {"fp16": variant(BIG, PARAMS["big"]), "bf16": variant(GQA_CAUSAL, PARAMS["gqa"])}
    built = {}
    for v in kernels.values():
        compiled = CompileResult(True, v.name, "sm_90a", None, "", 0, 0, 0, 0, 0.0, "")
        source = f"using TunerCfg = {config_type(v)};\n"
        built[v.name] = ExportedKernel(BuiltKernel(v, source, compiled, launch_shape(v)), b"", False)
    rows = [("fp16", 1, 11, 11), ("fp16", 4, 11, 11), ("fp16", 2, 8, 8), ("fp16", 1, 8, 10), ("fp16", 8, 10, 8),
            ("fp16", 1, 6, 6), ("fp16", 3, 12, 12), ("fp16", 2, 12, 12), ("fp16", 1, 9, 7), ("fp16", 1, 7, 9),
            ("bf16", 4, 10, 10), ("bf16", 1, 10, 10), ("bf16", 2, 3, 3)]
    entries = []
    layouts = [{}, {"page_size": 16, "seq_lens": True}, {"seq_lens": True}, {"page_size": 256, "seq_lens": True}]
    for trial, (dtype, group, sq, sk) in enumerate(rows, start=1):
        v = kernels[dtype]
        key = {"dtype": dtype, "head_dim": v.head_dim, "causal": v.causal, "group": group, "sq_bucket": sq,
               "sk_bucket": sk, "bh_bucket": (3 * trial) % 11,  # work sizes that tie and differ
               **layouts[trial % 4]}  # K/V layouts: dense (old manifests: no fields), paged, ragged
        entries.append({"key": key, "kernel": v.name, "trial_id": 100 - trial, "problem_label": f"p{trial}",
                        "median_us": 1.0, "ratio_to_best_baseline": None, "dispatch": True,
                        "max_seq_q": 16 if trial in (6, 13) else 0})  # two short-query (decode) entries
    return entries, built


@pytest.mark.parametrize("source", ["synthetic", "store"])
def test_header_lookup_matches_python_dispatch(export_store, tmp_path, source) -> None:
    """The header's nearest_bucket, compiled into a host program, picks what _dispatch.choose picks."""
    from tuner.export.header import render_header
    from tuner.runtime.shipped.dispatch import DispatchTable, Key

    if source == "synthetic":  # several groups per bucket: exercises every tie-break
        entries, built = _synthetic_header_inputs()
        manifest = {"tuner_version": "test", "exported_at": "now", "entries": entries}
        (tmp_path / "fc_tuned.h").write_text(render_header("fc_tuned", load_profile("h100"), manifest, built, "t.cu"))
    else:
        entries = export(ExportOptions(gpu="h100", out=tmp_path, db_url=export_store.url, format="header",
                                       name="fc_tuned", force=True)).entries
    # Host only: stand-ins for the CUDA types and the sm_80 template's config the Config aliases name.
    stubs = ("struct half; struct __nv_bfloat16;\n"
             "namespace fc { enum class Swizzle { None, Pad, Xor }; template <int L = -1, int R = -1, unsigned B = 0u>\n"
             "  struct Mask {};\n  using NoMask = Mask<>;\n"
             "  template <class T, int D, int BM, int BN, int W, int KS, Swizzle SW, int ST, bool QR, int MB, bool LR,\n"
             "  bool C, class M = NoMask> struct AttnConfig {}; }\n")
    exe = build_host_lookup(tmp_path, "fc_tuned.h", (
        "int main() { int dt, hd, c, g, sq, sk, bh, page, lens;\n"
        '  while (std::scanf("%d %d %d %d %d %d %d %d %d", &dt, &hd, &c, &g, &sq, &sk, &bh, &page, &lens) == 9)\n'
        '    std::printf("%d\\n", fc_tuned::h100::nearest_bucket(dt, hd, c != 0, g, sq, sk, bh, -1, -1, 0.0, page,\n'
        '                                                         lens != 0));\n}\n'), stubs)
    keys = [Key(dtype, hd, causal, group, sq, sk, bh, page_size=page, seq_lens=lens) for dtype in ("fp16", "bf16")
            for hd, causal in ((64, False), (128, True), (64, True)) for group in (0, 1, 2, 3, 4, 5, 6, 8, 16)
            for sq in range(15) for sk in range(15) for bh in (0, 4, 9)
            for page, lens in ((0, False), (0, True), (16, True), (128, True))]
    stdin = "".join(f"{0 if k.dtype == 'fp16' else 1} {k.head_dim} {int(k.causal)} {k.group} {k.sq_bucket} "
                    f"{k.sk_bucket} {k.bh_bucket} {k.page_size} {int(k.seq_lens)}\n" for k in keys)
    run = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=60, check=True)
    chosen = [e for e in entries if e["dispatch"]]
    table = DispatchTable(entries)
    got = [None if i < 0 else chosen[i]["trial_id"] for i in map(int, run.stdout.split())]
    want = [(c.entry["trial_id"] if c else None) for c in map(table.choose, keys)]
    assert len(got) == len(keys)
    mismatches = [(k, g, w) for k, g, w in zip(keys, got, want) if g != w]
    assert not mismatches, mismatches[:5]
    assert len(set(want)) > 3  # the grid reaches several entries
    if source == "synthetic":  # entries of several K/V layouts: the call's layout changes choices
        assert any(len(set(want[i:i + 4])) > 1 for i in range(0, len(want), 4))


def test_the_readme_example_calls_a_tuned_combination(export_store, tmp_path) -> None:
    """Only non-causal fp16 D64 was tuned in this export: the README must not show a causal call."""
    name = _unique("readme")
    report = export(ExportOptions(gpu="h100", out=tmp_path / name, db_url=export_store.url, shapes=("2,8,256,64",)))
    readme = (report.out / "README.md").read_text()
    assert "causal=False" in readme and "causal=True" not in readme
    assert "dtype=torch.float16" in readme and "1024, 64," in readme


def test_a_tuned_problem_is_served_by_its_own_kernel_and_work_size_picks_among_equal_buckets() -> None:
    """B3 H12 S1536 and B16 H16 S2048 share the Sq/Sk bucket (11): both stay in dispatch, each serves
    itself, and other shapes of that bucket go to the one of the nearer batch x heads (waves on the card)."""
    from tuner.export.selection import _dispatch_key, resolve_collisions
    from tuner.runtime.shipped.dispatch import DispatchTable, Key

    large, small = Problem(16, 16, 2048, 2048, 64), Problem(3, 12, 1536, 1536, 64)
    entries = [{"key": _dispatch_key(p), "kernel": name, "trial_id": i, "problem": p.to_dict(), "dispatch": True}
               for i, (p, name) in enumerate(((large, "large"), (small, "small")), start=1)]
    resolve_collisions(entries)
    assert all(e["dispatch"] for e in entries)
    table = DispatchTable(entries)

    def served(b: int, h: int, s: int) -> str:
        return table.choose(Key.of("fp16", 64, False, h, h, s, s, batch=b)).entry["kernel"]

    assert served(3, 12, 1536) == "small" and served(16, 16, 2048) == "large"
    assert served(4, 12, 1900) == "small" and served(32, 16, 1100) == "large"  # nearest work size
    choice = table.choose(Key.of("fp16", 64, False, 16, 16, 2048, 2048, batch=1))
    assert choice.exact and "tuned for batch x heads in bucket 6" in choice.reason


def test_register_transformers_refuses_flash_names_and_says_what_is_missing(exported) -> None:
    import importlib.util

    _, mod = exported
    with pytest.raises(ValueError, match="contains 'flash'"):
        mod.register_transformers("flash_tuned")
    if importlib.util.find_spec("transformers") is None:
        with pytest.raises(ImportError, match="pip install transformers"):
            mod.register_transformers()
    else:
        assert mod.register_transformers("tuned_test") == "tuned_test"


def _one_trial_store(url: str, baselines: dict[str, float], median_us: float,
                     replayed_from: str | None = None) -> None:
    """A store holding one ok trial of BIG (the real cubin's sha256) and the given baselines (impl -> µs);
    `replayed_from`: its run was a replay of that recording."""
    from tuner.kernels.manifest import load_manifest

    v = variant(BIG, PARAMS["big"])
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name=GPU_NAME, profile=PROFILE, host="test", replayed_from=replayed_from))
        for impl, us in baselines.items():
            store.add_baseline(BaselineRecord(run_id=run, problem=BIG, impl=impl, timing=Timing(us)))
        store.add_trial(TrialRecord(run_id=run, problem=BIG, template=TEMPLATE,
                                    template_hash=load_manifest(TEMPLATE).source_hash, params=v.stored_params(),
                                    variant_name=v.name, status=TrialStatus.OK, timing=Timing(median_us), rel_error=3e-4,
                                    cubin_sha256=compiled_sha(v)))
        store.finish_run(run)


def test_a_cell_whose_kernel_lost_to_sdpa_is_routed_to_sdpa(tmp_path) -> None:
    """An export never makes a call slower than SDPA: a tuned problem whose kernel measured below 0.98x
    the best baseline is exported with route 'sdpa', and explain() says its calls run SDPA."""
    import torch

    url = f"sqlite:///{tmp_path / 'r.db'}"
    _one_trial_store(url, {"sdpa_cudnn": 50.0}, median_us=60.0)
    name = _unique()
    res = run_tuner("--db", url, "export", "--gpu", "h100", "--out", str(tmp_path / name))
    assert res.exit_code == 0, res.stderr
    assert "0.83x" in res.stdout and "[routed to SDPA: slower than it]" in res.stdout
    mod = import_exported(tmp_path / name, name)
    (entry,) = mod.MANIFEST["entries"]
    assert entry["route"] == "sdpa"
    q = torch.empty(2, 8, 2048, 64, dtype=torch.float16, device="meta")
    assert "routed to SDPA: the kernel measured 0.83x" in str(mod.explain(q, q, q))


def test_a_kernel_slower_than_fa4_but_faster_than_sdpa_is_not_routed(tmp_path) -> None:
    """Routing falls back to SDPA, so it compares with SDPA only: a kernel that beats every SDPA backend but
    not FlashAttention-4 (a baseline of its run) keeps its cell; the entry records both ratios."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _one_trial_store(url, {"sdpa_cudnn": 50.0, "fa4": 30.0}, median_us=40.0)
    name = _unique()
    report = export(ExportOptions(gpu="h100", out=tmp_path / name, db_url=url))
    (entry,) = report.entries
    assert entry["best_baseline_impl"] == "fa4" and entry["ratio_to_best_baseline"] == pytest.approx(0.75)
    assert entry["ratio_to_sdpa"] == pytest.approx(1.25) and entry["route"] is None


def test_an_export_of_a_replayed_run_says_so(tmp_path) -> None:
    """A replayed run measured nothing: its export names the recording in manifest.json (each entry's run and
    the package's list), marks the entries it prints, warns once, and says so in a header's first lines."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    recording = "sqlite:////data/recording.db"
    _one_trial_store(url, {"sdpa_cudnn": 50.0}, median_us=40.0, replayed_from=recording)
    name = _unique()
    res = run_tuner("--db", url, "export", "--gpu", "h100", "--out", str(tmp_path / name))
    assert res.exit_code == 0, res.stderr
    assert "[replayed]" in res.stdout
    assert res.stderr.startswith("warning: REPLAYED: 1 of 1 entries") and recording in res.stderr
    assert res.stderr.count("warning:") == 1  # once, in lines of <= 80 columns
    m = json.loads((tmp_path / name / name / "manifest.json").read_text())
    assert m["replayed_from"] == [recording] and m["entries"][0]["run"]["replayed_from"] == recording
    header = run_tuner("--db", url, "export", "--gpu", "h100", "--out", str(tmp_path / "h"), "--format", "header")
    assert header.exit_code == 0, header.stderr
    assert f"// REPLAYED: timings answered from a recording ({recording})" in (tmp_path / "h" / "h.h").read_text()
