#!/bin/bash
# Session 23, GPU call 1 (FA4 installed): TWO_P (_2p) against the rotated loop it changes, both built from this
# checkout in the same interleaved rounds; first the GPU tests of the template with the _2p variants (the covering
# samples include _2p ones; test_two_p_loop_matches_fp32_reference runs 1-5 key tiles, causal, persistent).
export PYTHONPATH=$PWD:$PYTHONPATH
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
C=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp
t() { local s=$1 name=$2; shift 2; timeout $s "$@" > $OUT/$name.txt 2>&1; echo "$name rc $?: $(grep -E 'passed|failed|error' $OUT/$name.txt | tail -1)"; }
ab() { timeout 80 python3 benchmarks/ab_ratio.py --rounds 7 --json $OUT/ab.jsonl "$@" 2>&1 | grep -v "Warning\|relative error" | tail -6; }
t 200 tests_2p python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_wgmma_kernel.py tests/gpu/test_packed_kernel.py -k "match or fewer or transpose or two_p"
grep -E "^FAILED|Error" $OUT/tests_2p.txt | head -8
ab --shape 8,16,2048,128 $V ${V}_2p
ab --shape 1,32,16384,128 --hkv 8 ${C}_causal ${C}_2p_causal
ab --shape 2,16,3000,256 attn_fwd_wgmma_d256_fp16_m128n80_s2_sw128_r24_ov_pp attn_fwd_wgmma_d256_fp16_m128n80_s2_sw128_r24_ov_pp_2p
