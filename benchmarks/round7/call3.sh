#!/bin/bash
# Session 21, GPU call 5 (FA4 installed): issue 37's time targets as the product meets them: each target row
# searched (40 trials, fresh home) and confirmed against FA4 and SDPA in interleaved rounds by the confirm
# stage; the store comes back as a recording. Issue 38: a trial's cost after time_cuda's repetition sizing
# (prefill and decode), the default search's energy test. Issue 37: warp stall reasons, ours against FA4.
export PYTHONPATH=$PWD:$PYTHONPATH
export HOME=/tmp/home21; mkdir -p $HOME
DB=sqlite:///$OUT/h200_targets.db
s() { local name=$1; shift; local start=$(date +%s)
  timeout 70 python3 -m tuner --db $DB search --gpu h200 --trials 40 "$@" > $OUT/search_$name.txt 2>&1
  echo "== $name rc $? $(( $(date +%s) - start )) s"; grep -E "confirmed|confirm stage|measured [0-9]+ trials" -A2 $OUT/search_$name.txt | grep -v Warning | head -5; }
s d128 --shape 8,16,2048,128 --dtype fp16
s d64 --shape 16,16,2048,64 --dtype fp16
s causal --shape 1,32,16384,128 --hkv 8 --dtype bf16 --causal
s d256 --shape 2,16,3000,256 --dtype fp16
s window --shape 1,32,16384,128 --hkv 8 --dtype bf16 --causal --window 4096,0
s packed --shape 16,32,4096,128 --hkv 8 --dtype bf16 --causal --layout packed --lengths uniform:64
timeout 60 python3 benchmarks/trial_time_check.py --gpu h200 --shape 8,16,2048,128 --variants 3 --repeat 5 > $OUT/trial_time.txt 2>&1; echo "trial_time rc $?"; grep -v Warning $OUT/trial_time.txt | tail -6
(start=$(date +%s); timeout 60 python3 -m tuner --db sqlite:///$OUT/decode.db search --gpu h200 --shape 8,28,1,8192,128 --hkv 4 --dtype bf16 --causal --trials 100 > $OUT/decode.txt 2>&1
 echo "decode search rc $? $(( $(date +%s) - start )) s"; grep -E "measuring|confirm stage" $OUT/decode.txt | tail -3)
timeout 110 python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_energy_gpu.py -k default_search > $OUT/energy_test.txt 2>&1; echo "energy test rc $?: $(tail -1 $OUT/energy_test.txt)"
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
w() { timeout 50 ncu --clock-control none --nvtx --nvtx-include "$1" --launch-count 1 --section WarpStateStats \
  python3 benchmarks/limiter_run.py $V --shape 8,16,2048,128 --runs 1 > $OUT/stalls_$3.txt 2>&1; echo "stalls rc $?"; }
w ours/ x ours; w fa4/ x fa4
grep -E "Stall|Warp Cycles|Issued" $OUT/stalls_*.txt | head -40
