#!/bin/bash
# Session 22: issue 40's first Hopper wgmma backward (attn_bwd_wgmma) on the GPU: checks against fp32 autograd, timing
# against SDPA's backward, and its gpu test.
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 240 python3 benchmarks/bwd_mma_check.py --quick --template attn_bwd_wgmma > $OUT/bwd_wgmma_check.txt 2>&1
echo "check rc $?"; grep -v Warning $OUT/bwd_wgmma_check.txt | grep -E "^(ok|FAIL)" | head -12; grep -v Warning $OUT/bwd_wgmma_check.txt | grep -vE "^(ok|FAIL|skip)" | tail -30
