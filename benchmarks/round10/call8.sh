#!/bin/bash
# Session 24, call 8: issue 40. Step F (a partial tile's mask in a branch of its own): gradient checks (the mask
# changed), GPU tests, then timed beside step D's cubins and SDPA in the same rounds.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 120 python3 benchmarks/bwd_mma_check.py --quick --template attn_bwd_wgmma --no-time > $OUT/check.txt 2>&1
echo "quick rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAIL)" $OUT/check.txt | head -5; grep -vE "^(ok|FAIL|skip)|Warning" $OUT/check.txt | tail -1
C="--cubins d=.ab/d"
timeout 90 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 1,32,16384,128 --hkv 8 \
  --causal --rounds 3 --variants m64n128_s2_bulk_pw $C > $OUT/time_causal.txt 2>&1
echo "causal rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_causal.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
timeout 60 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 8,16,2048,128 --rounds 5 \
  --variants m64n128_s2_bulk_pw $C > $OUT/time_d128.txt 2>&1
echo "d128 rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_d128.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_bwd_wgmma_kernel.py > $OUT/pytest_bwd.txt 2>&1
echo "pytest bwd rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|E  )" $OUT/pytest_bwd.txt | head -8; tail -1 $OUT/pytest_bwd.txt
