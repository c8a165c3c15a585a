#!/bin/bash
# Session 25, call 4 (FA4 installed): issue 37's packed persistent deal (helper branch packed-sched) and the decode
# budget (decode-budget): their GPU tests, then each timed against main's cubins (.ab/) in the same rounds.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
P=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_packed_kernel.py > $OUT/pytest_packed.txt 2>&1
echo "pytest packed rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/pytest_packed.txt | head -8; tail -1 $OUT/pytest_packed.txt
timeout 100 python3 benchmarks/ab_ratio.py --rounds 7 --cubins main=.ab/main --shape 16,32,4096,128 --hkv 8 \
  --lengths uniform:64 ${P}_causal_packed ${P}_p_causal_packed ${P}_p_2p_causal_packed > $OUT/ab_packed_causal.txt 2>&1
echo "ab causal rc $? ($(( $(date +%s) - t0 )) s)"; grep -v "Warning\|relative error" $OUT/ab_packed_causal.txt | tail -12
timeout 70 python3 benchmarks/ab_ratio.py --rounds 5 --cubins main=.ab/main --shape 16,32,4096,128 --hkv 8 \
  --lengths uniform:64 ${P}_packed ${P}_p_packed > $OUT/ab_packed.txt 2>&1
echo "ab dense-causal-off rc $? ($(( $(date +%s) - t0 )) s)"; grep -v "Warning\|relative error" $OUT/ab_packed.txt | tail -8
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_decode_kernel.py tests/gpu/test_decode_budget_kernel.py > $OUT/pytest_decode.txt 2>&1
echo "pytest decode rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/pytest_decode.txt | head -8; tail -1 $OUT/pytest_decode.txt
timeout 120 python3 benchmarks/round11/decode_ab.py --old main=.ab/decode_main --old step5=.ab/decode_step5 --rounds 7 --json $OUT/decode_ab.jsonl > $OUT/decode_ab.txt 2>&1
echo "decode ab rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/decode_ab.txt | tail -30
