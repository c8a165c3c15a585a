"""Issue 40, item 2 on a GPU: a backward template (the sm_80 mma.sync attn_bwd_mma, or --template attn_bwd_wgmma,
the Hopper wgmma one) checked and timed.

1. Checks: on each case below, our forward (attn_fwd_mma) gives o and lse, then backward variants (a covering
   sample of the template's tunables per case, or --variants) give dq, dk, dv (NaN-poisoned first), compared with
   fp32 autograd of the reference (tuner.runtime.backward_verify): one line per (case, variant), ok/FAIL with each
   gradient's relative L2 error, then a summary. The error's denominator is floored at the gradient's rounding scale
   (backward_verify.grad_noise_floors: the dtype's epsilon times the norm of its terms' magnitudes), so a gradient
   that is exactly zero (dQ and dK at Sk = 1) compares its answer with that scale, not with fp32 rounding noise.
2. Timing: our backward (the three kernels, tuner.runtime.backward_launch) against torch SDPA's backward (flash and
   cuDNN backends, torch.nn.attention.sdpa_kernel; dq, dk, dv through autograd of a forward run once), in
   interleaved rounds, back to back, L2 flushed (tuner.runtime.timing.time_cuda), at B8 H16 S2048 D128 bf16 and
   B16 H16 S2048 D64 bf16 (or --shape); a table of µs and per-round ratios (> 1: ours faster).

Cases the template does not support (attn_bwd_wgmma: no head dim 32, windows or softcap) are listed as skipped; a
variant that fails (wrong gradients, a compile error, a launch fault) prints FAIL with its reason and the run goes on
(a launch fault may leave the CUDA context unusable, so later cases then fail too).

Needs torch, pycuda (the tuner's JIT path binds it to torch's context), nvcc, and the repository on PYTHONPATH:
    PYTHONPATH=$PWD python benchmarks/bwd_mma_check.py [--template attn_bwd_wgmma] [--rounds 5] [--no-check]
        [--no-time] [--quick] [--cubins old=.ab/old]
--cubins LABEL=DIR also times each variant's cubin from DIR (benchmarks/build_cubins.py run from another revision's
checkout, which must take the same launch contract) in the same rounds, after comparing its gradients with this
revision's, and prints each revision's per-round ratio against this one: an A/B across template revisions.
Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from tuner.kernels.feasibility import covering_sample, feasible_space, supports_problem
from tuner.kernels.manifest import load_manifest
from tuner.kernels.variant import Variant
from tuner.problem import Problem, problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.backward_launch import BackwardKernel
from tuner.runtime.backward_trial import fa4_backward
from tuner.runtime.backward_verify import check_backward, forward_outputs
from tuner.runtime.build import build_many
from tuner.runtime.timing import interleaved_rounds, per_round_ratio, time_cuda

TEMPLATES = ("attn_bwd_mma", "attn_bwd_wgmma")
CASES = [
    Problem(2, 4, 128, 128, 64),
    Problem(1, 2, 1, 1, 64),
    Problem(1, 2, 1, 1, 128, dtype="bf16", causal=True),
    Problem(1, 2, 17, 17, 128, dtype="bf16"),
    Problem(1, 2, 17, 17, 64, causal=True),
    Problem(1, 2, 130, 130, 64, dtype="bf16", causal=True),
    Problem(1, 2, 130, 130, 128),
    Problem(1, 2, 1000, 1000, 128, causal=True),
    Problem(1, 2, 1000, 1000, 64, dtype="bf16"),
    Problem(1, 2, 100, 300, 64, causal=True),
    Problem(1, 2, 300, 100, 128, dtype="bf16", causal=True),
    Problem(1, 2, 17, 130, 128),
    Problem(2, 8, 257, 257, 64, heads_kv=2),
    Problem(2, 8, 130, 1000, 128, dtype="bf16", causal=True, heads_kv=2),
    Problem(1, 8, 1000, 17, 64, dtype="bf16", heads_kv=2),
    Problem(2, 8, 1000, 1000, 128, dtype="bf16", heads_kv=2),
    Problem(2, 4, 200, 190, 128, layout="bshd"),
    Problem(1, 2, 129, 129, 32, dtype="bf16", causal=True),
    Problem(1, 2, 600, 600, 64, dtype="bf16", causal=True, window_left=20),
    Problem(1, 2, 250, 650, 128, window_left=70, window_right=10),
    Problem(1, 2, 450, 280, 64, causal=True, window_left=100),
    Problem(1, 4, 333, 333, 64, dtype="bf16", softcap=5.0, heads_kv=2),
    Problem(1, 2, 190, 190, 128, causal=True, softcap=50.0),
]
# Our candidates at the timing shapes, per template (tunables part of the name; those infeasible are skipped).
CANDIDATES = {
    "attn_bwd_mma": ["m64n128_w8_xor_s2", "m64n128_w8_pad_s2", "m32n128_w8_pad_s2", "m64n64_w4_xor_s2",
                     "m32n64_w4_pad_s2", "m128n128_w8_xor_s2", "m64n128_w8_xor_s1"],
    "attn_bwd_wgmma": ["m64n128_s2", "m64n128_s1", "m64n64_s2", "m128n128_s2", "m128n64_s2"],
}
SHAPES = ["8,16,2048,128", "16,16,2048,64"]
# Checked on every case where feasible, --quick too (whose two covering variants may miss a tiling that only one
# point of the space takes, e.g. BLOCK_M 80).
ALWAYS_CHECKED = {"attn_bwd_wgmma": ["m64n128_s2_bulk_pw", "m80n128_s2_bulk_pw"]}


def run_checks(template: str, profile: Any, quick: bool) -> bool:
    failed, total = [], 0
    for i, problem in enumerate(CASES):
        why = supports_problem(load_manifest(template), problem)
        variants = [] if why else covering_sample(template, problem, profile, seed=i)[: 2 if quick else None]
        if variants:
            named = _feasible_named(template, problem, ALWAYS_CHECKED.get(template, []), profile)
            variants += [v for v in named if v not in variants]
        if not variants:
            print(f"skip {problem.label} {problem.layout}: {why or 'no feasible variant on ' + profile.name}")
            continue
        for variant in variants:  # one at a time: a variant's failure does not hide the others' results
            total += 1
            try:
                checks = check_backward(problem, [variant], profile, seed=i)
            except Exception as exc:  # a launch fault or compile error is a failed check, reported, not a crash
                print(f"FAIL {problem.label} {problem.layout} {variant.name} {type(exc).__name__}: {str(exc)[:300]}",
                      flush=True)
                failed.append(f"{problem.label} {variant.name}")
                continue
            for c in checks:
                print(c.line(f"{problem.label} {problem.layout}"), flush=True)
                if not c.ok:
                    failed.append(f"{problem.label} {c.variant}")
    print(f"\nchecks: {total - len(failed)}/{total} ok" + ("" if not failed else "; failed:\n  " + "\n  ".join(failed)))
    return not failed


def _feasible_named(template: str, problem: Problem, names: list[str], profile: Any) -> list[Variant]:
    """The feasible variants among `names` (tunables parts of names, e.g. m64n128_s2), silently."""
    feasible = {v.name: v for v in feasible_space(template, problem, profile)}
    full = (f"{template}_d{problem.head_dim}_{problem.dtype}_{short}" + ("_causal" if problem.causal else "")
            for short in names)
    return [feasible[name] for name in full if name in feasible]


def _variants(template: str, problem: Problem, names: list[str], profile: Any) -> list[Variant]:
    """The feasible variants whose names' tunables part is in `names` (e.g. m64n128_s2)."""
    feasible = {v.name: v for v in feasible_space(template, problem, profile)}
    out = []
    for short in names:
        name = f"{template}_d{problem.head_dim}_{problem.dtype}_{short}" + ("_causal" if problem.causal else "")
        if name in feasible:
            out.append(feasible[name])
        else:
            print(f"  ({short} is not feasible for {problem.label} on {profile.name}: skipped)")
    return out


def _sdpa_backward(q: Any, k: Any, v: Any, do: Any, causal: bool, backend: Any) -> Callable[[], Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    qr, kr, vr = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    print(f"  SDPA {backend.name}: backward node {type(out.grad_fn).__name__}")
    return lambda: torch.autograd.grad(out, (qr, kr, vr), do, retain_graph=True)


def _revision(built: Any, folder: Path) -> BackwardKernel:
    """The same variant from another template revision: <folder>/<name>.cubin (build_cubins.py, run from that
    revision's checkout), launched with this revision's launch contract (threads, shared memory, parameter list:
    compare revisions that share it)."""
    cubin = folder / f"{built.variant.name}.cubin"
    if not cubin.is_file():
        raise FileNotFoundError(f"{cubin} (build it with benchmarks/build_cubins.py from the other checkout)")
    return BackwardKernel(dataclasses.replace(built, compiled=dataclasses.replace(built.compiled, cubin_path=cubin)))


def _max_rel_diff(a: tuple[Any, ...], b: tuple[Any, ...]) -> float:
    """The largest relative L2 difference between two (dq, dk, dv) results."""
    return max(float((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30)) for x, y in zip(a, b))


def time_shape(template: str, shape: str, names: list[str], rounds: int, profile: Any, hkv: int | None,
               causal: bool, cubins: dict[str, Path] | None = None) -> None:
    import torch
    from torch.nn.attention import SDPBackend

    problem = problem_from_shape(shape, dtype="bf16", causal=causal, **({"heads_kv": hkv} if hkv else {}))
    print(f"\n== {problem.label} on {profile.name}")
    scale = 1.0 / math.sqrt(problem.head_dim)
    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(problem.batch, h, s, problem.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h, s in ((problem.heads, problem.seq_q), (problem.heads_kv, problem.seq_k),
                            (problem.heads_kv, problem.seq_k)))
    do = torch.randn_like(q)
    o, lse = forward_outputs(problem, q, k, v, scale, profile.nvcc_arch, profile)
    calls: dict[str, Callable[[], Any]] = {}
    variants = _variants(template, problem, names, profile)
    for variant, built in zip(variants, build_many(variants, profile.nvcc_arch)):
        if not built.ok:
            print(f"  FAIL {variant.name}: compile failed\n{built.compiled.log[-1500:]}")
            continue
        try:
            kernel = BackwardKernel(built)
            call = (lambda kern: lambda: kern(q, k, v, o, lse, do, scale))(kernel)
            call()
            torch.cuda.synchronize()
        except Exception as exc:  # reported, and left out of the timing
            print(f"  FAIL {variant.name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        print(f"  {variant.name}: {kernel.registers} registers, {built.compiled.spill_bytes} B spilled")
        calls[variant.name] = call
        for label, folder in (cubins or {}).items():  # the same variant from other template revisions, beside it
            try:
                other = _revision(built, folder)
                other_call = (lambda kern: lambda: kern(q, k, v, o, lse, do, scale))(other)
                diff = _max_rel_diff(other_call(), call())
            except Exception as exc:  # reported, and left out of the timing
                print(f"  FAIL {variant.name}@{label}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            print(f"  {variant.name}@{label}: {other.registers} registers; gradients within {diff:.1e} of this "
                  f"revision's")
            calls[f"{variant.name}@{label}"] = other_call
    for label, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            calls[label] = _sdpa_backward(q, k, v, do, problem.causal, backend)
            calls[label]()
        except RuntimeError as exc:
            print(f"  {label}: unavailable ({str(exc).splitlines()[0][:120]})")
            calls.pop(label, None)
    fa4 = fa4_backward(problem, {"q": q, "k": k, "v": v, "do": do, "scale": scale})
    if fa4 is not None:  # FlashAttention-4's backward where it is installed, in the same rounds
        calls["fa4"] = fa4.call
    timed = interleaved_rounds({n: (lambda f: lambda: time_cuda(f))(f) for n, f in calls.items()}, rounds)
    base = {b: timed[b] for b in ("sdpa_cudnn", "fa4", "sdpa_flash") if b in timed}
    print(f"  {'kernel':56s} {'median us':>10s} " + " ".join(f"{'vs ' + b:>16s}" for b in base))
    for name, us in sorted(timed.items(), key=lambda kv: statistics.median(kv[1])):
        ratios = " ".join(f"{per_round_ratio(b_us, us):16.3f}" for b_us in base.values())
        print(f"  {name:56s} {statistics.median(us):10.1f} {ratios}")
    for name in [n for n in timed if "@" in n]:  # each revision against this one, per round (> 1: this one faster)
        this = name.split("@")[0]
        print(f"  {this} against {name}: {per_round_ratio(timed[name], timed[this]):.3f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="auto")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--quick", action="store_true", help="two variants per check case")
    ap.add_argument("--shape", action="append", help="B,H,S,D (repeatable; default: the issue's two)")
    ap.add_argument("--hkv", type=int, help="K/V heads of the timed shapes (GQA)")
    ap.add_argument("--causal", action="store_true", help="time causal problems")
    ap.add_argument("--template", default="attn_bwd_mma", choices=TEMPLATES, help="the backward template")
    ap.add_argument("--variants", nargs="*", help="tunables parts of our names to time (default: CANDIDATES)")
    ap.add_argument("--cubins", action="append", default=[], metavar="LABEL=DIR",
                    help="also time <variant>.cubin of DIR (build_cubins.py from another revision's checkout) in "
                         "the same rounds, as <variant>@LABEL; repeatable")
    args = ap.parse_args()
    cubins = {label: Path(folder) for label, _, folder in (c.partition("=") for c in args.cubins)}
    profile = resolve_profile(args.gpu)
    ok = True
    if not args.no_check:
        ok = run_checks(args.template, profile, args.quick)
    if not args.no_time:
        for shape in args.shape or SHAPES:
            try:
                time_shape(args.template, shape, args.variants or CANDIDATES[args.template], args.rounds, profile,
                           args.hkv, args.causal, cubins)
            except Exception as exc:  # e.g. a launch fault: reported, the run goes on to the next shape
                print(f"FAIL timing {shape}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
