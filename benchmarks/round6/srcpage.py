import csv, gzip, sys, collections, re
def load(p):
    f = gzip.open(p, 'rt') if p.endswith('.gz') else open(p)
    rows = list(csv.reader(f))
    hdr = rows[1]; ie = hdr.index("Instructions Executed"); src = hdr.index("Source")
    out = []
    for r in rows[2:]:
        if len(r) <= ie: continue
        try: n = int(r[ie].replace(',', ''))
        except ValueError: continue
        out.append((r[0], r[src].strip(), n))
    return out
def op(s):
    s = re.sub(r'^@!?U?P\w+\s+', '', s)
    return s.split()[0].split('.')[0] if s else '?'
def main():
  for p in sys.argv[1:]:
      ins = load(p)
      tot = sum(n for _, _, n in ins)
      print(f"== {p}: {len(ins)} instructions, {tot/1e6:.2f} M executed")
      buckets = collections.defaultdict(lambda: [0, 0, collections.Counter()])
      for a, s, n in ins:
          b = buckets[n]; b[0] += n; b[1] += 1; b[2][op(s)] += n
      for n, (s, c, ops) in sorted(buckets.items(), key=lambda kv: -kv[1][0])[:14]:
          print(f"  count {n:>8}: {c:4d} instrs, {s/1e6:7.2f} M  " + " ".join(f"{o}:{v/1e6:.2f}" for o, v in ops.most_common(8)))

if __name__=='__main__': main()
