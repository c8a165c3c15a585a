#!/bin/bash
# Round 5 of issue 37 on the GPU: the checkout's build (RW) against cubins S (HEAD), R, W on the six target
# rows and e4m3, every baseline in the same interleaved rounds. Run from the checkout's root with FA4 installed.
R=${ROUNDS:-5}; J=$OUT/${JSON:-ab_steps}.jsonl; C=${CUBINS:-"--cubins S=.ab/S --cubins R=.ab/R --cubins W=.ab/W"}
V=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp
run() { timeout 420 python benchmarks/ab_ratio.py --rounds $R --json ${J} $C "$@" 2>&1 | grep -v Warning; }
run --shape 8,16,2048,128 attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
run --shape 1,32,16384,128 --hkv 8 ${V}_causal
run --shape 16,16,2048,64 attn_fwd_wgmma_d64_fp16_m192n128_s2_sw128_r32_ov_pp
run --shape 2,16,3000,256 attn_fwd_wgmma_d256_fp16_m128n80_s2_sw128_r24_ov_pp
run --shape 1,32,16384,128 --hkv 8 ${V}_causal_wl4096
run --shape 16,32,4096,128 --hkv 8 --lengths uniform:64 ${V}_causal_packed
run --shape 4,32,8192,128 attn_fwd_wgmma_d128_e4m3_m128n128_s2_sw128_r24_ov_pp
