#!/bin/bash
# Session 22, GPU call 5 (FA4 installed): V = T with the FP8 loop's P V waited for before the exp2s (U3's FP8 order;
# 16-bit loops keep T's rotated order, rescheduled by the softmax's max/exp split): V against T on 16-bit rows (no
# regression) and e4m3; the e4m3 target (B4 H32 S8192 D128, e4m3 against our bf16, fp8_ab.py renders the checkout's V);
# V's GPU tests.
export PYTHONPATH=$PWD:$PYTHONPATH
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
C=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal
t() { local s=$1 name=$2; shift 2; timeout $s "$@" > $OUT/$name.txt 2>&1; echo "$name rc $?: $(grep -E 'passed|failed|error' $OUT/$name.txt | tail -1)"; }
ab() { timeout 80 python3 benchmarks/ab_ratio.py --rounds 7 --json $OUT/ab.jsonl --cubins T=.ab/T --cubins V=.ab/V "$@" 2>&1 | grep -v "Warning\|relative error" | tail -6; }
ab --shape 8,16,2048,128 $V
ab --shape 1,32,16384,128 --hkv 8 $C
ab --shape 8,16,2048,128 attn_fwd_wgmma_d128_e4m3_m128n128_s2_sw128_r24_ov_pp
timeout 150 python3 benchmarks/fp8_ab.py --shape 4,32,8192,128 --rounds 5 --json $OUT/fp8.jsonl attn_fwd_wgmma_d128_e4m3_m128n192_s2_sw64_r24_ov_pp \
  attn_fwd_wgmma_d128_e4m3_m128n128_s2_sw128_r24_ov_pp attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp 2>&1 | grep -v "Warning\|relative error" | tail -9
t 150 tests_V python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_wgmma_kernel.py tests/gpu/test_packed_kernel.py -k "match or fewer or transpose"
