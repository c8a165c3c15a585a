#!/bin/bash
# Issue 38's search targets, for a session with GPU time left (not run in session 24: its budget went to issue 40).
# On nvidia-h200-x2: the default search on two cards (target <= 5.5 min), then, if the call's time allows, the
# qwen2.5-7b search on one card (target <= 2 min). Fresh home folder each; the wall time and the search's own time
# breakdown are what the notes need.  Usage (repo root, after .gpu/setup.sh and .gpu/fa4/install.sh):
#   bash benchmarks/round10/next_default_search.sh
export HOME=$(mktemp -d)  # platformdirs: a fresh cache, state and store (TUNER_HOME is read by nothing)
t0=$(date +%s)
timeout 420 python3 -m tuner search --gpu h200 --devices 0,1 > $OUT/default_2cards.txt 2>&1
echo "default search, 2 cards: rc $? ($(( $(date +%s) - t0 )) s)"; tail -25 $OUT/default_2cards.txt
export HOME=$(mktemp -d)  # platformdirs: a fresh cache, state and store (TUNER_HOME is read by nothing)
t1=$(date +%s)
timeout 170 python3 -m tuner search --gpu h200 --model qwen2.5-7b > $OUT/qwen_1card.txt 2>&1
echo "qwen2.5-7b, 1 card: rc $? ($(( $(date +%s) - t1 )) s)"; tail -20 $OUT/qwen_1card.txt
