"""The decode template's instruction budget on the GPU (issue 37 item 3): the same decode variants built from
older template revisions (--old LABEL=DIR, repeatable: cubins from build_cubins.py) and from this checkout, timed
interleaved in one process with SDPA, each verified against the fp32 reference first.

Cases: the bf16 B8 winner at Sk 8192 and at a short Sk 1024, the same on a ragged batch (per-row lengths: the
partial tile's mask and the last tile's zeroed V rows run), the paged-16 winner on 16-row pages, the FP8-cache
winner, and a causal Sq 4 step (the mask's row positions). Ratios are medians of per-round ratios: old / new > 1
means the new build is faster.

    PYTHONPATH=/path/to/old/checkout python benchmarks/build_cubins.py --out .ab/decode_main \\
        $(python benchmarks/round11/decode_ab.py --list)
    python benchmarks/round11/decode_ab.py --old main=.ab/decode_main [--old LABEL=DIR ...] [--rounds 7] \\
        [--json decode_ab.jsonl]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any, Callable

from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem

B8 = "attn_decode_d128_bf16_m16n64_w2_sp2_s2"
STEP = Problem(8, 32, 1, 8192, 128, dtype="bf16", heads_kv=8)
CASES: list[tuple[str, str, Problem, int]] = [  # (label, variant, problem, page size: 0 dense)
    ("Sk8192", B8, STEP, 0),
    ("Sk1024", B8, dataclasses.replace(STEP, seq_k=1024), 0),
    ("Sk8192 ragged uniform:1024", B8, dataclasses.replace(STEP, lengths="uniform:1024"), 0),
    ("Sk8192 page16", "attn_decode_d128_bf16_m32n64_w4_sp8_s2", STEP, 16),
    ("Sk8192 FP8 cache", "attn_decode_d128_bf16_kv_e4m3_m16n128_w4_sp2_s2",
     dataclasses.replace(STEP, dtype="bf16_kv_e4m3"), 0),
    ("Sq4 Sk8192 causal", "attn_decode_d128_bf16_m16n64_w2_sp2_s2_causal",
     dataclasses.replace(STEP, seq_q=4, causal=True), 0),
]


def _inputs(p: Problem) -> tuple[Any, Any, Any, Any, Any]:
    """q, k, v, an FP8 cache's Descales (else None) and the expected output."""
    from tuner.runtime.verify import expected_output, fp8_inputs, make_inputs

    ds = None
    if p.fp8:
        q, k, v, ds = fp8_inputs(p, seed=0)
    else:
        q, k, v = make_inputs(p, seed=0)
    lengths = p.key_lengths() if p.ragged else None
    return q, k, v, ds, expected_output(p, q, k, v, key_lengths=lengths, descales=ds)


def _call(kernel: Any, p: Problem, page: int, q: Any, k: Any, v: Any, descales: Any, expected: Any,
          label: str) -> Callable[[], None]:
    """The kernel's unchecked launch on the case's layout, after one checked launch verified."""
    import torch

    from tuner.runtime.verify import TOLERANCE, empty_output, paged_inputs, ragged_seq_lens

    out = empty_output(q)
    lens = ragged_seq_lens(p, "cuda")
    if page:
        paged = paged_inputs(dataclasses.replace(p, layout=f"paged{page}"), k, v, seed=page)
        kc, vc, table, lens = paged["k_cache"], paged["v_cache"], paged["block_table"], paged["seq_lens"]
        kernel.paged(q, kc, vc, out, table, lens, descales=descales)
        call = lambda: kernel.paged(q, kc, vc, out, table, lens, check=False, descales=descales)  # noqa: E731
    else:
        kernel(q, k, v, out, seq_lens=lens, descales=descales)
        call = lambda: kernel.launch_unchecked(q, k, v, out, None, None, lens, descales)  # noqa: E731
    torch.cuda.synchronize()
    err = expected.error(out)
    assert err < TOLERANCE[p.dtype], f"{label}: relative error {err:.2e}"
    print(f"  {label}: relative error {err:.2e}", flush=True)
    return call


def run_case(label: str, name: str, p: Problem, page: int, olds: dict[str, Path], rounds: int,
             l2_bytes: int) -> dict[str, Any]:
    from tuner.runtime.baselines import available_baselines
    from tuner.runtime.build import build, launch_shape
    from tuner.runtime.shipped.launcher import AttentionKernel
    from tuner.runtime.timing import interleaved_rounds, per_round_ratio, time_cuda

    print(f"{label}: {name}", flush=True)
    q, k, v, ds, expected = _inputs(p)
    descales = (None, ds.k, ds.v) if ds is not None else None
    var = parse_variant_name(name)
    kernels = {"new": build(var, "sm_90a").load()}
    for tag, folder in olds.items():
        kernels[tag] = AttentionKernel((folder / f"{name}.cubin").read_bytes(), name, launch_shape(var), 0)
    calls: dict[str, Callable[[], Any]] = {}
    for tag, kernel in kernels.items():
        call = _call(kernel, p, page, q, k, v, descales, expected, f"{name}@{tag}")
        calls[tag] = lambda call=call: time_cuda(call, l2_bytes=l2_bytes)
    if not page:  # SDPA reads a dense cache (a ragged batch as a mask; an FP8 cache dequantised beforehand)
        for b in available_baselines(p, q, k, v, fa4=False, descales=ds):
            calls[b.name] = lambda b=b: b.time(l2_bytes=l2_bytes)
    times = interleaved_rounds(calls, rounds)
    res = {"case": label, "variant": name, "problem": p.label, "page": page, "rounds": rounds,
           "us": {n: statistics.median(t) for n, t in times.items()},
           "old_over_new": {tag: per_round_ratio(times[tag], times["new"]) for tag in olds},
           "baseline_over_new": {n: per_round_ratio(t, times["new"]) for n, t in times.items() if n not in kernels}}
    print(f"  new {res['us']['new']:.1f} us"
          + "".join(f", {tag} {res['us'][tag]:.1f} us ({r:.3f}x)" for tag, r in res["old_over_new"].items())
          + "".join(f", {n} {res['us'][n]:.1f} us ({r:.3f}x)" for n, r in res["baseline_over_new"].items()),
          flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", action="append", default=[], metavar="LABEL=DIR",
                    help="<variant>.cubin built from an older revision (build_cubins.py); repeatable")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None, help="append each case's result as one JSON line")
    ap.add_argument("--list", action="store_true", help="print the variants (for build_cubins.py) and stop")
    args = ap.parse_args()
    if args.list:
        print(" ".join(sorted({name for _, name, _, _ in CASES})))
        return
    olds = {label: Path(folder) for label, _, folder in (o.partition("=") for o in args.old)}
    if not olds or not all(olds):
        raise SystemExit("--old LABEL=DIR is required (cubins from benchmarks/build_cubins.py in an older checkout)")
    import torch

    from tuner.profiles import resolve_profile
    from tuner.runtime.driver import cuda_driver

    cuda_driver(0)
    l2 = resolve_profile("auto").l2_bytes
    rows = [run_case(label, name, p, page, olds, args.rounds, l2) for label, name, p, page in CASES]
    print(f"\n{torch.cuda.get_device_name(0)}, {args.rounds} interleaved rounds, L2 flushed before each repetition\n")
    print("| case | variant | new µs | " + " | ".join(f"{t} µs | {t} / new" for t in olds)
          + " | SDPA best µs | SDPA best / new |")
    print("|---|---|---|" + "---|---|" * len(olds) + "---|---|")
    for r in rows:
        base = min(r["baseline_over_new"], key=lambda n: r["us"][n], default=None)
        sdpa = f"{r['us'][base]:.1f} | {r['baseline_over_new'][base]:.3f}x" if base else "- | -"
        print(f"| {r['case']} | {r['variant'][12:]} | {r['us']['new']:.1f} | "
              + " | ".join(f"{r['us'][t]:.1f} | {r['old_over_new'][t]:.3f}x" for t in olds) + f" | {sdpa} |")
    if args.json:
        with args.json.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
