#!/bin/bash
# Issue 38, session 26, on nvidia-h200-x2 (after .gpu/setup.sh and .gpu/fa4/install.sh): the default search on two
# cards (target <= 5.5 min), then the qwen2.5-7b search on one card (target <= 2 min), each from a fresh home
# folder as a new user runs them. Changed since they were last measured: TPE picks among admissible points
# (feasible, not held: tuner/search/admissible.py), the idle nudge for decode studies, the fixed-cost branch.
export PYTHONPATH=$PWD:$PYTHONPATH
unset XDG_CACHE_HOME XDG_STATE_HOME XDG_DATA_HOME TUNER_CACHE_DIR TUNER_DB
OUT=${OUT:-/tmp/round12}; mkdir -p $OUT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
export HOME=$(mktemp -d)
t0=$(date +%s)
timeout -s INT -k 15 400 python3 -m tuner --db sqlite:///$OUT/default2.db search --gpu h200 --devices 0,1 > $OUT/default_2cards.txt 2>&1
echo "default search, 2 cards: rc $? in $(( $(date +%s) - t0 )) s (target 330 s)"
grep -v Warning $OUT/default_2cards.txt | grep -E "problems done|^measured|^time:|^  |tuning" | grep -v "━" | tail -22
gzip -kf $OUT/default2.db
export HOME=$(mktemp -d)
t1=$(date +%s)
timeout -s INT -k 10 150 python3 -m tuner --db sqlite:///$OUT/qwen.db search --gpu h200 --model qwen2.5-7b --trials 100 \
    > $OUT/qwen_1card.txt 2>&1
echo "qwen2.5-7b search, 1 card: rc $? in $(( $(date +%s) - t1 )) s (target 120 s)"
grep -v Warning $OUT/qwen_1card.txt | grep -E "problems done|^measured|^time:|^  " | grep -v "━" | tail -22
gzip -kf $OUT/qwen.db
