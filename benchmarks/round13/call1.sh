#!/bin/bash
# Session 27, call 1 (one H200, FA4 not needed): the packed persistent item mailbox (session 26's packed-r2ur) with
# every consumer thread arriving on q_empty -- its GPU tests incl. racecheck (session 26: hazards between the lanes'
# mailbox reads and the loader's next post), then the changed variants against main's cubins (.ab/main, 18addb9).
# Written down before: racecheck clean; the timings as session 26's branch (D256 ov ~1.06x, D64 n64 ~1.07x, one
# consumer ~1.05x, the D128 two-consumer rows ~1.007x): one more arrive per thread per item changes nothing measurable.
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/round13}; mkdir -p $OUT
timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_packed_kernel.py > $OUT/call1_pytest_packed.txt 2>&1
echo "packed GPU tests: rc $?"; tail -3 $OUT/call1_pytest_packed.txt
grep -m5 -i "hazard\|error" $OUT/call1_pytest_packed.txt | cut -c1-300
L="--cubins main=.ab/main --lengths uniform:64 --hkv 8"
timeout 120 python3 benchmarks/ab_ratio.py --rounds 5 $L --shape 16,32,4096,128 \
  attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_packed \
  attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_causal_packed \
  attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_2p_causal_packed \
  attn_fwd_wgmma_d128_bf16_m64n128_s2_sw128_r24_ov_p_causal_packed > $OUT/call1_ab_d128_causal.txt 2>&1
echo "ab d128 causal rc $?"; grep -v Warning $OUT/call1_ab_d128_causal.txt | tail -14
timeout 60 python3 benchmarks/ab_ratio.py --rounds 5 $L --shape 16,32,4096,256 \
  attn_fwd_wgmma_d256_bf16_m128n80_s2_sw128_r24_ov_pp_p_causal_packed > $OUT/call1_ab_d256.txt 2>&1
echo "ab d256 rc $?"; grep -v Warning $OUT/call1_ab_d256.txt | tail -6
timeout 60 python3 benchmarks/ab_ratio.py --rounds 5 $L --shape 16,32,4096,64 \
  attn_fwd_wgmma_d64_fp16_m128n64_s3_sw64_r24_ov_pp_p_causal_packed > $OUT/call1_ab_d64.txt 2>&1
echo "ab d64 rc $?"; grep -v Warning $OUT/call1_ab_d64.txt | tail -6
