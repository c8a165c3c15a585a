#!/bin/bash
# Session 23, call 5: issue 40. The wgmma backward: a third ring slot with the producer (s3_p) and the dQ writer
# warps (DQ_WRITER, _pw): checks, GPU tests, timing against SDPA's backward beside the cp.async loop and the
# two-slot producer (same rounds), and an ncu profile.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 200 python3 benchmarks/bwd_mma_check.py --quick --template attn_bwd_wgmma --no-time > $OUT/check.txt 2>&1
echo "check rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAIL)" $OUT/check.txt | head; grep -vE "^(ok|FAIL|skip)|Warning" $OUT/check.txt | tail -2
grep -E "^ok" $OUT/check.txt | grep -c "_p\b\|_p_causal\|_p " ; grep -E "^ok" $OUT/check.txt | grep -E "_p( |_causal)" | head -3
timeout 300 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma \
  --variants m64n128_s2 m64n128_s2_p m64n128_s3_p m64n128_s2_pw m128n128_s2 m128n64_s3_p m64n64_s3_pw m64n64_s3_p > $OUT/time.txt 2>&1
echo "time rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time.txt | grep -E "^  (attn|sdpa|FAIL)" | grep -v "registers\|backward node"
timeout 200 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 1,32,16384,128 --hkv 8 \
  --causal --variants m64n128_s2 m64n128_s3_p m64n128_s2_pw > $OUT/time_causal.txt 2>&1
echo "time causal rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_causal.txt | grep -E "^  (attn|sdpa|FAIL)" | grep -v "registers\|backward node"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_bwd_wgmma_kernel.py > $OUT/pytest_bwd.txt 2>&1
echo "pytest bwd rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|E  )" $OUT/pytest_bwd.txt | head -8; tail -1 $OUT/pytest_bwd.txt
V=attn_bwd_wgmma_d128_bf16_m64n128_s2_pw
timeout 150 ncu --clock-control none --kernel-name regex:"^${V}\$" --launch-count 1 --set full --import-source yes \
  -o $OUT/prof python3 benchmarks/bwd_profile_run.py $V --lineinfo > $OUT/ncu_log.txt 2>&1
echo "ncu rc $? ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/ncu_log.txt
ncu --import $OUT/prof.ncu-rep --page details > $OUT/prof_details.txt 2>&1
grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy" $OUT/prof_details.txt | head -6
ncu --import $OUT/prof.ncu-rep --page source --csv --print-source sass > $OUT/prof_source.csv 2>&1; echo "source rc $?"
