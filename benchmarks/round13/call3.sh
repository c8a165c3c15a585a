#!/bin/bash
# Session 27, call 3 (FA4 installed): branch compile-cpu merged (the tuner's compiles declare the few CUDA fp types
# they use; decode without cooperative_groups.h; cubins byte-identical on the CPU) -- the decode and export GPU
# tests, then the default search on one card, fresh home, cut at LIMIT, its problems' times beside session 26's
# call 3 (18 of 32 problems in 415 s; the first 7 at 31, 48, 63, 86, 108, 130, 156 s).
# Written down before: forward compiles -17% CPU-s -> about 4% less time per problem (nvcc wait 5.4 -> ~4.5 s).
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/round13}; mkdir -p $OUT
timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_decode_kernel.py tests/gpu/test_export_gpu.py > $OUT/call3_pytest.txt 2>&1
echo "decode + export GPU tests: rc $?"; tail -2 $OUT/call3_pytest.txt
unset XDG_CACHE_HOME XDG_STATE_HOME XDG_DATA_HOME TUNER_CACHE_DIR TUNER_DB
export HOME=$(mktemp -d)
t0=$(date +%s)
timeout -s INT -k 10 ${LIMIT:-240} python3 -m tuner --db sqlite:///$OUT/default1.db search --gpu h200 --devices 0 2>&1 \
  | while IFS= read -r l; do printf '%4d %s\n' $(( $(date +%s) - t0 )) "$l"; done > $OUT/call3_default_1card.txt
echo "default search, 1 card: in $(( $(date +%s) - t0 )) s (cut at ${LIMIT:-240} s)"
grep -v Warning $OUT/call3_default_1card.txt | grep -iE "confirmed|problems done|^ *[0-9]+ measured|time:|nvcc|tuning" | grep -v "━" | tail -30
