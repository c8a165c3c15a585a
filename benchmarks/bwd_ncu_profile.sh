#!/bin/bash
# One launch of a Hopper backward variant under ncu (--set full, source counters, the card's own clocks):
# $OUT/ncu_log.txt, $OUT/prof_details.txt (the details page) and $OUT/prof_source.csv.gz (the SASS source page);
# exits with ncu's status.  Usage (repo root, GPU machine): bash benchmarks/bwd_ncu_profile.sh VARIANT [TIMEOUT_S]
V=$1
timeout ${2:-100} ncu --clock-control none --kernel-name regex:"^${V}\$" --launch-count 1 --set full --import-source yes \
  -o $OUT/prof python3 benchmarks/bwd_profile_run.py $V --lineinfo > $OUT/ncu_log.txt 2>&1
rc=$?
ncu --import $OUT/prof.ncu-rep --page details > $OUT/prof_details.txt 2>&1
ncu --import $OUT/prof.ncu-rep --page source --csv --print-source sass > $OUT/prof_source.csv 2>/dev/null
gzip -f $OUT/prof_source.csv; rm -f $OUT/prof.ncu-rep
exit $rc
