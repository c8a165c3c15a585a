#!/bin/bash
# Session 19, last GPU call (no FA4): the Hopper kernel with the epilogue store and unsigned ring indices (U,
# the checkout) verified by the GPU tests and timed against the rotated loop (K); then issue 39's sm_80
# rebuild check against its revision-before cubins, as far as the time allows.
timeout 100 python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_wgmma_kernel.py tests/gpu/test_packed_kernel.py \
  -k "match or fewer" > $OUT/tests.txt 2>&1; echo "tests rc $?"; tail -4 $OUT/tests.txt
V=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp
run() { timeout 60 python benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab_U.jsonl --cubins K=.ab/K "$@" 2>&1 | grep -v "Warning\|relative error" | sed -E 's/ +([0-9.]+) us +([0-9.]+) TFLOP\/s/ \1us/; s/\(J [0-9.]+x\)//g; s/[0-9.]+x sdpa_flash//'; }
run --shape 8,16,2048,128 attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
run --shape 1,32,16384,128 --hkv 8 ${V}_causal
run --shape 2,16,3000,256 attn_fwd_wgmma_d256_fp16_m128n80_s2_sw128_r24_ov_pp
timeout 110 python3 benchmarks/sm80_rebuild_check.py --old .ab/old39 --rounds 3 --json $OUT/sm80.jsonl > $OUT/sm80.txt 2>&1; echo "sm80 rc $?"; grep -v Warning $OUT/sm80.txt | tail -40
