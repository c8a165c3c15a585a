"""What a user sees: flags in help, one --db rule, tables that fit 80 columns."""

from __future__ import annotations

import re
import shutil

import pytest
from cli_helpers import run_tuner


@pytest.fixture
def store_copy(replay_recording, tmp_path) -> str:
    shutil.copy(replay_recording.url.removeprefix("sqlite:///"), tmp_path / "r.db")
    return f"sqlite:///{tmp_path / 'r.db'}"


@pytest.mark.parametrize("command, flag", [("search", "--causal"), ("search", "--resume"), ("space", "--all"),
                                           ("results", "--best"), ("export", "--allow-rebuild")])
def test_a_flag_reads_as_a_flag_in_help(command, flag) -> None:
    text = run_tuner(command, "--help", env={"COLUMNS": "120"}).stdout
    line = next(line for line in text.splitlines() if line.strip().startswith(flag))
    assert "<bool>" not in line, line


@pytest.mark.parametrize("args", [("results",), ("show", "1"), ("db", "info"), ("report", "--gpu", "h200", "--out", "o"),
                                  ("export", "--gpu", "h200", "--out", "o"), ("profile", "1")])
def test_db_is_taken_after_every_store_command_as_before_it(store_copy, tmp_path, args) -> None:
    """One rule: `tuner --db URL cmd` and `tuner cmd --db URL` name the same store."""
    missing = f"sqlite:///{tmp_path / 'nope' / 'x.db'}"
    after = run_tuner(*args, "--db", missing)
    before = run_tuner("--db", missing, *args)
    assert "No such option" not in after.stderr + before.stderr
    assert after.exit_code == before.exit_code
    assert (after.stderr.splitlines() or [""])[-1] == (before.stderr.splitlines() or [""])[-1]


def test_results_fit_80_columns(store_copy) -> None:
    result = run_tuner("results", "--db", store_copy, "--limit", "20", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines if not line.startswith("store: "))  # a path is not wrapped
    rows = [line for line in lines if re.match(r"^\s*\d+ ", line)]
    assert len(rows) == 20
    continuation = [line for line in lines if re.match(r"^ {5}\S", line)]  # a row's second line
    assert len(continuation) <= len(rows)  # at most one more line per row (the problem label), never six
    assert all(re.search(r" m\d+n\d+_\S+ +ok ", line) for line in rows)  # tunables whole, on the row's line
