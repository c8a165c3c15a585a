"""SIGINT and SIGTERM at any moment of `tuner search`: one line, exit 130 / 143, nothing lost (issue 36, item 8).

Real processes and real signals, sent at controlled moments: during the CLI's imports (read from the
interpreter's own -X importtime report on stderr), and once a trial is stored. Before the fix a Ctrl-C in
the first second printed a KeyboardInterrupt traceback (rc -2), a SIGTERM there died silently (-15), a
SIGTERM later exited 130, and a second Ctrl-C could print a traceback.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tuner.backends.replay import DELAY_ENV
from tuner.search.samplers import study_name
from tuner.search.study import storage_for

ROOT = Path(__file__).resolve().parents[1]
CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _start(rec, db_url: str, tmp_path: Path, **env: str) -> subprocess.Popen:
    p = rec.problem
    args = ["--db", db_url, "search", "--gpu", rec.profile, "--shape",
            f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}", "--dtype", p.dtype, "--backend", "replay",
            "--from", rec.url, "--trials", "200", "--seed", "4", "--confirm", "0", *(["--causal"] if p.causal else [])]
    full = {**os.environ, DELAY_ENV: "0.05", "PYTHONPATH": str(ROOT), "COLUMNS": "250",
            "TUNER_LOG_DIR": str(tmp_path / "log"), **env}
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=tmp_path, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err.decode()


def _measured(db_path: Path) -> int:
    try:
        with sqlite3.connect(db_path) as conn:
            return conn.execute("SELECT count(*) FROM trials WHERE status != 'pruned'").fetchone()[0]
    except sqlite3.Error:  # not created yet
        return 0


def _after_first_trial(proc: subprocess.Popen, db_path: Path) -> None:
    deadline = time.monotonic() + 60
    while _measured(db_path) < 1:
        assert proc.poll() is None and time.monotonic() < deadline, "the search ended before a trial was stored"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_imports_is_one_line_and_exit_128_plus_it(replay_recording, tmp_path, sig):
    proc = _start(replay_recording, f"sqlite:///{tmp_path / 'results.db'}", tmp_path, PYTHONPROFILEIMPORTTIME="1")
    assert proc.stderr is not None
    for raw in proc.stderr:  # the interpreter reports each import as it ends: typer is the CLI's
        if raw.split(b"|")[-1].strip() == b"typer":
            proc.send_signal(sig)
            break
    else:
        pytest.fail("typer was never imported")
    rc, err = _finish(proc)
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert rc == CODE[sig] and "Traceback" not in err, err[-2000:]
    assert len(said) == 1, said


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_first_trial_stops_with_128_plus_it_and_keeps_the_trials(replay_recording, tmp_path, sig):
    rec, db_path = replay_recording, tmp_path / "results.db"
    proc = _start(rec, f"sqlite:///{db_path}", tmp_path)
    _after_first_trial(proc, db_path)
    proc.send_signal(sig)
    rc, err = _finish(proc)
    assert rc == CODE[sig] and "Traceback" not in err, err
    assert "interrupted: every finished trial is stored" in err
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", rec.problem),
                              storage=storage_for(f"sqlite:///{db_path}"))
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert _measured(db_path) >= 1


def test_a_second_ctrl_c_aborts_with_one_line_and_130(replay_recording, tmp_path):
    db_path = tmp_path / "results.db"
    proc = _start(replay_recording, f"sqlite:///{db_path}", tmp_path, **{DELAY_ENV: "0.5"})
    _after_first_trial(proc, db_path)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)  # the trial in hand is still measuring (0.5 s): the second one aborts it
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # a third while the search unwinds is ignored
    rc, err = _finish(proc)
    assert rc == 130 and "Traceback" not in err, err
