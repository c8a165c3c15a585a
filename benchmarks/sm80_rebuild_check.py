"""Issue 39, item 2 on the GPU: the sm_80 forward (attn_fwd_mma) rebuilt on common/warp_tile.h and common/mask.h,
gaining sliding windows and softcap; the decode templates' mask moved to common/warp_tile.h (warp_mask) too.

Every variant below is built through the tuner's JIT path (tuner.runtime.build, for this card's arch: an H200
runs the sm_80 template's mma.sync code built for sm_90a) and verified against the fp32 reference, O and lse
(tuner.runtime.verify: every row, or sampled rows on long sequences), on its timing shape and on two odd
shapes (tails, Sq < Sk and Sq > Sk, GQA). Where --old holds the variant's cubin from the revision before
(build_cubins.py), that cubin is verified the same way and the two are timed in interleaved rounds
(time_cuda, back to back, L2 flushed; the median of per-round ratios, > 1: the new build is faster). The
windowed and softcapped variants, which the old template could not build, are timed beside the same variant
without the mask on the same shape (what the window saves, what the tanh costs).

Before, on any machine with nvcc (no GPU), from a worktree of the revision before the rebuild:
    git worktree add /work/old39 4d35ea2    # any revision before the rebuild
    PYTHONPATH=/work/old39 python benchmarks/build_cubins.py --out .ab/old39 \\
        $(python benchmarks/sm80_rebuild_check.py --list-old)
Then on the GPU machine, carrying .ab/old39:
    python benchmarks/sm80_rebuild_check.py --old .ab/old39 --rounds 5 [--json sm80_rebuild.jsonl]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable

# (shape B,H,S,D or B,H,Sq,Sk,D; K/V heads or None; variants, the first the group's subject)
GROUPS: list[tuple[str, int | None, list[str]]] = [
    ("16,16,2048,64", None, ["attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s3_qreg",        # NOTES' D64 best
                             "attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s2_qreg",
                             "attn_fwd_mma_d64_fp16_m64n128_w4_kv4_pad_s3_qreg_lr"]),      # key split 4, lazy rescale
    ("8,16,2048,128", None, ["attn_fwd_mma_d128_fp16_m128n32_w4_q_rows_pad_s3_qsmem_b2",   # NOTES' D128 best
                             "attn_fwd_mma_d128_fp16_m128n64_w4_q_rows_xor_s2_qsmem",
                             "attn_fwd_mma_d128_fp16_m128n32_w8_kv2_none_s1_qsmem"]),      # one stage
    ("8,16,4096,64", None, ["attn_fwd_mma_d64_bf16_m128n64_w4_q_rows_xor_s3_qreg_causal",
                            "attn_fwd_mma_d64_bf16_m128n64_w4_q_rows_xor_s3_qreg_causal_sc50",  # softcap
                            "attn_fwd_mma_d64_bf16_m128n128_w8_q_rows_xor_s2_qsmem_causal"]),
    ("4,32,4096,128", 8, ["attn_fwd_mma_d128_bf16_m128n32_w4_q_rows_pad_s3_qsmem_b2_causal",
                          "attn_fwd_mma_d128_bf16_m64n32_w4_kv2_pad_s3_qsmem_causal",       # key split 2
                          "attn_fwd_mma_d128_bf16_m128n64_w4_q_rows_xor_s2_qsmem_causal"]),
    ("1,32,16384,128", 8, ["attn_fwd_mma_d128_bf16_m128n32_w4_q_rows_pad_s3_qsmem_b2_causal_wl1024",  # window
                           "attn_fwd_mma_d128_bf16_m128n32_w4_q_rows_pad_s3_qsmem_b2_causal"]),
    ("2,16,2048,3072,64", None, ["attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s3_qreg_wl256_wr64_sc30",
                                 "attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s3_qreg"]),  # both sides + softcap
    # The decode templates (warp_mask now common): a window and a softcap, and a plain one.
    ("8,32,1,8192,128", 8, ["attn_decode_sm80_d128_bf16_m16n64_w4_sp4_s3_causal_wl1000_sc50",
                            "attn_decode_sm80_d128_bf16_m16n64_w2_sp2_s2",
                            "attn_decode_d128_bf16_m16n128_w4_sp8_s2_causal_wl1000"]),
]


def problem_of(name: str, shape: str, hkv: int | None) -> Any:
    from tuner.kernels.variant import parse_variant_name
    from tuner.problem import problem_from_shape

    v = parse_variant_name(name)
    return problem_from_shape(shape, dtype=v.dtype, causal=v.causal, heads_kv=hkv,
                              window=(v.window_left, v.window_right), softcap=v.softcap)


def odd_shapes(problem: Any) -> list[Any]:
    """Two small problems with the same features: tails of every tile, Sq < Sk and Sq > Sk, GQA (4 heads on 2)."""
    sq = (3, 5) if problem.seq_q <= 16 else (333, 777)  # a decode variant's rows: a few queries
    return [dataclasses.replace(problem, batch=1, heads=4, heads_kv=2, seq_q=a, seq_k=b)
            for a, b in ((sq[0], 777), (sq[1], 333 if problem.seq_q > 16 else 5))]


DEVICE = "cuda"  # where the inputs live ("cpu" lets the verification's bookkeeping be tried without a GPU)
_CASES: dict[Any, tuple[Any, ...]] = {}


def case(problem: Any, seed: int) -> tuple[Any, ...]:
    """(q, k, v, reference O, reference lse, rows) of a problem, made once: the fp32 reference on every row, or on
    sampled rows where every row would not fit (rows: those, else None)."""
    from tuner.runtime.verify import FULL_REFERENCE_SCORES, make_inputs, problem_reference, sampled_rows

    if (problem, seed) not in _CASES:
        q, k, v = make_inputs(problem, device=DEVICE, seed=seed)
        rows = None if problem.seq_q * problem.seq_k <= FULL_REFERENCE_SCORES else sampled_rows(problem.seq_q)
        ref, ref_lse = problem_reference(problem, q, k, v, 1.0 / math.sqrt(problem.head_dim), rows=rows)
        _CASES[(problem, seed)] = (q, k, v, ref, ref_lse, rows)
    return _CASES[(problem, seed)]


def verify(kern: Any, problem: Any, seed: int, label: str) -> None:
    """O and lse of one launch on the problem's inputs against the fp32 reference."""
    import torch

    from tuner.runtime.verify import TOLERANCE, empty_output, relative_error

    q, k, v, ref, ref_lse, rows = case(problem, seed)
    scale = 1.0 / math.sqrt(problem.head_dim)
    out = empty_output(q)
    lse = torch.full((problem.batch, problem.heads, problem.seq_q), float("nan"), device=DEVICE)
    kern(q, k, v, out, lse, scale)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    if rows is not None:
        picked = torch.as_tensor(rows, dtype=torch.long, device=DEVICE)
        out, lse = out.index_select(2, picked), lse.index_select(2, picked)
    err = relative_error(out, ref)
    assert err < TOLERANCE[problem.dtype], f"{label} on {problem.label}: relative error {err:.2e}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)), f"{label} on {problem.label}: -inf rows of lse differ"
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)
    print(f"  ok {label:80s} {problem.label}: error {err:.2e}", flush=True)


def kernels(name: str, arch: str, old: Path | None) -> dict[str, Any]:
    """The variant's kernels by label: 'new' (this checkout, JIT) and 'old' (its cubin in `old`, if there)."""
    from tuner.kernels.variant import parse_variant_name
    from tuner.runtime.build import build, launch_shape
    from tuner.runtime.shipped.launcher import AttentionKernel

    variant = parse_variant_name(name)
    built = build(variant, arch)
    assert built.ok, f"{name}: compile failed\n{built.compiled.log[-2000:]}"
    print(f"{name}: {built.compiled.registers} registers, {built.compiled.spill_bytes} spill bytes", flush=True)
    out = {"new": built.load()}
    if old is not None and (old / f"{name}.cubin").is_file():
        out["old"] = AttentionKernel((old / f"{name}.cubin").read_bytes(), name, launch_shape(variant), 0)
    return out


def run_group(shape: str, hkv: int | None, names: list[str], arch: str, old: Path | None, rounds: int,
              l2_bytes: int) -> dict[str, Any]:
    import torch

    from tuner.runtime.timing import interleaved_timings, per_round_ratio, time_cuda
    from tuner.runtime.verify import empty_output

    timed: dict[str, Callable[[], Any]] = {}
    problems = {}
    _CASES.clear()
    for name in names:
        problem = problem_of(name, shape, hkv)
        problems[name] = problem
        for label, kern in kernels(name, arch, old).items():
            for small in odd_shapes(problem):
                verify(kern, small, 1, f"{name}@{label}")
            verify(kern, problem, 0, f"{name}@{label}")
            q, k, v = case(problem, 0)[:3]
            out, scale = empty_output(q), 1.0 / math.sqrt(problem.head_dim)
            launch = (lambda kern=kern, q=q, k=k, v=v, out=out, scale=scale:
                      kern.launch_unchecked(q, k, v, out, None, scale))
            timed[f"{name}@{label}"] = lambda launch=launch: time_cuda(launch, l2_bytes=l2_bytes, rep_ms=100)
    times = {n: [t.median_us for t in ts] for n, ts in interleaved_timings(timed, rounds).items()}
    torch.cuda.synchronize()
    res: dict[str, Any] = {"shape": shape, "hkv": hkv, "rounds": rounds, "times_us": times, "new_vs_old": {},
                           "vs_subject": {}}
    print(f"\n{shape} (Hkv {hkv or 'all'}), {rounds} interleaved rounds")
    subject = f"{names[0]}@new"
    for n, ts in times.items():
        name = n.rsplit("@", 1)[0]
        us = statistics.median(ts)
        line = f"  {n:86s} {us:9.1f} us {problems[name].tflops(us):6.1f} TFLOP/s"
        if n.endswith("@new") and f"{name}@old" in times:
            ratio = per_round_ratio(times[f"{name}@old"], ts)
            res["new_vs_old"][name] = ratio
            line += f"  new/old {ratio:.3f}x (old us / new us)"
        elif n == subject:  # a variant the old template could not build: its time against the others'
            for other in (o for o in times if o.endswith("@new") and o != subject):
                ratio = per_round_ratio(ts, times[other])
                res["vs_subject"][other] = ratio
                line += f"\n      time {ratio:.3f}x that of {other}"
        print(line, flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, default=None, help="folder of the revision-before cubins (build_cubins.py)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="append each group's result as a JSON line")
    ap.add_argument("--list-old", action="store_true",
                    help="print the variants the old revision can build (no window or softcap on attn_fwd_mma), "
                         "for build_cubins.py; no GPU")
    args = ap.parse_args()
    if args.list_old:
        from tuner.kernels.variant import parse_variant_name

        names = {n for _, _, ns in GROUPS for n in ns}
        print(" ".join(sorted(n for n in names if not (parse_variant_name(n).template == "attn_fwd_mma"
                                                       and parse_variant_name(n).masked))))
        return
    from tuner.profiles import resolve_profile
    from tuner.runtime.driver import cuda_driver

    cuda_driver(0)
    profile = resolve_profile("auto")
    ratios: list[float] = []
    for shape, hkv, names in GROUPS:
        res = run_group(shape, hkv, names, profile.nvcc_arch, args.old, args.rounds, profile.l2_bytes)
        ratios += list(res["new_vs_old"].values())
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(res) + "\n")
    if ratios:
        print(f"\nnew/old over {len(ratios)} variants: median {statistics.median(ratios):.3f}x, "
              f"min {min(ratios):.3f}x, max {max(ratios):.3f}x (> 1: the rebuild is faster)")


if __name__ == "__main__":
    main()
