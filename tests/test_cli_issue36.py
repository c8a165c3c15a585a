"""What `tuner results`, `show`, `report`, `export` and `db` say (issue 36: replayed trials, damaged
journals, downgrades, 80 columns)."""

from __future__ import annotations

from cli_helpers import run_tuner
from store_factories import H200, trial

from tuner.store import RunInfo, open_store

RECORDING = "sqlite:////recordings/grid.db"


def _store(tmp_path, *, replayed: bool) -> str:
    """A store holding trial 1 of run 1, replayed from RECORDING or measured."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    info = RunInfo(gpu_name=H200.gpu_name, profile=H200.profile, replayed_from=RECORDING if replayed else None)
    with open_store(url) as store:
        store.add_trial(trial(store.start_run(info)))
    return url


def test_show_says_a_trial_was_replayed_as_results_marks_it(tmp_path) -> None:
    replayed = run_tuner("show", "1", "--db", _store(tmp_path, replayed=True), env={"COLUMNS": "80"})
    assert replayed.exit_code == 0, replayed.stderr
    assert f"replayed: from {RECORDING} (--backend replay): answered from a" in replayed.stdout
    measured = run_tuner("show", "1", "--db", _store(tmp_path / "m", replayed=False), env={"COLUMNS": "80"})
    assert measured.exit_code == 0, measured.stderr
    assert "replayed" not in measured.stdout
