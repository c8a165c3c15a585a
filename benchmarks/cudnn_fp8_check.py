"""GPU smoke check of the cuDNN FP8 attention baseline (tuner.runtime.cudnn_fp8): random e4m3 inputs quantised
with one scale per tensor (cuDNN takes scalar descales; ours are [B, Hkv], filled with that one value),
cuDNN's output against an fp32 reference on the dequantised inputs (sampled query rows), and its time back to
back (tuner.runtime.timing.time_call: L2 flushed before each call) as TFLOP/s, 4*B*H*Sq*Sk*D (half if causal).

On the GPU machine, in the project root, carrying [".gpu", ".cudnn"] (benchmarks/cudnn_fp8/README.md):
    source .gpu/setup.sh && source benchmarks/cudnn_fp8/install.sh && export PYTHONPATH=$PWD:$PYTHONPATH \
      && python3 benchmarks/cudnn_fp8_check.py
Exit status: 0 all cases ran and matched, 1 a case failed or mismatched, 2 cudnn does not import.
"""

from __future__ import annotations

import argparse
import sys

import torch

CASES = (  # name, B, H, Hkv, S, D, causal
    ("B4 H32 S8192 D128", 4, 32, 32, 8192, 128, False),
    ("B1 H32 Hkv8 S16384 D128 causal", 1, 32, 8, 16384, 128, True),
)
E4M3 = torch.float8_e4m3fn
TOLERANCE = 0.1  # relative RMS error: e4m3 inputs, P and O (3 mantissa bits) give a few percent


def quantised(shape: tuple[int, ...], heads_kv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp8 tensor [B, H, S, D] laid out [B, S, H, D], its fp32 value, its descale [B, Hkv] all equal)."""
    b, s, h, d = shape
    x = torch.randn(b, s, h, d, device="cuda")
    descale = x.abs().max() / 448.0
    x8 = (x / descale).to(E4M3).transpose(1, 2)
    return x8, x8.float() * descale, descale.reshape(1, 1).expand(b, heads_kv).contiguous()


def reference_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, causal: bool,
                   scale: float) -> torch.Tensor:
    """fp32 attention of query rows `rows` (bottom-right causal), GQA by repeating k, v; [B, H, len(rows), D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q[:, :, rows], k.transpose(2, 3)) * scale
    if causal:
        keys = torch.arange(k.shape[2], device=q.device)
        shift = k.shape[2] - q.shape[2]
        scores.masked_fill_(keys[None, :] > rows[:, None] + shift, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def run_case(name: str, b: int, h: int, hkv: int, s: int, d: int, causal: bool, sampled: int) -> bool:
    from tuner.runtime.cudnn_fp8 import build_cudnn_fp8
    from tuner.runtime.timing import time_call

    torch.manual_seed(0)
    (q, q32, dq), (k, k32, dk), (v, v32, dv) = (quantised((b, s, heads, d), hkv) for heads in (h, hkv, hkv))
    scale = d ** -0.5
    built = build_cudnn_fp8(q, k, v, (dq, dk, dv), causal, scale)
    if isinstance(built, str):
        print(f"{name}: no cuDNN FP8 baseline: {built}")
        return False
    out = built.call().float()
    torch.cuda.synchronize()
    rows = torch.randperm(s, device="cuda")[:sampled].sort().values
    ref = reference_rows(q32, k32, v32, rows, causal, scale)
    got = out[:, :, rows]
    rel = ((got - ref).norm() / ref.norm()).item()
    worst = (got - ref).abs().max().item()
    finite = bool(torch.isfinite(got).all())
    del q32, k32, v32, ref, got, out
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    timing = time_call(built.call)
    line = (f"{name}: cuDNN writes {built.out_dtype}; {sampled} rows vs fp32: rel RMS {rel:.4f}, max abs "
            f"{worst:.4f}; {timing.median_us:.1f} us ({flops / timing.median_us / 1e6:.1f} TFLOP/s)")
    if built.graph_call is not built.call:
        graph = time_call(built.graph_call)
        line += f"; graph alone {graph.median_us:.1f} us ({flops / graph.median_us / 1e6:.1f} TFLOP/s)"
    ok = finite and rel < TOLERANCE
    print(line + ("" if ok else f"  MISMATCH (tolerance {TOLERANCE}, finite {finite})"))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256, help="query rows compared per case (default 256)")
    args = parser.parse_args()
    try:
        import cudnn
    except Exception as exc:  # noqa: BLE001 — not installed, or its library does not load
        print(f"cudnn_fp8_check: the cuDNN frontend does not import ({type(exc).__name__}: {exc}); "
              "carry .cudnn and source benchmarks/cudnn_fp8/install.sh (benchmarks/cudnn_fp8/README.md)")
        return 2
    major, minor = torch.cuda.get_device_capability()
    print(f"{torch.cuda.get_device_name()} (sm{major}{minor}), torch {torch.__version__}, cuDNN "
          f"{cudnn.backend_version()}, frontend {cudnn.__version__}")
    results = [run_case(*case, sampled=args.rows) for case in CASES]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
