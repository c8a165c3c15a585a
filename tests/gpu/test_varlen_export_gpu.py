"""An exported packed-sequence kernel on a real sm_90 GPU: attention_varlen runs it (not the fallback) on packed
batches of other lengths than the tuned draw, within tolerance of each sequence's fp32 reference, in a CUDA
graph too, and explain_varlen names it."""

from __future__ import annotations

import pytest

from tests.gpu.one_trial_export import export_one_trial
from tuner.problem import Problem
from tuner.runtime.verify import TOLERANCE, reference, relative_error

pytestmark = pytest.mark.gpu

PACKED = Problem(8, 16, 2048, 2048, 128, "bf16", causal=True, heads_kv=4, layout="packed", lengths="uniform:64")
PARAMS = dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, SWIZZLE=128, OVERLAP=True, PINGPONG=True, PRODUCER_REGS=24,
              PERSISTENT=False, TWO_P=False)


@pytest.fixture(scope="module")
def packed_package(hopper, tmp_path_factory):
    from tuner.kernels.variant import Variant

    variant = Variant("attn_fwd_wgmma", 128, "bf16", True, PARAMS, packed=True)
    base = tmp_path_factory.mktemp("varlen_export_gpu")
    return export_one_trial(hopper, base, PACKED, variant, median_us=300.0, rel_error=2e-3), variant.name


def _batch(lengths: list[int], seed: int):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, 16, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    cu = torch.tensor([sum(lengths[:i]) for i in range(len(lengths) + 1)], dtype=torch.int32, device="cuda")
    return q, k, v, cu


def _error(out, q, k, v, lengths: list[int]) -> float:
    start, worst = 0, 0.0
    for n in lengths:
        rows = slice(start, start + n)
        want = reference(*(t[rows].transpose(0, 1)[None] for t in (q, k, v)), True)[0]
        worst = max(worst, relative_error(out[rows].transpose(0, 1)[None], want))
        start += n
    return worst


@pytest.mark.parametrize("lengths", [[2048, 64, 1000, 1, 777, 2047], [300] * 12, [1500]])
def test_attention_varlen_runs_the_packed_kernel(packed_package, lengths: list[int]) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    pkg, name = packed_package
    q, k, v, cu = _batch(lengths, seed=len(lengths))
    assert pkg.explain_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True).kernel == name
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = pkg.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
        torch.cuda.synchronize()
    assert name in {e.key for e in prof.key_averages()}
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _error(out, q, k, v, lengths) < TOLERANCE["bf16"]


def test_attention_varlen_replays_in_a_cuda_graph_on_new_inputs(packed_package) -> None:
    import torch

    pkg, _ = packed_package
    lengths = [900, 31, 2000]
    q, k, v, cu = _batch(lengths, seed=5)
    pkg.attention_varlen(q, k, v, cu, cu, 2048, 2048, causal=True)  # the first call chooses and loads
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pkg.attention_varlen(q, k, v, cu, cu, 2048, 2048, causal=True)
    q2, k2, v2, _ = _batch(lengths, seed=6)
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    assert _error(out, q, k, v, lengths) < TOLERANCE["bf16"]


def test_export_check_measures_the_packed_cells(hopper, tmp_path) -> None:
    """--check verifies the packed kernel on its tuned batch and on packed serving batches, times it against the
    package's per-sequence fallback, and records each cell in the manifest."""
    import json
    from pathlib import Path

    from tuner.export.check import check_package
    from tuner.export.check_cells import check_cells
    from tuner.export.selection import ROUTE_BELOW
    from tuner.kernels.variant import Variant

    variant = Variant("attn_fwd_wgmma", 128, "bf16", True, PARAMS, packed=True)
    pkg = export_one_trial(hopper, tmp_path, PACKED, variant, median_us=300.0, rel_error=2e-3)
    root = Path(pkg.__file__).parent.parent
    records = check_package(root, pkg.__name__, hopper)
    print("\n" + "\n".join(f"{r['problem_label']}: {r['route']} {r['ratio']}" for r in records))
    assert len(records) == len(check_cells(pkg.MANIFEST["entries"])) > 3
    for r in records:
        assert r["key"]["packed"] and r["kernel"] == variant.name, r
        assert r["candidates"][0]["error"] is None and r["sdpa_impl"] == "sdpa_per_sequence", r
        assert r["ratio"] is not None and (r["route"] == "kernel") == (r["ratio"] >= ROUTE_BELOW), r
        if Problem.from_dict(r["problem"]).batch >= 16:  # one launch against 16+ SDPA calls and a host sync
            assert r["route"] == "kernel" and r["ratio"] > 1.0, r
    assert json.loads((root / pkg.__name__ / "manifest.json").read_text())["checked"]["cells"] == records
