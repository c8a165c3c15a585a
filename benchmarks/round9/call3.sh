#!/bin/bash
# Session 23, call 3: issue 40. The wgmma backward after steps B5-B7 (one CTA barrier per tile, no division per
# tile, lse/delta in registers before the waits; DQ_BULK issued per warp): checks, GPU tests, timing against SDPA's
# backward; then the training benchmark (train_e2e.py, item 5) and its GPU tests.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 200 python3 benchmarks/bwd_mma_check.py --quick --template attn_bwd_wgmma --no-time > $OUT/check.txt 2>&1
echo "check rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAIL)" $OUT/check.txt | head; grep -vE "^(ok|FAIL|skip)|Warning" $OUT/check.txt | tail -2
timeout 300 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma \
  --variants m64n128_s2 m64n128_s2_bulk m64n128_s1 m128n128_s2 m128n128_s2_bulk m128n64_s2 > $OUT/time.txt 2>&1
echo "time rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time.txt | grep -E "^  (attn|sdpa)" | grep -v "registers\|backward node"
timeout 200 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 1,32,16384,128 --hkv 8 \
  --causal --variants m64n128_s2 m64n128_s2_bulk > $OUT/time_causal.txt 2>&1
echo "time causal rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_causal.txt | grep -E "^  (attn|sdpa)" | grep -v "registers\|backward node"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_bwd_wgmma_kernel.py > $OUT/pytest_bwd.txt 2>&1
echo "pytest bwd rc $? ($(( $(date +%s) - t0 )) s)"; tail -1 $OUT/pytest_bwd.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_train_e2e_gpu.py tests/test_train_e2e.py > $OUT/pytest_train.txt 2>&1
echo "pytest train rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|E  )" $OUT/pytest_train.txt | head -12; tail -1 $OUT/pytest_train.txt
timeout 300 python3 benchmarks/train_e2e.py --json $OUT/h200_train_4layers.json > $OUT/train.txt 2>&1
echo "train rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/train.txt | tail -30
