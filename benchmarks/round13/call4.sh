#!/bin/bash
# Session 27, call 4 (one H200, no FA4): the compile pool's throughput on the GPU host's 16 threads, 48 forward
# variants of three default problems (benchmarks/compile_cpu/pool_variants.txt), before (18addb9, .ab/before_src)
# and after compile-cpu, alternating; then the FP8 and packed export GPU tests whose fixtures lacked TWO_P.
# Written down before: ~17% fewer CPU-s per compile, so ~1.2x variants per second.
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/round13}; mkdir -p $OUT
V=$(cat benchmarks/compile_cpu/pool_variants.txt)
for r in 1 2; do
  echo -n "before: "; PYTHONPATH=$PWD/.ab/before_src python3 benchmarks/compile_cpu/pool_throughput.py --threads 16 $V
  echo -n "after:  "; python3 benchmarks/compile_cpu/pool_throughput.py --threads 16 $V
done
timeout -k 5 170 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_export_gpu.py -k fp8 tests/gpu/test_varlen_export_gpu.py > $OUT/call4_pytest_export.txt 2>&1
echo "export fp8 + varlen GPU tests: rc $?"; tail -2 $OUT/call4_pytest_export.txt
