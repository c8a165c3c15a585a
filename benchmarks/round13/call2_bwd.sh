#!/bin/bash
# Session 27, call 2 (FA4 installed): branch bwd-count merged (the Hopper backward's consumer loop 572 -> 394
# instructions a tile causal, 497 -> 398 non-causal; BLOCK_M 80 causal feasible) -- its GPU tests and gradient
# checks, then the tilings against main's cubins (.ab/bmain, 18addb9) with FA4's and SDPA's backward in the same rounds.
# Written down before (the helper's expectation): causal m64 +2-5%, non-causal m64 +2-4%, m80 about +1%.
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/round13}; mkdir -p $OUT
t() { local s=$1 name=$2; shift 2; timeout $s "$@" > $OUT/$name.txt 2>&1; echo "$name rc $?: $(grep -E 'passed|failed|error|within' $OUT/$name.txt | tail -1)"; }
t 200 call2_pytest_bwd python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/gpu/test_bwd_wgmma_kernel.py
t 60 call2_writer python3 benchmarks/bwd_writer_checks.py
t 120 call2_quick python3 benchmarks/bwd_mma_check.py --template attn_bwd_wgmma --no-time --quick
tail -4 $OUT/call2_quick.txt
tm() { timeout 110 python3 benchmarks/bwd_mma_check.py --template attn_bwd_wgmma --no-check --cubins main=.ab/bmain "$@" 2>&1 | grep -v "Warning" | tail -12; }
tm --shape 1,32,16384,128 --hkv 8 --causal --rounds 5 --variants m64n128_s2_bulk_pw m80n128_s2_bulk_pw
tm --shape 8,16,2048,128 --rounds 7 --variants m64n128_s2_bulk_pw m80n128_s2_bulk_pw
tm --shape 16,16,2048,64 --rounds 5 --variants m64n64_s2_bulk_pw m128n128_s2
