#!/bin/bash
# Session 22, GPU call 2 (FA4 installed): issue 37's steps T (row max/sum in 4 partials), U (FA4's order: P_{j-1} V_{j-1}
# waited after S_j's row max, O rescaled and P packed among the exp2s) and U3 (U with O rescaled under Q K_j^T, FA3's
# place) against S (session 21's kernel) and FA4, in the same 5 rounds. Each cubin is verified before it is timed.
export PYTHONPATH=$PWD:$PYTHONPATH
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
C=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal
ab() { timeout 110 python3 benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab.jsonl --cubins S=.ab/S5 --cubins T=.ab/T --cubins U=.ab/U --cubins U3=.ab/U3 "$@" 2>&1 | grep -v "Warning\|relative error" | tail -9; }
ab --shape 8,16,2048,128 $V
ab --shape 1,32,16384,128 --hkv 8 $C
ab --shape 16,32,4096,128 --hkv 8 --lengths uniform:64 ${C}_packed
ab --shape 8,16,2048,128 attn_fwd_wgmma_d128_e4m3_m128n128_s2_sw128_r24_ov_pp
ab --shape 2,16,3000,256 attn_fwd_wgmma_d256_fp16_m128n80_s2_sw128_r24_ov_pp
