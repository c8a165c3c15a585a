"""An FP8 KV cache in an export (CPU): the manifest of a bf16_kv_e4m3 decode kernel, attention()'s k_scale /
v_scale rules (one, per K/V head or per batch row and K/V head), explain() naming the FP8-cache kernel, and the
dequantising fallback (dense, seq_lens and paged) against the fp32 reference of the real values."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.built_trials import add_built_trial
from tests.test_export import GPU_NAME, _unique, import_exported
from tuner.export.run import ExportOptions, export
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.verify import reference, relative_error
from tuner.store import RunInfo, open_store

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (export recompiles cubins)")

PARAMS = dict(BLOCK_M=16, BLOCK_N=128, NUM_WARPS=4, SPLITS=2, STAGES=2)
CACHE = Problem(8, 32, 1, 8192, 128, dtype="bf16_kv_e4m3", heads_kv=8)
TOLERANCE = 1.5e-2  # SDPA in bf16 on the dequantised k and v against fp32: bf16 rounding, not a wrong scale


def _variant(p: Problem) -> Variant:
    return Variant("attn_decode", p.head_dim, p.dtype, p.causal, PARAMS)


@pytest.fixture(scope="module")
def cache_export(tmp_path_factory):
    """(report, imported package) of an export of one FP8-cache decode trial."""
    root = tmp_path_factory.mktemp("kv8")
    url = f"sqlite:///{root / 'r.db'}"
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name=GPU_NAME, profile="h100", host="test"))
        add_built_trial(store, run, CACHE, _variant(CACHE), load_profile("h100").nvcc_arch, 52.9, 2e-3)
        store.finish_run(run)
    name = _unique("kv8")
    report = export(ExportOptions(gpu="h100", out=root / name, db_url=url))
    return report, import_exported(root / name, name)


def _inputs(b=2, h=8, hkv=2, sq=1, sk=300, seed=0):
    """bf16 q (CPU) and an e4m3 k, v with their [B, Hkv] scales (tuner.runtime.verify.fp8_inputs)."""
    from tuner.runtime.verify import fp8_inputs

    q, k, v, ds = fp8_inputs(Problem(b, h, sq, sk, 128, dtype="bf16_kv_e4m3", heads_kv=hkv), "cpu", seed)
    return q, k, v, ds.k, ds.v


def _real(t, s):
    return t.float() * s[:, :, None, None]


def test_the_manifest_holds_the_fp8_cache_entry_and_its_launch(cache_export) -> None:
    from tuner.runtime.build import launch_shape
    from tuner.runtime.shipped.launcher import LaunchShape

    report, _ = cache_export
    m = json.loads((report.out / report.package / "manifest.json").read_text())
    (entry,) = m["entries"]
    assert entry["key"]["dtype"] == "bf16_kv_e4m3" and "_bf16_kv_e4m3_" in entry["kernel"]
    launch = m["kernels"][entry["kernel"]]["launch"]
    assert launch["kv_fp8"] and launch["descales"] and not launch["fp8"]
    assert LaunchShape(**launch) == launch_shape(_variant(CACHE))


def test_explain_names_the_fp8_cache_kernel(cache_export) -> None:
    import torch

    _, mod = cache_export
    q = torch.empty(8, 32, 1, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(8, 8, 8192, 128, dtype=torch.float8_e4m3fn, device="meta")
    s = torch.ones(8, device="meta")
    text = str(mod.explain(q, k, k, k_scale=s, v_scale=s))
    assert "bf16_kv_e4m3 D128" in text and _variant(CACHE).name in text
    assert "FP8 KV cache: the kernel reads k and v as float8_e4m3fn with k_scale and v_scale" in text
    plain = str(mod.explain(q, k.to(torch.bfloat16), k.to(torch.bfloat16)))
    assert _variant(CACHE).name not in plain  # a bf16 cache is another key: this package has no kernel for it


@pytest.mark.parametrize("form", ["one", "per_head", "per_row"])
def test_the_fallback_runs_sdpa_on_the_dequantised_cache(cache_export, form: str) -> None:
    """On a CPU (no kernel can run) fallback="sdpa" dequantises k and v with each scale form and runs SDPA."""
    _, mod = cache_export
    q, k, v, ks, vs = _inputs(seed=1)
    if form == "one":
        ks, vs = ks[0, 0].reshape(()), vs[0, 0].reshape(())
        full_k, full_v = ks.expand(2, 2), vs.expand(2, 2)
    elif form == "per_head":
        ks, vs = ks[0], vs[0]
        full_k, full_v = ks.expand(2, 2), vs.expand(2, 2)
    else:
        full_k, full_v = ks, vs
    out = mod.attention(q, k, v, k_scale=ks, v_scale=vs, fallback="sdpa")
    want = reference(q.float(), _real(k, full_k), _real(v, full_v), False)[0]
    assert out.dtype == q.dtype and relative_error(out, want) < TOLERANCE


def test_the_fallback_of_a_paged_fp8_cache_with_lengths(cache_export) -> None:
    import torch

    from tuner.runtime.verify import paged_cache

    _, mod = cache_export
    q, k, v, ks, vs = _inputs(sk=64, seed=2)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    kc, vc = paged_cache(k, 32, table), paged_cache(v, 32, table)
    assert kc.dtype == torch.float8_e4m3fn and kc.shape == (5, 32, 2, 128)
    lens = torch.tensor([64, 40], dtype=torch.int32)
    out = mod.attention(q, kc, vc, block_table=table, seq_lens=lens, k_scale=ks, v_scale=vs, fallback="sdpa")
    for b, n in enumerate((64, 40)):
        want = reference(q[b:b + 1].float(), _real(k, ks)[b:b + 1, :, :n], _real(v, vs)[b:b + 1, :, :n], False)[0]
        assert relative_error(out[b:b + 1], want) < TOLERANCE


@pytest.mark.parametrize("case, message", [
    ("no_scales", "float8_e4m3fn k and v need k_scale and v_scale"),
    ("bad_shape", "k_scale must be a float32 tensor of shape (), (1,), (2,) or (2, 2)"),
    ("bf16_scale", "v_scale must be a float32 tensor"),
    ("mixed", "an FP8 KV cache has k and v both float8_e4m3fn"),
    ("descales", "an FP8 KV cache takes k_scale and v_scale, not q/k/v descales"),
    ("bf16_cache", "k_scale and v_scale scale an FP8 KV cache"),
    ("list_scale", "k_scale must be a float32 tensor"),
    ("list_lens", "seq_lens and block_table must be torch.Tensors"),
])
def test_bad_scales_are_one_line_errors_fallback_or_not(cache_export, case: str, message: str) -> None:
    import torch

    _, mod = cache_export
    q, k, v, ks, vs = _inputs()
    kwargs = dict(k_scale=ks, v_scale=vs)
    if case == "no_scales":
        kwargs = {}
    elif case == "bad_shape":
        kwargs["k_scale"] = ks[:, :1]
    elif case == "bf16_scale":
        kwargs["v_scale"] = vs.bfloat16()
    elif case == "mixed":
        v = v.to(torch.bfloat16)
    elif case == "descales":
        kwargs["k_descale"] = ks
    elif case == "bf16_cache":
        k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    elif case == "list_scale":
        kwargs["k_scale"] = [1.0, 2.0]
    elif case == "list_lens":
        kwargs["seq_lens"] = [300, 300]
    for fallback in (None, "sdpa"):
        with pytest.raises(mod.AttentionInputError) as err:
            mod.attention(q, k, v, fallback=fallback, **kwargs)
        assert message in str(err.value) and "\n" not in str(err.value)


def _cache_url(cache_export) -> str:
    report, _ = cache_export
    return f"sqlite:///{report.out.parent / 'r.db'}"


def test_the_header_names_an_fp8_cache_bucket_and_nvcc_instantiates_it(cache_export, tmp_path) -> None:
    """The C++ header's FP8-cache bucket: q's element type, code 4, the decode template's KvE4m3 Config; a user
    kernel instantiating that Config builds for sm_90a."""
    from header_build import assert_user_kernel_builds

    out = tmp_path / "hdr"
    export(ExportOptions(gpu="h100", out=out, db_url=_cache_url(cache_export), format="header", name="fc_kv8"))
    text = (out / "fc_kv8.h").read_text()
    name = "bf16_kv_e4m3_d128_noncausal_g4_sq0_sk13_bh8"
    struct = text[text.index(f"struct {name} {{"):]
    struct = struct[:struct.index("};")]
    assert "using Element = __nv_bfloat16;" in struct and "using Output = __nv_bfloat16;" in struct
    assert "using Config = fc::DecodeConfig<fc::KvE4m3<__nv_bfloat16>, 128, 16, 128, 4, 2, 2, false" in struct
    assert "4 = an" in " ".join(text.split()) and "k_scale and v_scale" in text
    assert_user_kernel_builds(out, "attn_decode.cu", "fc_kv8.h", f"fc_kv8::h100::{name}::Config")


def test_the_readme_example_of_an_fp8_cache_package_passes_its_scales(cache_export) -> None:
    report, _ = cache_export
    readme = (report.out / "README.md").read_text()
    code = readme[readme.index("```python\n") + 10:readme.index("```\n\n")]
    assert "torch.float8_e4m3fn" in code and "k_scale=one, v_scale=one" in code
    compile(code, "README.md", "exec")


def test_gather_pages_moves_an_fp8_cache_as_bytes_into_a_buffer_too() -> None:
    """paged.gather_pages takes float8_e4m3fn caches itself (as bytes), with or without an `out` buffer."""
    import torch

    from tuner.runtime.shipped.paged import gather_pages

    cache = torch.randn(5, 16, 2, 128).to(torch.float8_e4m3fn)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    out = torch.empty(4, 16, 2, 128, dtype=torch.float8_e4m3fn)
    into, fresh = gather_pages(cache, table, out=out), gather_pages(cache, table)
    assert into.dtype == fresh.dtype == torch.float8_e4m3fn and into.shape == (2, 2, 32, 128)
    assert torch.equal(into.view(torch.uint8), fresh.view(torch.uint8))
    assert torch.equal(fresh[1, :, 16:].view(torch.uint8), cache[3].transpose(0, 1).view(torch.uint8))
