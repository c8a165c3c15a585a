"""The decode template without a GPU: it is chosen for short queries only, every value of every parameter
compiles (clusters included), and its launch grid covers the packed rows with one cluster per row block."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.kernels.feasibility import covering_sample, default_template, supports_problem
from tuner.kernels.manifest import load_manifest
from tuner.kernels.render import render
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.shipped.launcher import LaunchShape, launch_grid
from tuner.runtime.timed import Timing

TEMPLATE = "attn_decode"
DECODE_STEP = Problem(8, 32, 1, 8192, 128, dtype="bf16", heads_kv=8)


def test_the_search_picks_it_for_short_queries_only() -> None:
    h100 = load_profile("h100")
    assert default_template(h100, [DECODE_STEP, Problem(8, 32, 16, 8192, 128, heads_kv=8)]) == TEMPLATE
    assert default_template(h100, [Problem(4, 32, 4096, 4096, 128, heads_kv=8)]) == "attn_fwd_wgmma"
    why = supports_problem(load_manifest(TEMPLATE), Problem(1, 8, 17, 17, 64))
    assert "queries of at most 16 rows (Sq 17)" in why


def test_only_the_decode_template_takes_a_paged_cache() -> None:
    paged = Problem(8, 32, 1, 8192, 128, dtype="bf16", heads_kv=8, layout="paged16")
    assert supports_problem(load_manifest(TEMPLATE), paged) == ""
    assert default_template(load_profile("h100"), [paged]) == TEMPLATE
    for other in ("attn_fwd_wgmma", "attn_fwd_mma"):
        assert supports_problem(load_manifest(other), paged) == f"layout paged16 unsupported by {other}"


@settings(max_examples=20, deadline=None)
@given(page=st.sampled_from([16, 32, 64, 128, 256]), sk=st.integers(1, 700), batch=st.integers(1, 3),
       seed=st.integers(0, 9))
def test_paged_inputs_hold_each_rows_keys_in_its_pages(page: int, sk: int, batch: int, seed: int) -> None:
    """What a paged trial's kernel reads: row b's key n is row n % page of page block_table[b, n // page],
    every page used once."""
    import torch

    from tuner.backends.gpu_child import kernel_call
    from tuner.runtime.verify import paged_inputs

    problem = Problem(batch, 4, 1, sk, 64, heads_kv=2, layout=f"paged{page}")
    k, v = (torch.randn(batch, 2, sk, 64) for _ in range(2))
    paged = paged_inputs(problem, k, v, seed)
    table = paged["block_table"]
    assert table.dtype == torch.int32 and len(set(table.reshape(-1).tolist())) == table.numel()
    assert paged["seq_lens"].tolist() == [sk] * batch
    for name, t in (("k_cache", k), ("v_cache", v)):
        gathered = paged[name][table.long()].reshape(batch, -1, 2, 64)[:, :sk].transpose(1, 2)
        assert torch.equal(gathered, t), name
    calls = []

    class Kernel:  # records which launch a trial would time
        def paged(self, *args, **kwargs):
            calls.append(("paged", kwargs["check"]))

    kernel_call(Kernel(), {"q": None, "k": k, "v": v, "scale": 1.0, **paged}, None, checked=False)()
    assert calls == [("paged", False)]


def test_the_entry_point_forms_a_cluster_of_the_splits() -> None:
    variant = covering_sample(TEMPLATE, DECODE_STEP, load_profile("h100"), seed=0)[0]
    source = render(variant)
    assert "__cluster_dims__(TunerCfg::SPLITS, 1, 1)" in source
    assert f'TunerCfg::SPLITS == {variant.params["SPLITS"]}' in source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("problem", [DECODE_STEP, Problem(2, 8, 4, 777, 64, causal=True, heads_kv=2)],
                         ids=lambda p: p.label.replace(" ", "_"))
def test_every_parameter_value_compiles_without_spills(problem: Problem) -> None:
    from tuner.runtime.build import build_many

    profile = load_profile("h100")
    variants = covering_sample(TEMPLATE, problem, profile, seed=1)
    for built in build_many(variants, profile.nvcc_arch):
        assert built.ok, built.compiled.log[-2000:]
        assert built.compiled.spill_bytes == 0, f"{built.variant.name} spills"
        assert built.shape.splits == built.variant.params["SPLITS"]


@settings(max_examples=200, deadline=None)
@given(b=st.integers(1, 64), hkv=st.integers(1, 16), group=st.sampled_from([1, 2, 4, 8]), sq=st.integers(1, 16),
       block_m=st.sampled_from([16, 32, 64]), splits=st.sampled_from([1, 2, 4, 8, 16]))
def test_the_grid_covers_every_packed_row_once(b, hkv, group, sq, block_m, splits) -> None:
    """Rows are (query, group head) pairs: ceil(rows / BLOCK_M) row blocks, each one cluster of `splits` CTAs
    along x (the cluster dims), per K/V head and batch."""
    shape = LaunchShape(block_m=block_m, threads=128, smem_bytes=0, splits=splits)
    x, y, z = launch_grid(shape, b, hkv * group, hkv, sq, sm_count=132)
    assert (y, z) == (hkv, b) and x % splits == 0
    blocks = x // splits
    assert (blocks - 1) * block_m < sq * group <= blocks * block_m


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("template, profile, gpu_name, arch, says", [
    (TEMPLATE, "h100", "NVIDIA H100 80GB HBM3", "90a", ["__cluster_dims__(Cfg::SPLITS, 1, 1)",
                                                         "grid (ceil(Sq * H / Hkv / Cfg::BM) * Cfg::SPLITS, Hkv, B)"]),
    ("attn_decode_sm80", "a100", "NVIDIA A100-SXM4-80GB", "80", ["workspace (float*", "no cluster"]),
])
def test_a_header_export_of_decode_kernels_says_how_to_launch_them_and_compiles(tmp_path, template: str, profile: str,
                                                                                gpu_name: str, arch: str,
                                                                                says: list[str]) -> None:
    """The header's usage names the decode Config and how to launch it (a cluster on sm_90, a workspace on
    sm_80), and the usage, as written, compiles with nvcc."""
    import re
    import subprocess

    from tuner.export.run import ExportOptions, export
    from tests.built_trials import add_built_trial
    from tuner.kernels.variant import Variant
    from tuner.store import BaselineRecord, RunInfo, open_store

    url = f"sqlite:///{tmp_path / 'r.db'}"
    variant = Variant(template, 128, "bf16", False, dict(BLOCK_M=16, BLOCK_N=64, NUM_WARPS=4, SPLITS=2, STAGES=2))
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name=gpu_name, profile=profile, host="test"))
        store.add_baseline(BaselineRecord(run_id=run, problem=DECODE_STEP, impl="sdpa_cudnn", timing=Timing(100.0)))
        add_built_trial(store, run, DECODE_STEP, variant, f"sm_{arch}", 94.0, 3e-3)
        store.finish_run(run)
    out = tmp_path / "hdr"
    export(ExportOptions(gpu=profile, out=out, db_url=url, format="header", name="dec"))
    header = (out / "dec.h").read_text()
    assert "fc::DecodeConfig" in header and all(text in header for text in says), header[:3000]
    bucket = re.search(r"struct (bf16_d128_\w+) \{", header).group(1)
    usage = [line[4:] for line in header.splitlines() if line.startswith("//   ")]
    user = out / "user.cu"
    user.write_text(f'#include "{template}.cu"\n#include "dec.h"\n' + "\n".join(usage).replace("<bucket>", bucket)
                    + "\n")
    run = subprocess.run(["nvcc", "-cubin", "-std=c++17", "-O1", "-gencode", f"arch=compute_{arch},code=sm_{arch}",
                          "-o", str(out / "user.cubin"), str(user)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert b"my_attention" in (out / "user.cubin").read_bytes()


@pytest.mark.parametrize("splits, ok", [(2, False), (16, False), (1, True)])
def test_the_split_merges_static_shared_memory_counts_against_the_limit(splits: int, ok: bool) -> None:
    """With splits the sm_80 decode kernel has 1 KiB of static shared memory (its merge flag, before the 1024-
    aligned dynamic array): on an L4 (101,376 B per block) 100,376 B of dynamic shared memory fit only without."""
    from tuner.kernels.feasibility import check
    from tuner.kernels.variant import parse_variant_name

    variant = parse_variant_name(f"attn_decode_sm80_d64_fp16_m16n128_w2_sp{splits}_s3")
    result = check(variant, Problem(1, 32, 1, 4096, 64, heads_kv=8), load_profile("l4"))
    assert result.ok is ok and result.smem_bytes == 100376
    assert ok or "100376 B + 1024 B static exceeds l4's 101376 B per block" in result.reason
