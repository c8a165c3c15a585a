#!/bin/bash
# Session 24, call 4: issue 40. ncu of FlashAttention-4's backward main kernel (FlashAttentionBackwardSm90) at
# B8 H16 S2048 D128 bf16, the same sections and SASS source page as call 3's profile of ours.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 200 ncu --clock-control none --kernel-name regex:"FlashAttentionBackwardSm90" --launch-count 1 --set full \
  --import-source yes -o $OUT/fa4prof python3 benchmarks/bwd_profile_run.py fa4 --runs 2 > $OUT/ncu_log.txt 2>&1
echo "ncu rc $? ($(( $(date +%s) - t0 )) s)"; tail -2 $OUT/ncu_log.txt
ncu --import $OUT/fa4prof.ncu-rep --page details > $OUT/fa4prof_details.txt 2>&1
grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Block Size|Grid Size|Dynamic Shared|Executed Instructions  " $OUT/fa4prof_details.txt | head -12
ncu --import $OUT/fa4prof.ncu-rep --page source --csv --print-source sass > $OUT/fa4prof_source.csv 2>&1; gzip -f $OUT/fa4prof_source.csv
rm -f $OUT/fa4prof.ncu-rep
