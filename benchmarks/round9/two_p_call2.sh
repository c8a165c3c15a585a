#!/bin/bash
# Session 23, GPU call 2 (FA4 installed): TWO_P (_2p) against the rotated loop, the other three target rows. D64: the
# best measured tile (m192n128, 160 consumer registers: no room for a second P set) and m128n128 with and without.
export PYTHONPATH=$PWD:$PYTHONPATH
C=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp
ab() { timeout 100 python3 benchmarks/ab_ratio.py --rounds 7 --json $OUT/ab.jsonl "$@" 2>&1 | grep -v "Warning\|relative error" | tail -7; }
ab --shape 16,16,2048,64 attn_fwd_wgmma_d64_fp16_m192n128_s2_sw128_r32_ov_pp \
  attn_fwd_wgmma_d64_fp16_m128n128_s2_sw128_r24_ov_pp attn_fwd_wgmma_d64_fp16_m128n128_s2_sw128_r24_ov_pp_2p
ab --shape 1,32,16384,128 --hkv 8 ${C}_causal_wl4096 ${C}_2p_causal_wl4096
ab --shape 16,32,4096,128 --hkv 8 --lengths uniform:64 ${C}_causal_packed ${C}_2p_causal_packed
