#!/bin/bash
# Session 21, GPU call 3 (FA4 still installed from call 2): issue 38 (the confirm stage metered in its last
# round only; the worker's phases), issue 40's GPU tests, and e4m3/D64 timed against G3.
export PYTHONPATH=$PWD:$PYTHONPATH
t() { local s=$1 name=$2; shift 2; timeout $s "$@" > $OUT/$name.txt 2>&1; echo "$name rc $?: $(grep -E 'passed|failed|error' $OUT/$name.txt | tail -1)"; }
(export HOME=/tmp/freshhome21; mkdir -p $HOME; start=$(date +%s)
 timeout 200 python3 -m tuner search --gpu h200 --model qwen2.5-7b --trials 100 > $OUT/qwen_search.txt 2>&1; rc=$?
 echo "qwen search rc $rc in $(( $(date +%s) - start )) s"; grep -v Warning $OUT/qwen_search.txt | tail -22)
t 150 tests38 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_worker_gpu.py tests/gpu/test_energy_gpu.py
grep -E "FAIL|Error|assert" $OUT/tests38.txt | head -10
t 110 tests40 python3 -m pytest -q -p no:cacheprovider -rfx tests/gpu/test_backward_export_gpu.py
grep -E "FAIL|XPASS|Error|assert" $OUT/tests40.txt | head -10
ab() { timeout 60 python3 benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab2.jsonl --cubins G3=.ab/G3 --cubins S=.ab/S5 "$@" 2>&1 | grep -v "Warning\|relative error" | tail -6; }
ab --shape 8,16,2048,64 attn_fwd_wgmma_d64_fp16_m192n128_s2_sw128_r32_ov_pp
ab --shape 8,16,2048,128 attn_fwd_wgmma_d128_e4m3_m128n128_s2_sw128_r24_ov_pp
