#!/bin/bash
# Issue 38, session 26: the default search on one card (target <= 10 min; the call's limit is 600 s, so a run cut
# at 585 s has missed it), fresh home folder. Usage: after .gpu/setup.sh and .gpu/fa4/install.sh.
export PYTHONPATH=$PWD:$PYTHONPATH
unset XDG_CACHE_HOME XDG_STATE_HOME XDG_DATA_HOME TUNER_CACHE_DIR TUNER_DB
OUT=${OUT:-/tmp/round12}; mkdir -p $OUT
export HOME=$(mktemp -d)
t0=$(date +%s)
timeout -s INT -k 10 ${LIMIT:-570} python3 -m tuner --db sqlite:///$OUT/default1.db search --gpu h200 --devices 0 > $OUT/default_1card.txt 2>&1
echo "default search, 1 card: rc $? in $(( $(date +%s) - t0 )) s (target 600 s; cut at ${LIMIT:-570} s)"
grep -v Warning $OUT/default_1card.txt | grep -E "problems done|^measured|^time:|^  |tuning" | grep -v "━" | tail -22
gzip -kf $OUT/default1.db
# The energy pass's GPU test (session 25's confirm-stage energy pass, never run on a card)
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_energy_gpu.py -k default_search > $OUT/energy_test.txt 2>&1
echo "energy pass GPU test: rc $?"; tail -3 $OUT/energy_test.txt
