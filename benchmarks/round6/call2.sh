#!/bin/bash
# Session 20, GPU call 2 (no FA4): issue 37's steps D (64-bit descriptor adds), D2 (D, but D256's Q.K keeps
# the low-word add), E (D2/D3 + no O zeroing: an item's first P.V writes O with scale-d 0), against K0 (HEAD).
# The checkout's kernel sources are E's, so the GPU tests check E.
export PYTHONPATH=$PWD:$PYTHONPATH
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
ab() { timeout 75 python3 benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab2.jsonl --cubins K0=.ab/K0 "$@" 2>&1 | grep -v "Warning\|relative error" | tail -12; }
ab --cubins D2=.ab/D2 --cubins E=.ab/E --shape 8,16,2048,128 $V
ab --cubins D=.ab/D --cubins D2=.ab/D2 --cubins E=.ab/E --shape 2,16,3000,256 attn_fwd_wgmma_d256_fp16_m128n80_s2_sw128_r24_ov_pp
ab --cubins E=.ab/E --shape 1,32,16384,128 --hkv 8 attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal
ab --cubins E=.ab/E --shape 16,16,2048,64 attn_fwd_wgmma_d64_fp16_m192n128_s2_sw128_r32_ov_pp
ab --cubins E=.ab/E --shape 4,32,8192,128 attn_fwd_wgmma_d128_e4m3_m128n128_s2_sw128_r24_ov_pp
ab --cubins E=.ab/E --shape 16,32,4096,128 --hkv 8 --lengths uniform:64 attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_packed
timeout 60 ncu --clock-control none --nvtx --nvtx-include "ours/" --launch-count 1 --metrics smsp__inst_executed.sum \
  python3 benchmarks/limiter_run.py $V --shape 8,16,2048,128 --runs 1 --cubin .ab/E/$V.cubin 2>&1 | grep inst_executed
timeout 170 python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_wgmma_kernel.py tests/gpu/test_packed_kernel.py \
  -k "match or fewer or empty or zero" > $OUT/tests_E.txt 2>&1; echo "tests E rc $?"; tail -4 $OUT/tests_E.txt
