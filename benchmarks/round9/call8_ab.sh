#!/bin/bash
# Session 23, call 8: bwd_mma_check --cubins on the GPU: this revision's m64n128 tilings against the same variants
# built from ffb37c0 (before DQ_WRITER; the same code for these two variants), in the same rounds: the tool's
# A/B, and the noise of an A/A pair in one process.
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 8,16,2048,128 --rounds 5 \
  --variants m64n128_s2 m64n128_s2_p m64n128_s2_pw --cubins ffb37c0=.ab/bwdA > $OUT/ab_bwd.txt 2>&1
echo "rc $?"; grep -v Warning $OUT/ab_bwd.txt | grep -E "^  (attn|sdpa|FAIL)|against" | grep -v "backward node"
