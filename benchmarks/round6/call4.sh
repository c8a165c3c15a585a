#!/bin/bash
# Session 20, GPU call 4 (no FA4): G3 (the checkout's Hopper kernel) verified; issue 40's training path and sm_80
# backward template verified; issue 38's worker test. Every piece under its own timeout (device budget ~5 min).
export PYTHONPATH=$PWD:$PYTHONPATH
t() { local s=$1 name=$2; shift 2; timeout $s "$@" > $OUT/$name.txt 2>&1; echo "$name rc $?: $(grep -E 'passed|failed|error' $OUT/$name.txt | tail -1)"; }
t 115 tests_G3 python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_wgmma_kernel.py tests/gpu/test_packed_kernel.py -k "match or fewer"
t 100 tests_bwd_export python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_backward_export_gpu.py
t 70 bwd_mma_check python3 benchmarks/bwd_mma_check.py --quick --rounds 3
for f in tests_bwd_export bwd_mma_check; do echo "== $f"; grep -v Warning $OUT/$f.txt | grep -E "FAIL|Error|ok|x sdpa|us|assert" | head -30; done
