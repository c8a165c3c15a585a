#!/usr/bin/env bash
# Hopper round 3, second step (issue 27): the current build against .ab/<label>/ cubins, FA4 and cuDNN on
# the target problems (time and J per call, interleaved rounds, back to back), then ncu's limiter
# of the best variants and FA4 side by side. GPU machine, repository root, after .gpu/setup.sh and
# .gpu/fa4/install.sh. Results: $OUT/ab.jsonl, $OUT/ncu_*.txt.
set -uo pipefail
OUT=${OUT:-.}
out=$OUT/ab.jsonl
cubins=(); for d in .ab/*/; do d=${d%/}; cubins+=(--cubins "${d##*/}=$d"); done
ab() { PYTHONUNBUFFERED=1 python3 benchmarks/ab_ratio.py "${cubins[@]}" --rounds "${ROUNDS:-5}" --json "$out" "$@"; }
W=attn_fwd_wgmma
ab --shape 8,16,2048,128 ${W}_d128_fp16_m128n128_s2_sw128_r24_ov_pp
ab --shape 16,16,2048,64 ${W}_d64_fp16_m192n128_s2_sw128_r32_ov_pp
ab --shape 16,16,2048,64 ${W}_d64_fp16_m128n128_s2_sw128_r24_ov_pp_p_causal
ab --shape 8,16,2048,128 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp
ab --shape 4,32,4096,128 --hkv 8 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_causal
ab --shape 1,32,16384,128 --hkv 8 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal
ab --shape 32,32,512,128 --hkv 8 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_p_causal ${W}_d128_bf16_m64n128_s2_sw128_r24_ov_causal
ab --shape 16,32,1024,128 --hkv 8 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_p_causal ${W}_d128_bf16_m64n128_s2_sw128_r24_ov_causal
prof() {  # name variant shape [--hkv N]
  local name=$1; shift
  timeout 240 ncu --clock-control none --nvtx --nvtx-include "ours/" --nvtx-include "fa4/" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --launch-count 2 \
    python3 benchmarks/limiter_run.py "$@" --runs 1 > "$OUT/ncu_$name.txt" 2>&1
  echo "ncu $name: rc $?"
}
prof d128 ${W}_d128_fp16_m128n128_s2_sw128_r24_ov_pp --shape 8,16,2048,128
prof d64 ${W}_d64_fp16_m192n128_s2_sw128_r32_ov_pp --shape 16,16,2048,64
prof s512 ${W}_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal --shape 32,32,512,128 --hkv 8
