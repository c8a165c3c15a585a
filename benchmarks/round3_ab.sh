#!/usr/bin/env bash
# Hopper round 3 (issue 27): the current attn_fwd_wgmma build against the previous revisions' cubins
# (.ab/<label>/, from benchmarks/build_cubins.py run in a checkout of that revision), FlashAttention-4 and the
# SDPA backends, in interleaved rounds, back to back. Run on the GPU machine from the repository root,
# after .gpu/setup.sh and .gpu/fa4/install.sh; results go to $OUT/ab.jsonl (one JSON line a problem).
set -uo pipefail
out=${OUT:-.}/ab.jsonl
cubins=(); for d in .ab/*/; do d=${d%/}; cubins+=(--cubins "${d##*/}=$d"); done  # .ab/<label>/<variant>.cubin
ab() { PYTHONUNBUFFERED=1 python3 benchmarks/ab_ratio.py "${cubins[@]}" --rounds "${ROUNDS:-7}" --json "$out" "$@"; }
ab --shape 16,16,2048,64 attn_fwd_wgmma_d64_fp16_m192n128_s2_sw128_r32_ov_pp
ab --shape 8,16,2048,128 attn_fwd_wgmma_d128_fp16_m128n176_s2_sw128_r32_ov_pp attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
ab --shape 16,16,2048,64 attn_fwd_wgmma_d64_fp16_m128n128_s2_sw128_r24_ov_pp_p_causal
ab --shape 1,32,16384,128 --hkv 8 attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_causal attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal
