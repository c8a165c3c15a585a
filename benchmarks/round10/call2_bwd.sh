#!/bin/bash
# Session 24, call 2: issue 40. The tiled-dQ backward (_bulk_pw) timed beside FlashAttention-4's backward and SDPA's
# cuDNN and flash backward in the same rounds (first same-round FA4 figure for it), at the three shapes; an
# ncu profile of the D128 winner with source counters.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 170 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 8,16,2048,128 --rounds 5 \
  --variants m64n128_s2_bulk_pw m64n128_s3_bulk_pw m64n128_s1_bulk_pw > $OUT/time_d128.txt 2>&1
echo "d128 rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_d128.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
timeout 150 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 1,32,16384,128 --hkv 8 \
  --causal --rounds 3 --variants m64n128_s2_bulk_pw m64n128_s3_bulk_pw > $OUT/time_causal.txt 2>&1
echo "causal rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_causal.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
timeout 150 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 16,16,2048,64 --rounds 5 \
  --variants m128n128_s2 m64n64_s2_bulk_pw m64n64_s3_bulk_pw > $OUT/time_d64.txt 2>&1
echo "d64 rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_d64.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
V=attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk_pw
bash benchmarks/bwd_ncu_profile.sh $V 120
echo "ncu rc $? ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/ncu_log.txt
grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Registers Per" $OUT/prof_details.txt | head -8
