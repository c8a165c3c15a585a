import sys, collections
import os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from srcpage import load, op
mixes = []
for p, cnt in zip(sys.argv[1::2], sys.argv[2::2]):
    c = collections.Counter()
    for a, s, n in load(p):
        if n == int(cnt): c[op(s)] += 1
    mixes.append(c)
keys = sorted(set().union(*mixes), key=lambda k: -(mixes[0][k] - mixes[1][k]))
print(f"{'op':10s} {'ours':>6s} {'fa4':>6s} {'diff':>6s}")
for k in keys:
    print(f"{k:10s} {mixes[0][k]:6d} {mixes[1][k]:6d} {mixes[0][k]-mixes[1][k]:6d}")
print('all', sum(mixes[0].values()), sum(mixes[1].values()))
