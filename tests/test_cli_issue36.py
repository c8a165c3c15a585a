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


def test_show_wraps_its_long_lines_to_80_columns_at_spaces(tmp_path) -> None:
    """params, template (its 64-hex hash) and replayed lines wrap at spaces, continuation lines indented;
    nothing is lost (issue 36, item 13)."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    params = {f"TUNABLE_NUMBER_{i}": 1000 + i for i in range(12)}
    info = RunInfo(gpu_name=H200.gpu_name, profile=H200.profile, replayed_from="sqlite:///" + "r" * 60 + ".db")
    with open_store(url) as store:
        store.add_trial(trial(store.start_run(info), params=params, template_hash="c0ffee" * 10 + "abcd"))
    result = run_tuner("show", "1", "--db", url, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    params_at = next(i for i, line in enumerate(lines) if line.startswith("params: "))
    assert lines[params_at + 1].startswith("  TUNABLE_NUMBER_")  # a continuation, indented
    flat = " ".join(line.strip() for line in lines)
    assert ", ".join(f"{k}={v}" for k, v in sorted(params.items())) in flat  # every value whole
    assert "template: attn_fwd_mma @ " + "c0ffee" * 10 + "abcd" in flat
    assert f"replayed: from {info.replayed_from} (--backend replay)" in flat
