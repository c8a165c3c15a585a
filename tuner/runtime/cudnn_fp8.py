"""cuDNN's FP8 attention forward (`sdpa_fp8` of the cuDNN frontend: package nvidia-cudnn-frontend, module
`cudnn`) as a baseline for the e4m3 problems, built once (graph, plan, workspace) so the timed call only
executes. Optional: where `cudnn` does not import, or cuDNN does not take the problem, the functions here
return the reason as a string instead.

What cuDNN's FP8 forward takes, read in frontend 1.32.0 (the wheel's binding docstring and python/cudnn,
include/cudnn_frontend/node/sdpa_support_surface.h, test/python/sdpa/fp8.py):
- one float32 descale per tensor (descale_q, _k, _v, _s, scale_s, scale_o: (1, 1, 1, 1) tensors; "regular
  FP8 uses scalar descale factors"): no per-(batch, head) descales. Our descales are [B, Hkv]
  (FlashAttention-3's); the baseline reads element [0, 0] of each. Timing costs the same; compare its
  output only on inputs quantised with one scale per tensor (all entries equal).
- GQA and MQA: any H that is a multiple of Hkv.
- head dim a multiple of 16, at most 256 on Hopper, 128 on Blackwell (and 192 / 128 there).
- causal: a bottom-right causal mask only on Blackwell; on Hopper the top-left one, which is the same mask
  where seq_q == seq_k (so a causal problem with seq_q != seq_k is not taken there).
- output: bf16 only on Blackwell with cuDNN >= 9.13 ("sdpa fp8 forward with HALF/BFLOAT16 output is only
  supported on Blackwell"); on Hopper O is written in FP8 (times scale_o) and the call converts it to bf16
  (copy and descale, two small elementwise kernels, inside the timed call).
The amax outputs (Amax_S, Amax_O) are declared, as in every sample: on Hopper only the cuDNN library's
engines serve sdpa_fp8 either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from tuner.runtime.baseline_log import warnings_logged

CUDNN_FP8 = "cudnn_fp8"  # the baseline's name in the results
MISSING = ("cuDNN frontend (pip package nvidia-cudnn-frontend, module cudnn) is not installed; "
           "benchmarks/cudnn_fp8/README.md says how to carry it to the GPU machine")
FP8_IO = {"float8_e4m3fn": "FP8_E4M3", "float8_e5m2": "FP8_E5M2"}  # torch dtype name -> cudnn.data_type
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
# The graph's tensor uids: the variant pack is keyed by them.
Q, K, V, O, DESCALE_Q, DESCALE_K, DESCALE_V, DESCALE_S, SCALE_S, SCALE_O, AMAX_S, AMAX_O = range(1, 13)
SCALARS = (DESCALE_Q, DESCALE_K, DESCALE_V, DESCALE_S, SCALE_S, SCALE_O)
HEURISTICS = ("A", "FALLBACK")  # cudnn.heur_mode members, as the frontend's FP8 tests ask for plans


@dataclass(frozen=True)
class Geometry:
    """What the graph is declared from: [B, H, S, D] dims and element strides of q, k, v and the output."""

    q: tuple[tuple[int, ...], tuple[int, ...]]
    k: tuple[tuple[int, ...], tuple[int, ...]]
    v: tuple[tuple[int, ...], tuple[int, ...]]
    o: tuple[tuple[int, ...], tuple[int, ...]]
    io: str  # FP8_IO key
    out: str  # "bfloat16", or an FP8_IO key
    causal: bool
    scale: float


@dataclass(frozen=True)
class CudnnFp8:
    """A built cuDNN FP8 forward. `call` runs it and returns the bf16 output `out` ([B, H, Sq, D], written
    in place); `graph_call` runs the cuDNN graph alone (its own output: `out` itself, or the FP8 tensor that
    `call` converts). `out_dtype` is what cuDNN writes ("bfloat16" or the FP8 type)."""

    call: Callable[[], Any]
    graph_call: Callable[[], Any]
    out: Any
    out_dtype: str


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def unsupported_reason(q: Any, k: Any, v: Any, causal: bool, capability: tuple[int, int]) -> Optional[str]:
    """Why cuDNN's FP8 forward does not take this problem on a card of `capability` (None: it should;
    cuDNN has the last word when the graph is built). q [B, H, Sq, D], k and v [B, Hkv, Sk, D]."""
    major, minor = capability
    if major < 9:
        return f"cuDNN's FP8 attention needs Hopper or Blackwell (sm90+); this GPU is sm{major}{minor}"
    if any(t.dim() != 4 for t in (q, k, v)):
        return "cuDNN FP8 attention takes 4-D q, k, v ([B, H, S, D])"
    names = {_dtype_name(t) for t in (q, k, v)}
    if len(names) != 1 or not names <= set(FP8_IO):
        return f"cuDNN FP8 attention takes q, k, v of one FP8 type (float8_e4m3fn or float8_e5m2), not {sorted(names)}"
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "cuDNN FP8 attention needs the head dim contiguous (stride 1)"
    heads, heads_kv = q.shape[1], k.shape[1]
    if v.shape[1] != heads_kv or heads % heads_kv:
        return f"cuDNN FP8 attention needs H ({heads}) a multiple of Hkv ({heads_kv})"
    d_qk, d_v = q.shape[3], v.shape[3]
    largest = 256 if major == 9 else 128
    if d_qk % 16 or d_v % 16 or max(d_qk, d_v) > largest:
        return (f"cuDNN's FP8 forward takes head dims that are multiples of 16 up to {largest} on "
                f"sm{major}{minor}, not {d_qk}/{d_v}")
    if causal and q.shape[2] != k.shape[2] and major < 10:
        return ("cuDNN's FP8 forward has no bottom-right causal mask on Hopper (Blackwell only): a causal "
                "problem needs seq_q == seq_k there")
    return None


def declare_graph(cudnn: Any, geometry: Geometry, handle: Any = None) -> Any:
    """The cuDNN graph of one FP8 attention forward (not yet built): uids as above, inference only (no
    stats), causality as a right bound of 0 (top-left where seq_q == seq_k, which Hopper has; bottom-right
    otherwise, Blackwell only)."""
    dt = cudnn.data_type
    io = getattr(dt, FP8_IO[geometry.io])
    graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT,
                          handle=handle)
    q, k, v = (graph.tensor(uid=uid, dim=dims, stride=strides, data_type=io)
               for uid, (dims, strides) in ((Q, geometry.q), (K, geometry.k), (V, geometry.v)))
    one = ((1, 1, 1, 1), (1, 1, 1, 1))
    scalars = [graph.tensor(uid=uid, dim=one[0], stride=one[1], data_type=dt.FLOAT) for uid in SCALARS]
    kwargs: dict[str, Any] = {"generate_stats": False, "attn_scale": geometry.scale}
    if geometry.causal:
        same = geometry.q[0][2] == geometry.k[0][2]
        kwargs["diagonal_alignment"] = getattr(cudnn.diagonal_alignment, "TOP_LEFT" if same else "BOTTOM_RIGHT")
        kwargs["right_bound"] = 0
    o, _stats, amax_s, amax_o = graph.sdpa_fp8(q, k, v, *scalars, **kwargs)
    out = dt.BFLOAT16 if geometry.out == "bfloat16" else getattr(dt, FP8_IO[geometry.out])
    o.set_uid(O).set_output(True).set_dim(geometry.o[0]).set_stride(geometry.o[1]).set_data_type(out)
    for uid, amax in ((AMAX_S, amax_s), (AMAX_O, amax_o)):
        amax.set_uid(uid).set_output(True).set_dim(one[0]).set_stride(one[1]).set_data_type(dt.FLOAT)
    return graph


def build_graph(cudnn: Any, graph: Any) -> None:
    """Validate, plan and build `graph` (the frontend's own sequence); raises where cuDNN declines it."""
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([getattr(cudnn.heur_mode, mode) for mode in HEURISTICS])
    graph.check_support()
    graph.build_plans()


_handles: dict[tuple[int, int], Any] = {}  # (device, stream) -> cudnn handle, one per process


def _handle(cudnn: Any, torch: Any, device: Any) -> Any:
    """A cuDNN handle on torch's current stream of `device` (kept for the process: handles are not free)."""
    stream = torch.cuda.current_stream(device).cuda_stream
    key = (device.index if device.index is not None else torch.cuda.current_device(), stream)
    if key not in _handles:
        with torch.cuda.device(device):
            handle = cudnn.create_handle()
        cudnn.set_stream(handle, stream)
        _handles[key] = handle
    return _handles[key]


def _scalar(torch: Any, value: Any, device: Any) -> Any:
    """A (1, 1, 1, 1) float32 tensor: element [0, 0] of a [B, Hkv] descale (a view where it can be), or a
    number."""
    if not hasattr(value, "reshape"):
        return torch.full((1, 1, 1, 1), float(value), dtype=torch.float32, device=device)
    return value.detach().reshape(-1)[:1].to(device=device, dtype=torch.float32).reshape(1, 1, 1, 1)


def _import_cudnn() -> Any:
    """The cudnn module, or the reason it does not import (torch first: cudnn opens the libcudnn that torch
    has loaded)."""
    import torch  # noqa: F401

    try:
        import cudnn
    except Exception as exc:  # not installed; or its compiled module, or libcudnn, does not load
        if isinstance(exc, ModuleNotFoundError) and exc.name == "cudnn":
            return MISSING
        return f"cuDNN frontend does not import here: {type(exc).__name__}: {_brief(exc)}"
    return cudnn


def build_cudnn_fp8(q: Any, k: Any, v: Any, descales: Sequence[Any], causal: bool,
                    scale: float | None = None) -> CudnnFp8 | str:
    """cuDNN's FP8 forward on fp8 q [B, H, Sq, D], k, v [B, Hkv, Sk, D] (any strides with the head dim
    contiguous: BHSD or BSHD views), `descales` (descale_q, descale_k, descale_v): [B, Hkv] float32 tensors
    (element [0, 0] is used, see the module) or numbers; softmax `scale` (None: 1/sqrt(D)). Built and run
    once here; returns why not where it cannot be."""
    import torch

    capability = device_capability(q)
    if capability is None:
        return "cuDNN FP8 attention needs CUDA tensors"
    reason = unsupported_reason(q, k, v, causal, capability)
    if reason is not None:
        return reason
    cudnn = _import_cudnn()
    if isinstance(cudnn, str):
        return cudnn
    with warnings_logged(CUDNN_FP8, "build"):
        try:
            return _build(cudnn, torch, q, k, v, descales, causal, scale, capability)
        except Exception as exc:  # a shape, layout or version cuDNN declines: not a baseline for this problem
            return f"cuDNN's FP8 attention does not run this problem: {type(exc).__name__}: {_brief(exc)}"


def _brief(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def device_capability(tensor: Any) -> Optional[tuple[int, int]]:
    """(major, minor) of the CUDA device `tensor` is on; None where it is not on one."""
    if not tensor.is_cuda:
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(tensor.device)
    return major, minor


def _geometry(q: Any, k: Any, v: Any, out: Any, causal: bool, scale: float, out_dtype: str) -> Geometry:
    def layout(t: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(t.shape), tuple(t.stride())

    return Geometry(layout(q), layout(k), layout(v), layout(out), _dtype_name(q), out_dtype, causal, scale)


def _build(cudnn: Any, torch: Any, q: Any, k: Any, v: Any, descales: Sequence[Any], causal: bool,
           scale: float | None, capability: tuple[int, int]) -> CudnnFp8:
    """Builds with bf16 output where cuDNN may write it (Blackwell), else (or where that is declined) with
    FP8 output converted here; raises what the last attempt raised."""
    batch, heads, seq_q, _ = q.shape
    d_v = v.shape[3]
    scale = q.shape[3] ** -0.5 if scale is None else float(scale)
    handle = _handle(cudnn, torch, q.device)
    attempts = (["bfloat16"] if capability[0] >= 10 else []) + [_dtype_name(q)]
    # O laid out [B, Sq, H, D] in memory (the frontend's tests' layout), seen as [B, H, Sq, D].
    out = torch.empty(batch, seq_q, heads, d_v, dtype=torch.bfloat16, device=q.device).transpose(1, 2)
    for attempt, out_dtype in enumerate(attempts):
        written = out if out_dtype == "bfloat16" else torch.empty_like(out, dtype=q.dtype)
        graph = declare_graph(cudnn, _geometry(q, k, v, written, causal, scale, out_dtype), handle)
        try:
            build_graph(cudnn, graph)
        except Exception:
            if attempt == len(attempts) - 1:
                raise
            continue
        break
    scalars = _scalars(torch, descales, q, written is out)
    pack = {Q: q, K: k, V: v, O: written, **scalars,
            AMAX_S: torch.empty(1, 1, 1, 1, device=q.device), AMAX_O: torch.empty(1, 1, 1, 1, device=q.device)}
    workspace = torch.empty(max(graph.get_workspace_size(), 1), dtype=torch.uint8, device=q.device)

    def graph_call() -> Any:
        graph.execute(pack, workspace, handle=handle)
        return written

    call = graph_call if written is out else _converting(graph_call, out, written, scalars[DESCALE_V])
    call()  # fail here, not in the timed loop
    torch.cuda.synchronize(q.device)
    return CudnnFp8(call, graph_call, out, out_dtype)


def _scalars(torch: Any, descales: Sequence[Any], q: Any, bf16_out: bool) -> dict[int, Any]:
    """The six scalar inputs: our descales (per tensor), P quantised over the FP8 range (scale_s = its
    largest value, as the frontend advises: P <= 1), and O scaled into V's FP8 range where O is FP8 (O is a
    convex combination of V's rows, so |O| / descale_v fits)."""
    descale_q, descale_k, descale_v = (_scalar(torch, d, q.device) for d in descales)
    fp8_max = FP8_MAX[_dtype_name(q)]
    one = torch.ones(1, 1, 1, 1, dtype=torch.float32, device=q.device)
    return {DESCALE_Q: descale_q, DESCALE_K: descale_k, DESCALE_V: descale_v,
            DESCALE_S: one / fp8_max, SCALE_S: one * fp8_max,
            SCALE_O: one if bf16_out else torch.reciprocal(descale_v)}


def _converting(graph_call: Callable[[], Any], out: Any, written: Any, descale_o: Any) -> Callable[[], Any]:
    """`graph_call` then its FP8 output converted into bf16 `out` (times descale_o: O = O_fp8 / scale_o)."""
    factor = descale_o.reshape(())

    def call() -> Any:
        graph_call()
        out.copy_(written)
        out.mul_(factor)
        return out

    return call


def cudnn_fp8_baseline(q: Any, k: Any, v: Any, descales: Sequence[Any], causal: bool,
                       scale: float | None = None) -> tuple[str, Callable[[], Any]] | str:
    """(CUDNN_FP8, the call to time) for this problem, or why there is none (build_cudnn_fp8's arguments).
    The call returns the bf16 output; on Hopper it includes the FP8-to-bf16 conversion."""
    built = build_cudnn_fp8(q, k, v, descales, causal, scale)
    return built if isinstance(built, str) else (CUDNN_FP8, built.call)


def cudnn_fp8_output(q: Any, k: Any, v: Any, descales: Sequence[Any], causal: bool,
                     scale: float | None = None) -> Any:
    """cuDNN's bf16 output [B, H, Sq, D] for this problem (built, run once, a copy), to compare against an
    fp32 reference on the dequantised inputs; or why there is none (a string)."""
    built = build_cudnn_fp8(q, k, v, descales, causal, scale)
    if isinstance(built, str):
        return built
    import torch

    result = built.call().clone()
    torch.cuda.synchronize(q.device)
    return result
