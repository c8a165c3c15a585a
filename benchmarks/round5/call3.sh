#!/bin/bash
# Session 19, third GPU call: the producer's waits hinted (TP, the checkout) and every wait hinted (TH)
# against the rotated loop (K), and the one GPU test that failed in the second call, its output kept.
timeout 150 python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/test_export_gpu.py -k cuda_inputs_it_cannot_take > $OUT/test.txt 2>&1
tail -15 $OUT/test.txt
C="--cubins K=.ab/K --cubins TH=.ab/TH"
V=attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp
run() { timeout 200 python benchmarks/ab_ratio.py --rounds 5 --json $OUT/ab_TP.jsonl $C "$@" 2>&1 | grep -v "Warning\|relative error" | sed -E 's/ +([0-9.]+) us +([0-9.]+) TFLOP\/s/ \1us/; s/\(J [0-9.]+x\)//g; s/[0-9.]+x sdpa_flash//'; }
run --shape 8,16,2048,128 attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp
run --shape 1,32,16384,128 --hkv 8 ${V}_causal
run --shape 16,16,2048,64 attn_fwd_wgmma_d64_fp16_m192n128_s2_sw128_r32_ov_pp
run --shape 16,32,4096,128 --hkv 8 --lengths uniform:64 ${V}_causal_packed
