#!/bin/bash
# Session 24, call 7: issue 40. Step E1 (dK's wgmmas issued before the dS^T barrier, DQ_TILED) timed beside the
# committed kernel (step D) and SDPA; causal profiled beside FA4 (instructions executed, per-line source pages);
# then the export's tuned-backward GPU tests ($1: pytest targets).
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
C="--cubins e1=.ab/e1"
timeout 100 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 8,16,2048,128 --rounds 7 \
  --variants m64n128_s2_bulk_pw $C > $OUT/time_d128.txt 2>&1
echo "d128 rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_d128.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
timeout 120 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 1,32,16384,128 --hkv 8 \
  --causal --rounds 3 --variants m64n128_s2_bulk_pw $C > $OUT/time_causal.txt 2>&1
echo "causal rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_causal.txt | grep -E "^  (attn|sdpa|fa4|FAIL)" | grep -v "registers\|backward node"
V=attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk_pw_causal
for who in ours fa4; do
  if [ $who = ours ]; then K="^${V}\$"; R="$V --lineinfo"; else K="FlashAttentionBackwardSm90"; R="fa4 --runs 2"; fi
  timeout 120 ncu --clock-control none --kernel-name regex:"$K" --launch-count 1 --set full --import-source yes \
    -o $OUT/p_$who python3 benchmarks/bwd_profile_run.py $R --shape 1,32,16384,128 --hkv 8 --causal > $OUT/ncu_$who.txt 2>&1
  echo "ncu $who rc $? ($(( $(date +%s) - t0 )) s)"
  ncu --import $OUT/p_$who.ncu-rep --page details > $OUT/causal_${who}_details.txt 2>&1
  grep -E "Duration|Executed Instructions  |Compute \(SM\) Throughput|Grid Size|Block Size" $OUT/causal_${who}_details.txt | head -5
  ncu --import $OUT/p_$who.ncu-rep --page source --csv --print-source sass > $OUT/causal_${who}_source.csv 2>&1
  gzip -f $OUT/causal_${who}_source.csv; rm -f $OUT/p_$who.ncu-rep
done
if [ -n "$1" ]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu "$@" > $OUT/pytest_export_bwd.txt 2>&1
  echo "pytest rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/pytest_export_bwd.txt | head -12; tail -1 $OUT/pytest_export_bwd.txt
fi
