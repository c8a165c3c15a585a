#!/bin/bash
# Session 25, call 1 (after FA4's part A was parked): issue 40 item 4's GPU tests (never run yet), step F's
# DQ_WRITER checks (call 8 of session 24 had no budget for them), then causal backward beside FA4 in the same rounds.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -k "not short_search" tests/gpu/test_export_backward_gpu.py \
  tests/gpu/test_backward_export_gpu.py tests/gpu/test_pass_backward_gpu.py tests/gpu/test_bwd_wgmma_kernel.py > $OUT/pytest_item4.txt 2>&1
echo "pytest item4 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/pytest_item4.txt | head -12; tail -1 $OUT/pytest_item4.txt
timeout 150 python3 benchmarks/bwd_writer_checks.py > $OUT/check_tiled.txt 2>&1
echo "check rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "FAIL|writer checks" $OUT/check_tiled.txt | head -8
timeout 150 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 1,32,16384,128 --hkv 8 \
  --causal --rounds 5 --variants m64n128_s2_bulk_pw > $OUT/time_causal.txt 2>&1
echo "causal rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_causal.txt | grep -E "^  (attn|sdpa|fa4|FAIL)|ratio|median" | grep -v "registers\|backward node"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -k "short_search" tests/gpu/test_export_backward_gpu.py > $OUT/pytest_short.txt 2>&1
echo "pytest short rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/pytest_short.txt | head -12; tail -1 $OUT/pytest_short.txt
