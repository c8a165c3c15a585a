#!/bin/bash
# Session 23, call 9: the tiled dQ accumulator (DQ_WRITER with DQ_BULK, _bulk_pw: 64x64 blocks, one bulk reduction
# per block by the writer warp): gradients on every dense backward test problem (odd lengths, S = 1, GQA, Sq != Sk,
# BSHD) for the tiled variants, then timed beside _s2_pw and cuDNN in the same rounds.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 150 python3 - > $OUT/check_tiled.txt 2>&1 <<'PY'
from tests.gpu.reference_checks import DENSE_BACKWARD_PROBLEMS
from tuner.kernels.feasibility import feasible_space
from tuner.profiles import resolve_profile
from tuner.runtime.backward_verify import check_backward
profile = resolve_profile("auto")
bad = total = 0
for p in DENSE_BACKWARD_PROBLEMS:
    vs = [v for v in feasible_space("attn_bwd_wgmma", p, profile) if v.params.get("DQ_BULK") and v.params.get("DQ_WRITER")]
    for c in check_backward(p, vs[:3], profile):
        total += 1; bad += not c.ok
        print(c.line(p.label))
print(f"tiled checks: {total - bad}/{total} ok")
PY
echo "check rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "FAIL|tiled checks" $OUT/check_tiled.txt | head -8
timeout 120 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 8,16,2048,128 --rounds 5 \
  --variants m64n128_s2_pw m64n128_s2_bulk_pw > $OUT/time.txt 2>&1
echo "time rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time.txt | grep -E "^  (attn|sdpa|FAIL)" | grep -v "registers\|backward node"
