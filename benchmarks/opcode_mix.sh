#!/usr/bin/env bash
# ncu's executed-instruction mix (per SASS opcode) and warp-stall reasons per issued instruction, of one
# variant and FlashAttention-4 on one problem (benchmarks/limiter_run.py). GPU machine, after .gpu/setup.sh
# and .gpu/fa4/install.sh:  bash benchmarks/opcode_mix.sh NAME VARIANT --shape B,H,S,D [--hkv N]
set -uo pipefail
name=$1; shift
timeout 300 ncu --clock-control none --nvtx --nvtx-include "ours/" --nvtx-include "fa4/" --launch-count 2 \
  --metrics "sass__inst_executed_per_opcode,smsp__inst_executed.sum,sm__cycles_elapsed.max,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  --print-metric-instances details \
  python3 benchmarks/limiter_run.py "$@" --runs 1 > "${OUT:-.}/mix_$name.txt" 2>&1
echo "opcode mix $name: rc $?"
