#!/bin/bash
# Session 23, call 2: issue 40's wgmma backward, steps B3 (loads unrolled; the DQ_BULK tunable) and B4 (S^T and dP^T
# waited for apart, dV issued before dS^T): checks, GPU tests, timing against SDPA's backward (and the causal GQA
# shape), and an ncu profile of the D128 kernel.
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
timeout 200 python3 benchmarks/bwd_mma_check.py --quick --template attn_bwd_wgmma --no-time > $OUT/check.txt 2>&1
echo "check rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^(FAIL)" $OUT/check.txt | head; grep -vE "^(ok|FAIL|skip)|Warning" $OUT/check.txt | tail -4
timeout 300 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma \
  --variants m64n128_s2 m64n128_s2_bulk m64n128_s1_bulk m64n64_s2_bulk m128n128_s2 m128n128_s2_bulk m128n64_s2_bulk > $OUT/time.txt 2>&1
echo "time rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time.txt | tail -22
timeout 200 python3 benchmarks/bwd_mma_check.py --no-check --template attn_bwd_wgmma --shape 1,32,16384,128 --hkv 8 \
  --causal --variants m64n128_s2 m64n128_s2_bulk > $OUT/time_causal.txt 2>&1
echo "time causal rc $? ($(( $(date +%s) - t0 )) s)"; grep -v Warning $OUT/time_causal.txt | tail -6
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_bwd_wgmma_kernel.py > $OUT/pytest.txt 2>&1
echo "pytest rc $? ($(( $(date +%s) - t0 )) s)"; tail -3 $OUT/pytest.txt
V=attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk
timeout 150 ncu --clock-control none --kernel-name regex:"^${V}\$" --launch-count 1 --set full --import-source yes \
  -o $OUT/prof python3 benchmarks/bwd_profile_run.py $V --lineinfo > $OUT/ncu_log.txt 2>&1
echo "ncu rc $? ($(( $(date +%s) - t0 )) s)"; tail -2 $OUT/ncu_log.txt
ncu --import $OUT/prof.ncu-rep --page details > $OUT/prof_details.txt 2>&1
grep -E "Duration|Registers|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Warp Cycles Per Issued|L2 Hit|Theoretical Occ" $OUT/prof_details.txt | head -20
ncu --import $OUT/prof.ncu-rep --page raw --csv --metrics regex:smsp__pcsamp_warps_issue_stalled_.*  > $OUT/prof_stalls.csv 2>&1
python3 - <<'PY'
import csv, os
rows = list(csv.reader(open(os.environ["OUT"] + "/prof_stalls.csv")))
if len(rows) >= 3:
    h, u, v = rows[0], rows[1], rows[2]
    pairs = []
    for name, val in zip(h, v):
        if "stalled" in name and not name.endswith("not_issued"):
            try: pairs.append((float(val.replace(",", "")), name))
            except ValueError: pass
    for val, name in sorted(pairs, reverse=True)[:12]: print(f"  {val:12.0f} {name}")
PY
ncu --import $OUT/prof.ncu-rep --page source --csv --print-source sass > $OUT/prof_source.csv 2>&1; echo "source rc $? $(wc -l < $OUT/prof_source.csv) lines"
