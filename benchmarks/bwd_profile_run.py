"""One backward variant launched a few times on one problem, for ncu (nothing timed, nothing checked):

    ncu --clock-control none --kernel-name regex:'^attn_bwd_wgmma_d128_bf16_m64n128_s2$' --launch-count 1 \
        --set full -o prof python3 benchmarks/bwd_profile_run.py attn_bwd_wgmma_d128_bf16_m64n128_s2 --shape 8,16,2048,128

Needs torch, pycuda and nvcc, and the repository on PYTHONPATH (benchmarks/bwd_mma_check.py checks and times).
"""

from __future__ import annotations

import argparse
import math

import torch

from tuner.kernels.variant import parse_variant_name
from tuner.problem import problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.backward_launch import BackwardKernel
from tuner.runtime.backward_trial import fa4_backward
from tuner.runtime.backward_verify import forward_outputs
from tuner.runtime.build import build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant", help="a backward variant's full name, or fa4 (FlashAttention-4's backward, bf16)")
    ap.add_argument("--shape", default="8,16,2048,128", help="B,H,S,D")
    ap.add_argument("--hkv", type=int, help="K/V heads (GQA)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--lineinfo", action="store_true", help="build with -lineinfo (ncu's source view)")
    args = ap.parse_args()
    profile = resolve_profile("auto")
    variant = parse_variant_name(args.variant) if args.variant != "fa4" else None
    dtype_name = variant.dtype if variant else "bf16"
    problem = problem_from_shape(args.shape, dtype=dtype_name, causal=args.causal,
                                 **({"heads_kv": args.hkv} if args.hkv else {}))
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(problem.batch, h, s, problem.head_dim, device="cuda", dtype=dtype, generator=gen)
               for h, s in ((problem.heads, problem.seq_q), (problem.heads_kv, problem.seq_k),
                            (problem.heads_kv, problem.seq_k)))
    do = torch.randn_like(q)
    scale = 1.0 / math.sqrt(problem.head_dim)
    if variant is None:  # FA4: autograd of its forward, run `runs` times
        fa4 = fa4_backward(problem, {"q": q, "k": k, "v": v, "do": do, "scale": scale})
        if fa4 is None:
            raise SystemExit("FlashAttention-4 is not installed or does not take this problem")
        for _ in range(args.runs):
            fa4.call()
        torch.cuda.synchronize()
        print(f"fa4: {args.runs} runs at {problem.label}")
        return
    o, lse = forward_outputs(problem, q, k, v, scale, profile.nvcc_arch, profile)
    kernel = BackwardKernel(build(variant, profile.nvcc_arch, lineinfo=args.lineinfo))
    for _ in range(args.runs):
        kernel(q, k, v, o, lse, do, scale)
    torch.cuda.synchronize()
    print(f"{variant.name}: {args.runs} runs at {problem.label}")


if __name__ == "__main__":
    main()
