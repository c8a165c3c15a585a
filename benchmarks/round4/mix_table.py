"""The opcode table of opcode_mix.sh outputs side by side: millions executed per opcode, SM cycles, and the
warp-stall reasons per issued instruction, one column per (label, NVTX range).

    python benchmarks/round4/mix_table.py old=benchmarks/round4/ncu/mix_old.txt PH=benchmarks/round4/ncu/mix_PH.txt
"""

import re, sys
def parse(path):
    txt = open(path).read()
    out = {}
    for sec in txt.split("NVTX Push/Pop Stack")[1:]:
        label = re.search(r"<0,(\w+)>", sec).group(1)
        m = re.search(r"sass__inst_executed_per_opcode\s+([\d,]+) \((.*?)\)", sec, re.S)
        if not m: continue
        body = " ".join(m.group(2).split())
        ops = {k: int(v.replace(",", "")) for k, v in re.findall(r"(\w+): ([\d,]+)", body)}
        ops["all"] = int(m.group(1).replace(",", ""))
        stalls = {k: float(v) for k, v in re.findall(r"stalled_(\w+)_per_issue_active\.ratio\s+inst\s+([\d.]+)", sec)}
        cyc = re.search(r"sm__cycles_elapsed.max\s+\S+\s+([\d,]+)", sec)
        out.setdefault(label, (ops, stalls, int(cyc.group(1).replace(",","")) if cyc else None))
    return out
cols = []
for a in sys.argv[1:]:
    lab, path = a.split("=")
    for k, v in parse(path).items(): cols.append((f"{lab}:{k}", v))
ops = sorted({o for _, (d, _, _) in cols for o in d}, key=lambda o: -max(d.get(o, 0) for _, (d, _, _) in cols))
print("| opcode | " + " | ".join(c for c, _ in cols) + " |")
for o in ops[:26]:
    print(f"| {o} | " + " | ".join(f"{d.get(o,0)/1e6:.2f}" for _, (d, _, _) in cols) + " |")
print("| cycles (k) | " + " | ".join(f"{c/1e3:.1f}" if c else "-" for _, (_, _, c) in cols) + " |")
for s in ["barrier", "wait", "long_scoreboard", "gmma", "selected", "dispatch_stall"]:
    print(f"| stall {s} | " + " | ".join(f"{st.get(s,0):.2f}" for _, (_, st, _) in cols) + " |")
