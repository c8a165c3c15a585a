"""A replay of a problem its recording does not hold is a one-line error that writes nothing (issue 36, item 10):
it exited 0 with '0 trials ... pruned 207 infeasible points' and left a run and a study behind."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cli_helpers import run_tuner


def _shape(p) -> str:
    return f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}"


def test_a_replay_of_a_problem_the_recording_lacks_says_so_and_writes_nothing(replay_recording, tmp_path):
    rec = replay_recording
    other = replace(rec.problem, seq_q=rec.problem.seq_q * 2, seq_k=rec.problem.seq_k * 2)
    db = tmp_path / "results.db"
    result = run_tuner("--db", f"sqlite:///{db}", "search", "--gpu", rec.profile, "--shape", _shape(other),
                       "--dtype", rec.problem.dtype, *(["--causal"] if rec.problem.causal else []),
                       "--backend", "replay", "--from", rec.url, "--trials", "10", env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"no trials of {other.label}" in lines[0] and f"it has: {rec.problem.label}" in lines[0]
    assert not db.exists() and list(tmp_path.iterdir()) == []  # no store, no journal: nothing written


def test_a_replay_of_a_recorded_problem_still_runs(replay_recording, tmp_path):
    rec = replay_recording
    db = tmp_path / "results.db"
    result = run_tuner("--db", f"sqlite:///{db}", "search", "--gpu", rec.profile, "--shape", _shape(rec.problem),
                       "--dtype", rec.problem.dtype, *(["--causal"] if rec.problem.causal else []),
                       "--backend", "replay", "--from", rec.url, "--trials", "3", "--confirm", "0",
                       env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.stderr
    assert Path(db).exists()
