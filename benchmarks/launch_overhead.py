"""Host time of one kernel launch, piece by piece (an exported call's fast path is mostly this).

    python benchmarks/launch_overhead.py [VARIANT]

Builds one variant, then times on tiny inputs (B1 H1 S16 D64, new tensors each call, short batches
after a synchronize so the host is measured): the whole launch_if_fit, torch.empty_like, the stream
lookup, the parameter packing and the bare driver launch, each as the median of 25 batches of 200.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem
from tuner.profiles import resolve_profile
from tuner.runtime.build import build
from tuner.runtime.driver import cuda_driver
from tuner.runtime.verify import make_inputs


def per_call_us(fn, n: int = 200, batches: int = 25) -> float:
    means = []
    for _ in range(batches):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(n):
            fn(i)
        means.append((time.perf_counter() - start) / n * 1e6)
    torch.cuda.synchronize()
    return statistics.median(means)


def main() -> None:
    cuda_driver(0)
    name = sys.argv[1] if len(sys.argv) > 1 else "attn_fwd_wgmma_d64_fp16_m128n128_s2_sw128_r32_ov_pp"
    built = build(parse_variant_name(name), resolve_profile("auto").nvcc_arch)
    kernel = built.load()
    pool = [make_inputs(Problem(1, 1, 16, 16, 64), seed=s) for s in range(16)]
    outs = [torch.empty_like(q) for q, _, _ in pool]
    for i in range(300):
        q, k, v = pool[i % 16]
        assert kernel.launch_if_fit(q, k, v, outs[i % 16])
    dk = kernel._kernel
    args = None

    def capture(*a, **_k):
        nonlocal args
        args = a

    real, dk.launch = dk.launch, capture
    kernel.launch_if_fit(*pool[0], outs[0])
    dk.launch = real
    grid, block, params, smem, stream = args
    rows = {
        "launch_if_fit (checks cached, maps, pack, launch)": lambda i: kernel.launch_if_fit(*pool[i % 16], outs[i % 16]),
        "torch.empty_like(q)": lambda i: torch.empty_like(pool[i % 16][0]),
        "stream lookup": lambda i: kernel._stream(0),
        "Struct.pack_into": lambda i: dk._struct.pack_into(dk._params, 0, *params),
        "DriverKernel.launch (lock, pack, cuLaunchKernel)": lambda i: dk.launch(grid, block, params, smem, stream),
        "bare cuLaunchKernel (ctypes)": lambda i: dk._launch(dk._fn, grid[0], grid[1], grid[2], block[0], block[1],
                                                             block[2], smem, stream, None, dk._extra_ptr),
    }
    import pycuda.driver as drv
    from pycuda._pvt_struct import pack

    module = drv.module_from_buffer(built.compiled.cubin)  # the same cubin through PyCUDA, for comparison
    pyfn = module.get_function(built.entry)
    if smem > 48 * 1024:
        pyfn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    rows["PyCUDA _launch_kernel (legacy stream; before)"] = lambda i: pyfn._launch_kernel(
        grid, block, pack(kernel._format, *params), smem, None)
    print(f"{torch.cuda.get_device_name(0)}, {name}")
    for label, fn in rows.items():
        print(f"  {label:52s} {per_call_us(fn):7.2f} us per call", flush=True)


if __name__ == "__main__":
    main()
