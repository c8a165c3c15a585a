#!/bin/bash
# Session 25, call 3 (FA4 installed): issue 40's BLOCK_M 80 backward at D128 (helper branch bwd-bm80): the template's
# GPU tests (BLOCK_M 80 edge lengths, named tilings), the quick gradient checks, every DQ_WRITER variant's checks,
# then timed beside m64n128_s2_bulk_pw, FA4's backward and SDPA in the same 7 rounds.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_bwd_wgmma_kernel.py > $OUT/pytest_bwd.txt 2>&1
echo "pytest bwd rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/pytest_bwd.txt | head -8; tail -1 $OUT/pytest_bwd.txt
timeout 120 python3 benchmarks/bwd_mma_check.py --quick --template attn_bwd_wgmma --no-time > $OUT/check.txt 2>&1
echo "quick rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAIL)" $OUT/check.txt | head -5; grep -c "m80n128" $OUT/check.txt; grep -vE "^(ok|FAIL|skip)|Warning" $OUT/check.txt | tail -1
timeout 120 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 8,16,2048,128 --rounds 7 \
  --variants m64n128_s2_bulk_pw m80n128_s2_bulk_pw > $OUT/time_d128.txt 2>&1
echo "d128 rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_d128.txt | grep -E "^  (kernel|attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
timeout 90 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 4,32,4096,128 --hkv 8 --rounds 5 \
  --variants m64n128_s2_bulk_pw m80n128_s2_bulk_pw > $OUT/time_gqa.txt 2>&1
echo "gqa rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_gqa.txt | grep -E "^  (kernel|attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
V=attn_bwd_wgmma_d128_bf16_m80n128_s2_bulk_pw
bash benchmarks/bwd_ncu_profile.sh $V 100
echo "ncu rc $? ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/ncu_log.txt
grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Compute \(SM\) Throughput|Executed Instructions  " $OUT/prof_details.txt | head -6
