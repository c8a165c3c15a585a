#!/bin/bash
# Session 25, call 2: issue 40 item 5 with a tuned backward. A `--pass both` search of the training benchmark's
# attention problem (B4 H32 Hkv8 S4096 D128 bf16 causal), exported, then the 4-layer training step against
# transformers' SDPA path (train_e2e.py) with that package: its backward is the tuned one where the confirm stage won.
export PYTHONPATH=$PWD:$PYTHONPATH
export HOME=$(mktemp -d)
t0=$(date +%s)
DB=sqlite:///$OUT/train.db
timeout 300 python3 -m tuner --db $DB search --gpu auto --shape 4,32,4096,128 --hkv 8 --causal --dtype bf16 \
  --pass both --trials 24 --seed 0 > $OUT/search.txt 2>&1
echo "search rc $? ($(( $(date +%s) - t0 )) s)"; tail -25 $OUT/search.txt
timeout 120 python3 -m tuner --db $DB export --gpu auto --out /tmp/pkg/trainpkg > $OUT/export.txt 2>&1
echo "export rc $? ($(( $(date +%s) - t0 )) s)"; tail -8 $OUT/export.txt
timeout 240 python3 benchmarks/train_e2e.py --package /tmp/pkg/trainpkg --rounds 5 --json $OUT/train.json > $OUT/train.txt 2>&1
echo "train rc $? ($(( $(date +%s) - t0 )) s)"; tail -30 $OUT/train.txt
