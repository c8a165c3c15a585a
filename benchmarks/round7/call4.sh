#!/bin/bash
# Session 21, GPU call 6 (no FA4): ncu's source page (stall sampling per instruction) of step S at B8 H16 S2048
# D128 fp16, to set beside FA4's (round6/src_fa4_d128.csv.gz).
export PYTHONPATH=$PWD:$PYTHONPATH
V=attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
timeout 150 ncu --clock-control none --nvtx --nvtx-include "ours/" --launch-count 1 --section SourceCounters --section WarpStateStats \
  -o /tmp/src_ours -f python3 benchmarks/limiter_run.py $V --shape 8,16,2048,128 --runs 1 > $OUT/ncu_log.txt 2>&1; echo "ncu src rc $?"
ncu --import /tmp/src_ours.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/src_ours_S_d128.csv.gz
ncu --import /tmp/src_ours.ncu-rep --section WarpStateStats 2>/dev/null | grep -E "Stall|Cycles" | head -30 > $OUT/stalls_ours.txt
ls -la $OUT; tail -3 $OUT/ncu_log.txt
