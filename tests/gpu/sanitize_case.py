"""Run a few mma variants on tail shapes; executed under compute-sanitizer by the gpu tests."""

import torch

from tuner import runtime
from tuner.compiler import compile_source
from tuner.feasibility import resources
from tuner.problem import Problem
from tuner.runtime import AttentionKernel, LaunchShape
from tuner.space import parse_variant_name
from tuner.templates import render
from tuner.verify import empty_output, make_inputs

CASES = [
    ("attn_fwd_mma_d64_fp16_m64n64_w4_q_rows_xor_s2_qreg", Problem(1, 2, 17, 33, 64)),
    ("attn_fwd_mma_d64_fp16_m64n64_w4_kv2_pad_s3_qsmem_causal", Problem(1, 2, 77, 50, 64, causal=True)),
    ("attn_fwd_mma_d128_bf16_m128n32_w8_kv2_none_s1_qsmem", Problem(2, 2, 130, 1, 128, dtype="bf16", heads_kv=1)),
]

runtime.cuda_driver(0)
arch = "sm_%d%d" % torch.cuda.get_device_capability()
arch = arch + "a" if arch == "sm_90" else arch
for name, problem in CASES:
    variant = parse_variant_name(name)
    res = compile_source(render(variant), name, arch)
    assert res.ok, res.log
    r = resources(variant)
    kernel = AttentionKernel(res.cubin, name, LaunchShape(variant.params["BLOCK_M"], r["threads"], r["smem_bytes"]))
    q, k, v = make_inputs(problem)
    out = empty_output(q)
    lse = torch.empty(problem.batch, problem.heads, problem.seq_q, device="cuda")
    kernel(q, k, v, out, lse)
    torch.cuda.synchronize()
print("sanitize cases ran")
