#!/bin/bash
# Session 27: issue 37's six time targets on the current main, each row's candidates beside FA4 (num_splits=1) and
# SDPA in the same 7 interleaved rounds (back to back), time and J per call; then ncu's executed instructions on the
# two instruction-target rows (ours against FA4). Needs FA4 installed (.gpu/fa4/install.sh).
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/round13}; mkdir -p $OUT
W=attn_fwd_wgmma
ab() { timeout 110 python3 benchmarks/ab_ratio.py --rounds 7 --json $OUT/targets.jsonl "$@" 2>&1 | grep -v "Warning\|relative error" | tail -5; }
ab --shape 8,16,2048,128 ${W}_d128_fp16_m128n128_s2_sw128_r24_ov_pp ${W}_d128_fp16_m128n128_s2_sw128_r24_ov_pp_2p
ab --shape 16,16,2048,64 ${W}_d64_fp16_m192n128_s2_sw128_r32_ov_pp ${W}_d64_fp16_m128n128_s2_sw128_r24_ov_pp_2p
ab --shape 1,32,16384,128 --hkv 8 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_2p_causal
ab --shape 2,16,3000,256 ${W}_d256_fp16_m128n80_s2_sw128_r24_ov_pp ${W}_d256_fp16_m128n80_s2_sw128_r24_ov_pp_2p
ab --shape 1,32,16384,128 --hkv 8 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_wl4096 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_2p_causal_wl4096
ab --shape 16,32,4096,128 --hkv 8 --lengths uniform:64 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_packed ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_causal_packed
if [ -z "$NO_NCU" ]; then
  bash benchmarks/opcode_mix.sh d128 ${W}_d128_fp16_m128n128_s2_sw128_r24_ov_pp --shape 8,16,2048,128
  bash benchmarks/opcode_mix.sh causal ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal --shape 1,32,8192,128 --hkv 8
fi
