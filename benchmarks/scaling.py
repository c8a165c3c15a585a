"""Wall time of `tuner search` on 1, 2 and 4 cards, and whether two independent searches agree.

Runs real searches (subprocesses, fresh stores, the compile cache warmed first)
and writes a JSON of what it saw: per configuration the wall time, the search's
own phase breakdown (its `time:` line) and the confirmed winners.

    python benchmarks/scaling.py --out DIR [--devices 4] [--trials 100] [--skip-scaling] [--skip-agreement]

Agreement: two searches of one problem in separate processes (on two cards
side by side, or one after the other on one card), fresh stores, different seeds; then, in one process on card 0, both confirmed
winners and the 20 fastest stored variants of the first store re-timed in
interleaved rounds against SDPA (benchmarks/ab_ratio.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
D64 = "16,16,2048,64"
D128 = "8,16,2048,128"


def search(db: Path, shapes: list[str], devices: str, trials: int, seed: int, extra: tuple[str, ...] = ()) -> dict:
    db.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "tuner", "--db", f"sqlite:///{db}", "search", "--gpu", "auto", "--devices", devices,
           "--trials", str(trials), "--seed", str(seed), *extra]
    for shape in shapes:
        cmd += ["--shape", shape]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    line = next((ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("time:")), "")
    return {"devices": devices, "shapes": shapes, "wall_s": round(wall, 2), "time_line": line,
            "confirmed": confirmed(db), "db": str(db)}


def confirmed(db: Path) -> list[dict]:
    from tuner.store import TrialFilter, open_store

    with open_store(f"sqlite:///{db}", create=False) as store:
        problems = {r.problem for r in store.query_trials(TrialFilter())}
        out = []
        for problem in problems:
            row = store.confirmed(problem)
            if row is not None:
                out.append({"problem": problem.label, "variant": row.variant_name, "us": row.median_us,
                            "ratio": row.ratio, "baseline": row.baseline_impl})
        return out


def fastest(db: Path, n: int) -> list[str]:
    from tuner.status import TrialStatus
    from tuner.store import TrialFilter, open_store

    with open_store(f"sqlite:///{db}", create=False) as store:
        rows = [r for r in store.query_trials(TrialFilter(status=TrialStatus.OK)) if r.median_us is not None]
    names: list[str] = []
    for row in sorted(rows, key=lambda r: r.median_us):
        if row.variant_name not in names:
            names.append(row.variant_name)
    return names[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--skip-agreement", action="store_true")
    args = ap.parse_args()
    out, work = Path(args.out), Path("/tmp/scaling")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    cards = [",".join(str(d) for d in range(n)) for n in (1, 2, 4) if n <= args.devices]
    results: dict = {"scaling": [], "agreement": None}

    def save() -> None:
        (out / "scaling.json").write_text(json.dumps(results, indent=1))

    if not args.skip_scaling:
        # Warm the compile cache (not timed): the measured searches then compare cards, not nvcc.
        search(work / "warm.db", [D64, D128], cards[-1], args.trials, 99, ("--confirm", "0"))
        for shapes in ([D64], [D64, D128]):
            for devices in cards:
                row = search(work / f"s{len(shapes)}_{devices.count(',') + 1}.db", shapes, devices, args.trials, 1)
                results["scaling"].append(row)
                print(json.dumps(row), flush=True)
                save()
    if not args.skip_agreement:
        a, b = work / "agree_a.db", work / "agree_b.db"
        # Two cards: side by side on the last two; one card: one after the other on it.
        plan = (("a", a, max(args.devices - 2, 0), 11), ("b", b, args.devices - 1, 22))
        procs = []
        for tag, db, dev, seed in plan:
            procs.append(subprocess.Popen([sys.executable, __file__, "--out", str(work / tag), "--one", str(db),
                                           str(dev), str(seed), str(args.trials)]))
            if args.devices == 1:
                procs[-1].wait()
        for proc in procs:
            proc.wait()
        winners = [confirmed(a), confirmed(b)]
        names = [w[0]["variant"] for w in winners if w]
        top = fastest(a, 20)
        retime = list(dict.fromkeys(names + top))
        ab = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ab_ratio.py"), "--shape", D128,
                             "--rounds", "5", *retime], capture_output=True, text=True, cwd=ROOT)
        results["agreement"] = {"winners": winners, "top20_of_a": top, "ab_ratio": ab.stdout + ab.stderr[-2000:]}
        print(ab.stdout, flush=True)
        save()


if __name__ == "__main__" and "--one" in sys.argv:  # one independent search (a child of the agreement step)
    i = sys.argv.index("--one")
    db, dev, seed, trials = sys.argv[i + 1], sys.argv[i + 2], int(sys.argv[i + 3]), int(sys.argv[i + 4])
    print(json.dumps(search(Path(db), [D128], dev, trials, seed)), flush=True)
elif __name__ == "__main__":
    main()
