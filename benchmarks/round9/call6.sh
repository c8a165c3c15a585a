#!/bin/bash
# Session 23, call 6 (FA4 installed, after .gpu/fa4/park.sh): the merged branches' GPU checks in priority order:
# issue 40's `--pass backward` search test, issue 37's TWO_P GPU test, then TWO_P (_2p) against the rotated loop
# in the same 5 interleaved rounds (FA4 and SDPA beside) at D128 and causal D128 S16384.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
t() { local s=$1 name=$2; shift 2; timeout $s "$@" > $OUT/$name.txt 2>&1; echo "$name rc $? ($(( $(date +%s) - t0 )) s): $(grep -E 'passed|failed|error' $OUT/$name.txt | tail -1)"; grep -E "^(FAILED|E  )" $OUT/$name.txt | head -8; }
ab() { timeout 90 python3 benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab.jsonl "$@" 2>&1 | grep -v "Warning\|relative error" | tail -6; echo "ab ($(( $(date +%s) - t0 )) s)"; }
t 170 pytest_pass_backward python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_pass_backward_gpu.py
t 150 pytest_two_p python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_wgmma_kernel.py -k two_p
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
C=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp
ab --shape 8,16,2048,128 $V ${V}_2p
ab --shape 1,32,16384,128 --hkv 8 ${C}_causal ${C}_2p_causal
