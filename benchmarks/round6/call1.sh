#!/bin/bash
# Session 20, GPU call 1 (FA4 installed): issue 38's GPU checks (items 1, 2, 4, 6), issue 39's unrun GPU tests,
# and issue 37's producer-wait steps (P: suspend-time hint, N: nanosleep backoff) counted by ncu and timed.
export PYTHONPATH=$PWD:$PYTHONPATH
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
C=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal
# 1. executed instructions per build, same process each (ncu, one launch)
for X in K0 P N; do
  timeout 120 ncu --clock-control none --nvtx --nvtx-include "ours/" --launch-count 1 \
    --metrics smsp__inst_executed.sum,gpu__time_duration.sum python3 benchmarks/limiter_run.py $V --shape 8,16,2048,128 \
    --runs 1 --cubin .ab/$X/$V.cubin > $OUT/ncu_$X.txt 2>&1; echo "ncu $X rc $?: $(grep -E 'inst_executed|duration' $OUT/ncu_$X.txt | tr -s ' ' | tr '\n' ' ')"
done
timeout 120 ncu --clock-control none --nvtx --nvtx-include "fa4/" --launch-count 1 \
  --metrics smsp__inst_executed.sum,gpu__time_duration.sum python3 benchmarks/limiter_run.py $V --shape 8,16,2048,128 \
  --runs 1 > $OUT/ncu_fa4.txt 2>&1; echo "ncu fa4 rc $?: $(grep -E 'inst_executed|duration' $OUT/ncu_fa4.txt | tr -s ' ' | tr '\n' ' ')"
# FA4's per-instruction source page, to set its loop / per-item / producer split beside ours (round5's csv)
timeout 150 ncu --clock-control none --nvtx --nvtx-include "fa4/" --launch-count 1 --section SourceCounters \
  -o /tmp/src_fa4 -f python3 benchmarks/limiter_run.py $V --shape 8,16,2048,128 --runs 1 > /dev/null 2>&1; echo "ncu src fa4 rc $?"
ncu --import /tmp/src_fa4.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/src_fa4_d128.csv.gz
# 2. time P and N against K0 and FA4
ab() { timeout 80 python3 benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab.jsonl --cubins K0=.ab/K0 --cubins P=.ab/P --cubins N=.ab/N "$@" 2>&1 | grep -v "Warning\|relative error"; }
ab --shape 8,16,2048,128 $V
ab --shape 1,32,16384,128 --hkv 8 $C
# 3. issue 38
timeout 200 python3 benchmarks/trial_time_check.py --gpu h200 --shape 8,16,2048,128 --variants 3 --repeat 5 > $OUT/trial_time.txt 2>&1; echo "trial_time rc $?"; grep -v Warning $OUT/trial_time.txt | tail -15
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_worker_gpu.py tests/gpu/test_energy_gpu.py \
  "tests/gpu/test_export_gpu.py::test_cuda_inputs_it_cannot_take" > $OUT/tests38.txt 2>&1; echo "tests38 rc $?"; tail -6 $OUT/tests38.txt
# 4. issue 39's GPU tests not run last session
timeout 240 python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_mma_kernel.py -k "window or softcap" > $OUT/tests39.txt 2>&1; echo "tests39 rc $?"; tail -4 $OUT/tests39.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_packed_kernel.py -k "softcap or fewer" > $OUT/testspk.txt 2>&1; echo "packed rc $?"; tail -4 $OUT/testspk.txt
# 5. a first run as a user: the qwen2.5-7b problems, 100 trials, fresh home
export HOME=/tmp/freshhome; mkdir -p $HOME; start=$(date +%s)
timeout 330 python3 -m tuner search --gpu h200 --model qwen2.5-7b --trials 100 > $OUT/qwen_search.txt 2>&1; rc=$?
echo "qwen search rc $rc in $(( $(date +%s) - start )) s"; grep -v Warning $OUT/qwen_search.txt | tail -25
