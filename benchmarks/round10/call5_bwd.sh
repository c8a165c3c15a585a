#!/bin/bash
# Session 24, call 5: issue 40. Step C (the warpgroup index broadcast: descriptors on the uniform datapath), checked,
# GPU tests, timed beside main-before-A, A+B cubins, FA4 and SDPA in the same rounds; ncu of the new D128 kernel.
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
    vs = [v for v in feasible_space("attn_bwd_wgmma", p, profile) if v.params.get("DQ_WRITER")]
    for c in check_backward(p, vs, profile):
        total += 1; bad += not c.ok
        print(c.line(p.label))
print(f"writer checks: {total - bad}/{total} ok")
PY
echo "check rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "FAIL|writer checks" $OUT/check_tiled.txt | head -8
timeout 120 python3 benchmarks/bwd_mma_check.py --quick --template attn_bwd_wgmma --no-time > $OUT/check.txt 2>&1
echo "quick rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAIL)" $OUT/check.txt | head -5; grep -vE "^(ok|FAIL|skip)|Warning" $OUT/check.txt | tail -1
C="--cubins main=.ab/main --cubins ab=.ab/ab"
timeout 150 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 8,16,2048,128 --rounds 7 \
  --variants m64n128_s2_bulk_pw $C > $OUT/time_d128.txt 2>&1
echo "d128 rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_d128.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
timeout 150 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 1,32,16384,128 --hkv 8 \
  --causal --rounds 3 --variants m64n128_s2_bulk_pw $C > $OUT/time_causal.txt 2>&1
echo "causal rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_causal.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
timeout 120 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 16,16,2048,64 --rounds 5 \
  --variants m64n64_s2_bulk_pw m128n128_s2 $C > $OUT/time_d64.txt 2>&1
echo "d64 rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_d64.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_bwd_wgmma_kernel.py > $OUT/pytest_bwd.txt 2>&1
echo "pytest bwd rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|E  )" $OUT/pytest_bwd.txt | head -8; tail -1 $OUT/pytest_bwd.txt
V=attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk_pw
timeout 100 ncu --clock-control none --kernel-name regex:"^${V}\$" --launch-count 1 --set full --import-source yes \
  -o $OUT/prof python3 benchmarks/bwd_profile_run.py $V --lineinfo > $OUT/ncu_log.txt 2>&1
echo "ncu rc $? ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/ncu_log.txt
ncu --import $OUT/prof.ncu-rep --page details > $OUT/prof_details.txt 2>&1
grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Compute \(SM\) Throughput" $OUT/prof_details.txt | head -6
ncu --import $OUT/prof.ncu-rep --page source --csv --print-source sass > $OUT/prof_source.csv 2>&1; gzip -f $OUT/prof_source.csv; rm -f $OUT/prof.ncu-rep
