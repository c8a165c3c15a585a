#!/bin/bash
# Session 22, GPU call 10 (no FA4): the per-item code cut (helper's branch per-item, PI) against main's kernel (V):
# the checkout's kernel is PI's, so the GPU tests check PI; then PI against V in the same rounds.
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 130 python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_wgmma_kernel.py tests/gpu/test_packed_kernel.py \
  -k "match or fewer or transpose" > $OUT/tests_PI.txt 2>&1; echo "tests PI rc $?: $(tail -1 $OUT/tests_PI.txt)"; grep -E "^FAILED|Error" $OUT/tests_PI.txt | head -8
C=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal
ab() { timeout 60 python3 benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab.jsonl --cubins V=.ab/V --cubins PI=.ab/PI "$@" 2>&1 | grep -v "Warning\|relative error" | tail -4; }
ab --shape 16,32,4096,128 --hkv 8 --lengths uniform:64 ${C}_packed
ab --shape 8,16,2048,128 attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
