"""Asks per measured trial and the winner, TPE restricted to admissible points against Optuna's TPE (issue 38).

For each problem and seed, a full replayed search (tpe, --trials budget, no warm start, no early stop, no confirm
stage) through the real `run_search` on a recording, once with the sampler's restriction off (`restrict` ignored:
Optuna's TPESampler as before) and once on. Recordings: a synthetic one (`write_synthetic_recording`: every
feasible variant of the problems of benchmarks/repeat_nudge/measure.py, made-up timings) or, with --recording, a
real one (e.g. benchmarks/replay_eval/h100_d128_grid.db: every variant of B8 H16 S2048 D128 fp16 of its day's
manifest, 3 timings each; points of today's manifest it never recorded are pruned by the replay backend).
Per run, as repeat_nudge/measure.py: asks per budgeted trial, CPU seconds, the time breakdown's "asking the
sampler", the final best (true recorded µs) and the budgeted trials to within 1% of that run's final best.

    PYTHONPATH=. python benchmarks/admissible_tpe/measure.py --seeds 8 --out /tmp/admissible.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Optional, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "repeat_nudge"))
import measure as nudge_measure  # noqa: E402  (benchmarks/repeat_nudge/measure.py: one run, its table)

from tuner.problem import Problem  # noqa: E402
from tuner.search.admissible import AdmissibleTPESampler  # noqa: E402

RESTRICT = AdmissibleTPESampler.restrict
INIT = AdmissibleTPESampler.__init__
GRID = ("B8 H16 S2048 D128 fp16 (H100 grid)", "attn_fwd_wgmma", Problem(8, 16, 2048, 2048, 128, dtype="fp16"),
        dict(shapes=("8,16,2048,128",)))


def run(url: str, truth: dict, case: tuple, seed: int, trials: int, restricted: bool, gpu: str,
        startup: int = 10) -> dict:
    """One replayed search; `startup`: TPE's random start-up trials (a replay asks one point at a time, so this
    stands for the points a measuring search asks ahead at a study's start, before any result is told)."""
    AdmissibleTPESampler.restrict = RESTRICT if restricted else (lambda self, space: None)
    AdmissibleTPESampler.__init__ = lambda self, **kw: INIT(self, **{**kw, "n_startup_trials": startup})
    label, template, problem, fields = case
    row = nudge_measure.one(url, truth, label, template, problem, fields, seed, trials, 0, gpu)
    row["nudge"] = (startup if restricted else 0) if startup != 10 else int(restricted)  # the table's column
    return row


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8, help="seeds 0 .. N-1")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--problem", type=int, action="append", help="index into repeat_nudge's PROBLEMS (synthetic)")
    ap.add_argument("--recording", help="a real recording of GRID's problem instead of the synthetic one")
    ap.add_argument("--startup", type=int, default=10, help="restricted runs with this many start-up trials "
                    "against restricted runs with 10 (instead of plain against restricted)")
    ap.add_argument("--out", help="JSON of the runs: read, extended with missing ones, written back")
    args = ap.parse_args(argv)
    rows: list[dict] = json.load(open(args.out)) if args.out and os.path.exists(args.out) else []
    done = {(r["problem"], r["seed"], r["nudge"]) for r in rows}
    with tempfile.TemporaryDirectory(prefix="tuner-admissible-") as tmp:
        if args.recording:
            url, cases = f"sqlite:///{os.path.abspath(args.recording)}", [GRID]
        else:
            url = nudge_measure.recording(tmp)
            cases = [nudge_measure.PROBLEMS[i] for i in args.problem] if args.problem else list(nudge_measure.PROBLEMS)
        truth = nudge_measure.true_us(url)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for case in cases:
                configs = [(False, 10), (True, 10)] if args.startup == 10 else [(True, 10), (True, args.startup)]
                for restricted, startup in configs:
                    column = (startup if restricted else 0) if startup != 10 else int(restricted)
                    if (case[0], seed, column) in done:
                        continue
                    rows.append(run(url, truth, case, seed, args.trials, restricted, "h100" if args.recording else "h200",
                                    startup))
                    r = rows[-1]
                    print(f"{case[0]} seed {seed} restricted {restricted} start-up {startup}: {r['asks_per_trial']:.2f} asks/trial, "
                          f"{r['cpu_s']:.1f} CPU s, asking {r['asking_s']:.1f} s, final {r['final_us']} µs at "
                          f"{r['reach']}", file=sys.stderr, flush=True)
                    if args.out:
                        json.dump(rows, open(args.out, "w"))
    print("(nudge column: off = Optuna's TPE, 1 = restricted to admissible points, N > 1 = restricted with N start-up "
          "trials)")
    nudge_measure.table([r for r in rows if r["problem"] in {c[0] for c in cases}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
