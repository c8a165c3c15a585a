#!/bin/bash
# Session 26, call 4 (one H200, FA4 not needed): branch packed-r2ur (issue 37: no R2UR in the persistent packed loops;
# items handed to the consumers through shared memory) -- its GPU tests incl. the sanitizer cases, then each changed
# persistent packed variant against main's cubin (.ab/main, built from d0131fc) in the same rounds.
# Written down before: the persistent packed kernels equal or up to ~1% faster (fewer per-item instructions: 137-234).
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/round12}; mkdir -p $OUT
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_packed_kernel.py > $OUT/call4_pytest_packed.txt 2>&1
echo "packed GPU tests: rc $?"; tail -3 $OUT/call4_pytest_packed.txt
L="--cubins main=.ab/main --lengths uniform:64 --hkv 8"
timeout 120 python3 benchmarks/ab_ratio.py --rounds 5 $L --shape 16,32,4096,128 \
  attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_packed \
  attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_causal_packed \
  attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_2p_causal_packed \
  attn_fwd_wgmma_d128_bf16_m64n128_s2_sw128_r24_ov_p_causal_packed > $OUT/call4_ab_d128_causal.txt 2>&1
echo "ab d128 causal rc $?"; grep -v Warning $OUT/call4_ab_d128_causal.txt | tail -14
timeout 60 python3 benchmarks/ab_ratio.py --rounds 5 $L --shape 16,32,4096,128 \
  attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_packed > $OUT/call4_ab_d128.txt 2>&1
echo "ab d128 rc $?"; grep -v Warning $OUT/call4_ab_d128.txt | tail -6
timeout 60 python3 benchmarks/ab_ratio.py --rounds 5 $L --shape 16,32,4096,256 \
  attn_fwd_wgmma_d256_bf16_m128n80_s2_sw128_r24_ov_pp_p_causal_packed > $OUT/call4_ab_d256.txt 2>&1
echo "ab d256 rc $?"; grep -v Warning $OUT/call4_ab_d256.txt | tail -6
timeout 60 python3 benchmarks/ab_ratio.py --rounds 5 $L --shape 16,32,4096,64 \
  attn_fwd_wgmma_d64_fp16_m128n64_s3_sw64_r24_ov_pp_p_causal_packed > $OUT/call4_ab_d64.txt 2>&1
echo "ab d64 rc $?"; grep -v Warning $OUT/call4_ab_d64.txt | tail -6
