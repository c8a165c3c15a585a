#!/bin/bash
# Session 22, GPU call 3 (FA4 still installed): D64 for T/U/U3; the GPU tests of T (the checkout's kernel); executed
# instructions of T and U (ncu); issue 40's GPU tests (the training route, the backward export) and the sm_80 backward's
# check with its floored metric.
export PYTHONPATH=$PWD:$PYTHONPATH
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
t() { local s=$1 name=$2; shift 2; timeout $s "$@" > $OUT/$name.txt 2>&1; echo "$name rc $?: $(grep -E 'passed|failed|error' $OUT/$name.txt | tail -1)"; }
timeout 100 python3 benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab.jsonl --cubins S=.ab/S5 --cubins T=.ab/T --cubins U=.ab/U --cubins U3=.ab/U3 \
  --shape 16,16,2048,64 attn_fwd_wgmma_d64_fp16_m192n128_s2_sw128_r32_ov_pp 2>&1 | grep -v "Warning\|relative error" | tail -9
t 120 tests_T python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_wgmma_kernel.py tests/gpu/test_packed_kernel.py -k "match or fewer"
n() { timeout 50 ncu --clock-control none --nvtx --nvtx-include "$1" --launch-count 1 --metrics smsp__inst_executed.sum \
  python3 benchmarks/limiter_run.py "${@:2}" --runs 1 2>&1 | grep inst_executed | tr -s ' '; }
for X in T U; do echo "$X d128: $(n ours/ $V --shape 8,16,2048,128 --cubin .ab/$X/$V.cubin)"; done
t 120 tests40 python3 -m pytest -q -p no:cacheprovider -rfx tests/gpu/test_backward_export_gpu.py tests/test_hf_training_route.py
grep -E "FAIL|XPASS|Error|assert" $OUT/tests40.txt | head -10
t 100 bwd_check python3 benchmarks/bwd_mma_check.py --quick
grep -v Warning $OUT/bwd_check.txt | tail -12
