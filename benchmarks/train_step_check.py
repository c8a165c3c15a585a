"""Forward + backward of attention() (the tuned forward, the backward it chooses) against SDPA's backends.

    PYTHONPATH=$PWD python benchmarks/train_step_check.py                       # builds a package: one trial per problem
    PYTHONPATH=$PWD python benchmarks/train_step_check.py --package /path/to/out/my_attention   # an exported package
    PYTHONPATH=$PWD python benchmarks/train_step_check.py --rounds 5 --variant attn_fwd_wgmma_d128_bf16_...

One process, back to back (tuner.runtime.timing.time_cuda: L2 flushed between repetitions, no host wait),
interleaved rounds (every row once per round, the median over rounds reported). Each row times
out = attention(q, k, v); torch.autograd.grad(out, (q, k, v), dO): ours (the backward attention() chooses), ours
with each SDPA backward forced on our O and lse (and the package's tuned backward, where it ships one), and torch SDPA under its default, flash and cuDNN backends (GQA
through enable_gqa, or k and v expanded inside the timed call where a backend refuses it: the row says so).
Problems: B8 H16 S2048 D128 bf16, and B1 H32 Hkv8 S16384 D128 bf16 causal. Without --package, a package is built
the way tests/gpu/one_trial_export.py does: one trial per problem (the card's template; on sm_90 the wgmma tiles
below unless --variant names one), made-up timings, exported to a temporary folder.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import uuid
from contextlib import nullcontext
from pathlib import Path

import torch

from tuner.problem import Problem
from tuner.runtime.timing import time_cuda
from tuner.runtime.verify import make_inputs, relative_error

PROBLEMS = [Problem(8, 16, 2048, 2048, 128, dtype="bf16"),
            Problem(1, 32, 16384, 16384, 128, dtype="bf16", causal=True, heads_kv=8)]
WGMMA_PARAMS = dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, SWIZZLE=128, OVERLAP=True, PINGPONG=True, PRODUCER_REGS=24,
                    PERSISTENT=False)


def build_package(base: Path, variant_name: str | None, problems: list[Problem] = PROBLEMS) -> object:
    """An export of a fresh store holding one ok trial per problem (tests/gpu/one_trial_export.py's way)."""
    from tests.built_trials import add_built_trial
    from tuner.export.run import ExportOptions, export
    from tuner.kernels.feasibility import check, covering_sample, default_template
    from tuner.kernels.variant import Variant, parse_variant_name
    from tuner.profiles import resolve_profile
    from tuner.store import RunInfo, open_store

    profile = resolve_profile("auto")
    url = f"sqlite:///{base / 'results.db'}"
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name="train_step_check", profile=profile.name, host="bench"))
        for problem in problems:
            template = default_template(profile, [problem])
            if variant_name:
                variant = parse_variant_name(variant_name)
                variant = Variant(variant.template, problem.head_dim, problem.dtype, problem.causal, variant.params)
            elif template == "attn_fwd_wgmma":
                variant = Variant(template, problem.head_dim, problem.dtype, problem.causal, WGMMA_PARAMS)
            else:
                variant = covering_sample(template, problem, profile)[0]
            if not check(variant, problem, profile):
                variant = covering_sample(template, problem, profile)[0]
            print(f"{problem.label}: {variant.name}")
            add_built_trial(store, run, problem, variant, profile.nvcc_arch, 100.0, 2e-3)
        store.finish_run(run)
    name = f"train_check_{uuid.uuid4().hex[:8]}"
    export(ExportOptions(gpu=profile.name, out=base / name, db_url=url))
    return import_package(base / name / name)


def import_package(folder: Path) -> object:
    folder = folder.resolve()
    sys.path.insert(0, str(folder.parent))
    try:
        return importlib.import_module(folder.name)
    finally:
        sys.path.remove(str(folder.parent))


def sdpa_row(backend: object, problem: Problem) -> tuple[object, object]:
    """fn(q, k, v, do) -> grads of torch SDPA under one backend (None: torch's choice): with enable_gqa, and with
    k and v expanded in the timed call."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    group = problem.heads // problem.heads_kv

    def native(q, k, v, do):
        with sdpa_kernel(backend) if backend is not None else nullcontext():
            out = sdpa(q, k, v, is_causal=problem.causal, enable_gqa=group > 1)
        return torch.autograd.grad(out, (q, k, v), do)

    def expanded(q, k, v, do):
        with sdpa_kernel(backend) if backend is not None else nullcontext():
            out = sdpa(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=problem.causal)
        return torch.autograd.grad(out, (q, k, v), do)

    return native, expanded


def rows_for(pkg: object, problem: Problem) -> dict[str, object]:
    from torch.nn.attention import SDPBackend

    auto, bw = pkg._runtime.autograd, pkg._runtime.backward

    def ours(q, k, v, do):
        return torch.autograd.grad(pkg.attention(q, k, v, causal=problem.causal), (q, k, v), do)

    def forced(kind):
        def run(q, k, v, do):
            kernel = auto.forward_kernel(q, k, v, problem.causal)
            out, lse = auto._forward(kernel, q, k, v, None)
            return bw.run_backward(kind, do, q, k, v, out, lse, problem.causal, None)
        return run

    def forced_tuned(kernel):
        def run(q, k, v, do):
            out, lse = auto._forward(auto.forward_kernel(q, k, v, problem.causal), q, k, v, None)
            return pkg._runtime.tuned_backward.run(kernel, do, q, k, v, out, lse, None)
        return run

    rows = {"ours (attention(), its backward)": ours, "ours fwd + SDPA flash bwd": forced(bw.FLASH)}
    q0, k0, _ = make_inputs(problem, seed=0)
    shipped = pkg._runtime.tuned_backward.record_for(q0, k0, problem.causal)
    if shipped is not None:  # the package's tuned backward for this problem's entry
        rows[f"ours fwd + tuned bwd ({shipped['kernel']})"] = forced_tuned(shipped["kernel"])
    if torch.cuda.get_device_capability() >= (9, 0) and not isinstance(bw.cudnn_stats_form(make_inputs(
            problem, seed=0)[0]), str):
        rows["ours fwd + SDPA cuDNN bwd"] = forced(bw.CUDNN)
    for label, backend in (("SDPA default", None), ("SDPA flash", SDPBackend.FLASH_ATTENTION),
                           ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)):
        native, expanded = sdpa_row(backend, problem)
        rows[label] = native
        rows[label + " (k/v expanded)"] = expanded
    return rows


def check_rows(rows: dict[str, object], inputs: tuple, reference: tuple) -> dict[str, object]:
    """The rows that run here, each with its worst gradient error against `reference` printed."""
    kept = {}
    for label, fn in rows.items():
        try:
            grads = fn(*inputs)
            torch.cuda.synchronize()
        except RuntimeError as exc:
            print(f"  {label}: does not run here ({str(exc).splitlines()[0][:120]})")
            continue
        err = max(relative_error(g.float(), r.float()) for g, r in zip(grads, reference))
        print(f"  {label}: worst of dq, dk, dv rel. error vs SDPA math fp32 {err:.2e}")
        kept[label] = fn
    return kept


def fp32_grads(problem: Problem, q, k, v, do) -> tuple:
    from tuner.runtime.backward_verify import reference_grads

    if problem.seq_q * problem.seq_k * problem.heads * problem.batch > 2**31:  # too large for an fp32 reference
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
            out = sdpa(qq, kk, vv, is_causal=problem.causal, enable_gqa=problem.heads != problem.heads_kv)
            print("  (reference: SDPA flash's gradients; the problem is too large for fp32 autograd here)")
            return torch.autograd.grad(out, (qq, kk, vv), do)
    return reference_grads(q, k, v, do, problem.causal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, help="an exported package's folder (the one with __init__.py)")
    parser.add_argument("--variant", help="the forward variant to build (without --package)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from tuner.runtime.driver import cuda_driver

    cuda_driver(0)
    tmp = tempfile.TemporaryDirectory(prefix="train_step_check-")
    pkg = import_package(args.package) if args.package else build_package(Path(tmp.name), args.variant)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}")
    for problem in PROBLEMS:
        q, k, v = (t.detach().requires_grad_(True) for t in make_inputs(problem, seed=1))
        do = torch.randn_like(q)
        print(f"\n{problem.label}")
        print("  " + str(pkg.explain(q, k, v, causal=problem.causal)).replace("\n", "\n  "))
        rows = check_rows(rows_for(pkg, problem), (q, k, v, do), fp32_grads(problem, q, k, v, do))
        times: dict[str, list[float]] = {label: [] for label in rows}
        for _ in range(args.rounds):
            for label, fn in rows.items():
                times[label].append(time_cuda(lambda fn=fn: fn(q, k, v, do)).median_us)
        cudnn = next((label for label in ("SDPA cuDNN", "SDPA cuDNN (k/v expanded)") if times.get(label)), None)
        base = statistics.median(times[cudnn]) if cudnn else None
        print(f"  {'fwd + bwd':<36} {'median us':>10} {'min':>9} {'max':>9}  speed vs {cudnn or '-'}")
        for label, ts in times.items():
            med = statistics.median(ts)
            ratio = f"{base / med:.3f}x" if base else "-"
            print(f"  {label:<36} {med:10.1f} {min(ts):9.1f} {max(ts):9.1f}  {ratio}")
        del q, k, v, do
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
