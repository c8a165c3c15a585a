#!/bin/bash
# Session 22, GPU call 7 (FA4 installed): issue 38 after the search's window cut (trials and their baselines over
# 10 + 50 ms, the confirm stage over 25 + 100 ms): a trial's hold at B8 H16 S2048 D128, then the whole
# qwen2.5-7b search (7 problems, 100 trials each) from a fresh home, as a new user runs it.
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 70 python3 benchmarks/trial_time_check.py --gpu h200 --shape 8,16,2048,128 --variants 3 --repeat 5 > $OUT/trial_time.txt 2>&1
echo "trial_time rc $?"; grep -v Warning $OUT/trial_time.txt | tail -6
(export HOME=/tmp/freshhome22; mkdir -p $HOME; start=$(date +%s)
 timeout 330 python3 -m tuner --db sqlite:///$OUT/qwen.db search --gpu h200 --model qwen2.5-7b --trials 100 > $OUT/qwen_search.txt 2>&1; rc=$?
 echo "qwen search rc $rc in $(( $(date +%s) - start )) s"; grep -v Warning $OUT/qwen_search.txt | grep -E "confirmed|time:|measured|preparing|start-up|waiting|inputs|verification|  [a-z]" | tail -40)
