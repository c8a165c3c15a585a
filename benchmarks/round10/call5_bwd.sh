#!/bin/bash
# Session 24, call 5: issue 40. Step C (the warpgroup index broadcast: descriptors on the uniform datapath), checked,
# GPU tests, timed beside main-before-A, A+B cubins, FA4 and SDPA in the same rounds; ncu of the new D128 kernel.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 150 python3 benchmarks/bwd_writer_checks.py > $OUT/check_tiled.txt 2>&1
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
bash benchmarks/bwd_ncu_profile.sh $V 100
echo "ncu rc $? ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/ncu_log.txt
grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Compute \(SM\) Throughput" $OUT/prof_details.txt | head -6
