#!/bin/bash
# Session 21, GPU call 2 (FA4 installed): issue 37's step S (each stage's K/V descriptors made once and
# selected per tile; tile j-1's slot and phase from tile j's) against G3 (session 20's kernel) and FA4 in the
# same rounds; the checkout's kernel sources are S's, so the GPU tests check S; ncu's executed instructions.
export PYTHONPATH=$PWD:$PYTHONPATH
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
C=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal
timeout 120 python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_wgmma_kernel.py tests/gpu/test_packed_kernel.py \
  -k "match or fewer" > $OUT/tests_S.txt 2>&1; echo "tests S rc $?"; tail -3 $OUT/tests_S.txt
ab() { timeout 75 python3 benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab.jsonl --cubins G3=.ab/G3 --cubins S=.ab/S5 "$@" 2>&1 | grep -v "Warning\|relative error" | tail -8; }
ab --shape 8,16,2048,128 $V
ab --shape 1,32,16384,128 --hkv 8 $C
ab --shape 2,16,3000,256 attn_fwd_wgmma_d256_fp16_m128n80_s2_sw128_r24_ov_pp
ab --shape 16,32,4096,128 --hkv 8 --lengths uniform:64 ${C}_packed
n() { timeout 55 ncu --clock-control none --nvtx --nvtx-include "$1" --launch-count 1 --metrics smsp__inst_executed.sum \
  python3 benchmarks/limiter_run.py "${@:2}" --runs 1 2>&1 | grep inst_executed | tr -s ' '; }
echo "S d128: $(n ours/ $V --shape 8,16,2048,128 --cubin .ab/S5/$V.cubin)"
echo "S causal S8192: $(n ours/ $C --shape 1,32,8192,128 --hkv 8 --cubin .ab/S5/$C.cubin)"
