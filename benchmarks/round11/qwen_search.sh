#!/bin/bash
# Issue 38, session 25 (branch search-fixed): the qwen2.5-7b search (3 prefill + 4 decode problems, 100 trials each)
# on one H200 from a fresh home folder, as a new user runs it; target <= 120 s (session 22: 202 s, prefill 78.5 s,
# decode 120.1 s). What changed, CPU-tested only: the worker's asking of the sampler and storing of results are
# phases of the breakdown of their own ("measuring (GPU worker)" is now only the wait the card's work did not hide),
# a repeated proposal is answered from the store once, the next study's first compiles start before the confirm
# stage of the one before, the confirm race reads no meter (an energy pass meters its winner and baseline only),
# a problem's baselines are made once for all its confirm rounds, and a trial's module load and input checksum
# are named parts.  Usage (repo root, after .gpu/setup.sh and .gpu/fa4/install.sh):
#   bash benchmarks/round11/qwen_search.sh
# Then, if time allows: python -m pytest -q tests/gpu/test_energy_gpu.py -k default_search  (the energy pass)
export PYTHONPATH=$PWD:$PYTHONPATH
export HOME=$(mktemp -d)  # platformdirs: empty compile cache, FA4 cache, state and results store
unset XDG_CACHE_HOME XDG_STATE_HOME XDG_DATA_HOME TUNER_CACHE_DIR TUNER_DB
OUT=${OUT:-/tmp/round11}; mkdir -p $OUT
t0=$(date +%s)
timeout 300 python3 -m tuner --db sqlite:///$OUT/qwen.db search --gpu h200 --model qwen2.5-7b --trials 100 \
    > $OUT/qwen_search.txt 2>&1
rc=$?
echo "qwen2.5-7b search, 1 card: rc $rc in $(( $(date +%s) - t0 )) s (target 120 s)"
grep -v Warning $OUT/qwen_search.txt | grep -E "confirmed|problems done|^measured|^time:|^  " | grep -v "━"
gzip -kf $OUT/qwen.db
timeout 90 python3 benchmarks/trial_time_check.py --gpu h200 --shape 8,28,1,8192,128 --hkv 4 --dtype bf16 --causal \
    --template attn_decode --variants 3 --repeat 5 > $OUT/decode_trial_time.txt 2>&1
echo "decode trial_time_check rc $?"; grep -v Warning $OUT/decode_trial_time.txt | tail -6
