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


def _table_lines(text: str, title: str) -> list[str]:
    """The lines of the table titled `title` (title, header, rule and rows) up to the first blank or plain line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    end = next((i for i in range(start + 3, len(lines))
                if not lines[i].strip() or lines[i].startswith(" " * 3 + "best:")), len(lines))
    return lines[start:end]


def test_profiles_fit_80_columns_without_cutting_a_word() -> None:
    from tuner.profiles import list_profiles

    result = run_tuner("profiles", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[1].split() == ["name", "card", "arch", "SMs", "smem/block", "L2", "peak", "fp16", "bandwidth",
                                "problems"]
    words = result.stdout.split()
    for p in list_profiles():
        assert all(word in words for word in p.display_name.split()), p.display_name  # wrapped at spaces only
        assert f"{p.peak_fp16_tflops:g} TFLOP/s" in result.stdout  # a figure stays on its line


def test_search_summary_fits_80_columns_without_cutting_a_word(replay_recording, tmp_path) -> None:
    p = replay_recording.problem
    result = run_tuner("--db", f"sqlite:///{tmp_path / 'r.db'}", "search", "--gpu", replay_recording.profile,
                       "--shape", f"{p.batch},{p.heads},{p.seq_q},{p.head_dim}", "--backend", "replay",
                       "--from", replay_recording.url, "--trials", "20", "--seed", "4", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    table = _table_lines(result.stdout, "search summary")  # seed 4's winner has one of the longest names
    assert all(len(line) <= 80 for line in table)
    # The problem label stays on its row's line (issue 36): TFLOP/s, the trials (the counts line says them)
    # and the baseline's µs (µs times x) made room.
    assert table[1].split() == ["problem", "best", "µs", "baseline", "x"]
    assert table[3].startswith(p.label + " ")
    assert len(table) == 4 or table[4].strip().startswith("best:")  # no second line of the label
    row = table[3].split()
    assert any(re.fullmatch(r"sdpa_(flash|cudnn|efficient)", word) for word in row)  # whole, as are its figures
    assert any(re.fullmatch(r"\d+\.\d\dx", word) for word in row)
    assert "…" not in result.stdout


def test_replay_eval_figures_are_whole_at_80_columns(replay_recording) -> None:
    result = run_tuner("replay-eval", "--from", replay_recording.url, "--samplers", "random,tpe", "--seeds", "2",
                       "--trials", "15", "--jobs", "2", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    assert "…" not in result.stdout
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines if not line.startswith("best sampler:"))
    rows = [line for line in lines if line.startswith(("random ", "tpe "))]
    assert len(rows) == 2
    for row in rows:  # the final gap and both regrets, each a whole figure
        assert len(re.findall(r"(?<!\S)(?:\d+\.\d\d%|-)(?!\S)", row)) == 3, row
