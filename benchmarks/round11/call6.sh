#!/bin/bash
# Session 25, call 6 (FA4 installed): issue 40's BLOCK_M 80 next step (branch bwd-bm80-b: dQ staging handed over in
# halves, lse's first blocks before the S^T wait): its GPU tests, timed against main's m80 cubin (.ab/m80) in the
# same rounds; then issue 38's qwen2.5-7b search from a fresh home (branch search-fixed), cut at 240 s.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_bwd_wgmma_kernel.py -k 80 > $OUT/pytest_bwd80.txt 2>&1
echo "pytest bwd80 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/pytest_bwd80.txt | head -8; tail -1 $OUT/pytest_bwd80.txt
timeout 80 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 8,16,2048,128 --rounds 5 \
  --variants m80n128_s2_bulk_pw --cubins old=.ab/m80 > $OUT/time_d128.txt 2>&1
echo "d128 rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_d128.txt | grep -E "^  (kernel|attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
(
export HOME=$(mktemp -d); unset XDG_CACHE_HOME XDG_STATE_HOME XDG_DATA_HOME TUNER_CACHE_DIR TUNER_DB
t1=$(date +%s)
timeout 240 python3 -m tuner --db sqlite:///$OUT/qwen.db search --gpu h200 --model qwen2.5-7b --trials 100 > $OUT/qwen_search.txt 2>&1
echo "qwen2.5-7b search rc $? in $(( $(date +%s) - t1 )) s (target 120 s; session 22: 202 s)"
grep -v Warning $OUT/qwen_search.txt | grep -E "confirmed|problems done|^measured|^time:|^  " | grep -v "━" | tail -40
gzip -f $OUT/qwen.db
)
