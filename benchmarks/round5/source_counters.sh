#!/bin/bash
# Per-instruction executed counts and stall samples of one variant (ncu source page, SASS), GPU machine after
# .gpu/setup.sh:  bash benchmarks/round5/source_counters.sh NAME VARIANT --shape B,H,S,D [--hkv N]
name=$1; shift
timeout 300 ncu --clock-control none --nvtx --nvtx-include "ours/" --launch-count 1 --section SourceCounters \
  --section WarpStateStats -o /tmp/src_$name -f python3 benchmarks/limiter_run.py "$@" --runs 1 > /dev/null 2>&1
echo "ncu $name: rc $?"
ncu --import /tmp/src_$name.ncu-rep --page source --csv --print-source sass > "${OUT:-.}/src_$name.csv" 2>&1
echo "source page $name: rc $? $(wc -l < "${OUT:-.}/src_$name.csv") lines"
