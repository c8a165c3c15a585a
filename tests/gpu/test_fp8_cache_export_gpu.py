"""An exported FP8-KV-cache decode kernel on a real sm_90 GPU: attention(q, k, v, k_scale=, v_scale=) runs it
dense, with seq_lens and paged, under torch.compile and in a CUDA graph, within the query dtype's tolerance of
the fp32 reference on the cache's real values; `tuner export --check` measures its cells."""

from __future__ import annotations

import pytest

from tests.gpu.one_trial_export import export_one_trial
from tuner.problem import Problem
from tuner.runtime.verify import TOLERANCE, reference, relative_error

pytestmark = pytest.mark.gpu

CACHE = Problem(8, 32, 1, 8192, 128, dtype="bf16_kv_e4m3", heads_kv=8)
PARAMS = dict(BLOCK_M=16, BLOCK_N=128, NUM_WARPS=4, SPLITS=2, STAGES=2)


@pytest.fixture(scope="module")
def cache_package(hopper, tmp_path_factory):
    """(module, kernel name, folder) of an export of one FP8-cache decode trial as `tuner search` stores it."""
    from tuner.kernels.variant import Variant

    base = tmp_path_factory.mktemp("kv8_export_gpu")
    variant = Variant("attn_decode", CACHE.head_dim, CACHE.dtype, CACHE.causal, PARAMS)
    return export_one_trial(hopper, base, CACHE, variant, median_us=52.9, rel_error=2e-3), variant.name, base


def _cache(problem: Problem, seed: int):
    """(q, k, v, k_scale, v_scale [B, Hkv], real k, real v) on the GPU."""
    from tuner.runtime.fp8 import dequantized
    from tuner.runtime.verify import fp8_inputs

    q, k, v, ds = fp8_inputs(problem, "cuda", seed)
    return q, k, v, ds.k, ds.v, dequantized(k, ds.k), dequantized(v, ds.v)


def _kernels_run(call) -> set[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("form", ["per_row", "one", "per_head"])
def test_a_dense_fp8_cache_runs_the_kernel(cache_package, form: str) -> None:
    import torch

    mod, kernel, _ = cache_package
    q, k, v, ks, vs, rk, rv = _cache(CACHE, seed=1)
    if form == "one":  # one scale for the whole cache: the real values change with it
        ks, vs = ks[0, 0].reshape(()), vs[0, 0].reshape(())
        rk, rv = k.float() * ks, v.float() * vs
    elif form == "per_head":
        ks, vs = ks[0].contiguous(), vs[0].contiguous()
        rk, rv = k.float() * ks[None, :, None, None], v.float() * vs[None, :, None, None]
    want = reference(q.float(), rk, rv, False)[0]
    ex = mod.explain(q, k, v, k_scale=ks, v_scale=vs)
    assert ex.kernel == kernel and ex.error is None, str(ex)
    outs = []
    with torch.no_grad():
        names = _kernels_run(lambda: outs.append(mod.attention(q, k, v, k_scale=ks, v_scale=vs)))
        outs.append(mod.attention(q, k, v, k_scale=ks, v_scale=vs))  # the cached layout
    assert kernel in names, sorted(names)[:20]
    for out in outs:
        assert out.dtype == q.dtype
        assert relative_error(out, want) < TOLERANCE[CACHE.dtype]


def test_a_paged_fp8_cache_with_lengths_runs_in_place_and_replays_in_a_graph(cache_package) -> None:
    import torch

    from tuner.runtime.verify import paged_cache

    mod, kernel, _ = cache_package
    problem = Problem(3, 32, 1, 2000, 128, dtype="bf16_kv_e4m3", heads_kv=8)
    q, k, v, ks, vs, rk, rv = _cache(problem, seed=2)
    table = torch.randperm(3 * 125, device="cuda").to(torch.int32).view(3, 125)
    kc, vc = paged_cache(k, 16, table), paged_cache(v, 16, table)
    lens = torch.tensor([2000, 1, 777], dtype=torch.int32, device="cuda")

    def want(lengths):
        return torch.cat([reference(q[b:b + 1].float(), rk[b:b + 1, :, :n], rv[b:b + 1, :, :n], False)[0]
                          for b, n in enumerate(lengths)])

    with torch.no_grad():
        got = []
        names = _kernels_run(lambda: got.append(mod.attention(q, kc, vc, block_table=table, seq_lens=lens,
                                                              k_scale=ks, v_scale=vs)))
        assert kernel in names and relative_error(got[0], want([2000, 1, 777])) < TOLERANCE[problem.dtype]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = mod.attention(q, kc, vc, block_table=table, seq_lens=lens, k_scale=ks, v_scale=vs)
        lens.copy_(torch.tensor([64, 1999, 5]))
        graph.replay()
        torch.cuda.synchronize()
    assert relative_error(out, want([64, 1999, 5])) < TOLERANCE[problem.dtype]


def test_an_fp8_cache_call_under_torch_compile(cache_package) -> None:
    import torch

    mod, kernel, _ = cache_package
    q, k, v, ks, vs, rk, rv = _cache(CACHE, seed=3)
    compiled = torch.compile(lambda q, k, v, ks, vs: mod.attention(q, k, v, k_scale=ks, v_scale=vs) * 2.0,
                             fullgraph=True)
    with torch.no_grad():
        got = []
        names = _kernels_run(lambda: got.append(compiled(q, k, v, ks, vs)))
    assert kernel in names
    assert relative_error(got[0] / 2.0, reference(q.float(), rk, rv, False)[0]) < TOLERANCE[CACHE.dtype]


def test_export_check_of_an_fp8_cache_package(cache_package, hopper) -> None:
    """--check measures the FP8-cache cells: the kernel verifies with the scales and is timed against the
    dequantise + SDPA fallback; the tuned cell keeps the kernel (it reads half the bytes SDPA reads)."""
    from tuner.export.check import check_package

    mod, kernel, base = cache_package
    name = mod.MANIFEST["package"]
    records = check_package(base / name, name, hopper)
    assert records and all(Problem.from_dict(r["problem"]).dtype == CACHE.dtype for r in records)
    for r in records:
        print(f"\n{r['problem_label']}: {r['route']} {r['kernel']} ratio {r['ratio']} vs {r['sdpa_impl']}")
        assert [c["error"] for c in r["candidates"]] == [None], r
    assert records[0]["route"] == "kernel" and records[0]["kernel"] == kernel
