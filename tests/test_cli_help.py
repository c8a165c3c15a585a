"""Every command answers --help (exit 0, usage shown): the CLI a user meets first."""

from __future__ import annotations

import re

import pytest

from tests.cli_helpers import run_tuner
from tuner.cli.app import build_app

_APP = build_app()
COMMANDS = sorted({c.name for c in _APP.registered_commands} | {g.name for g in _APP.registered_groups})


def test_every_command_is_listed_in_the_top_level_help() -> None:
    result = run_tuner("--help")
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.stdout, name
    assert {"search", "results", "show", "profile", "export", "report", "replay-eval", "space", "render",
            "profiles", "worker", "db"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_has_help(name: str) -> None:
    result = run_tuner(name, "--help")
    assert result.exit_code == 0, result.stderr
    assert "Usage" in result.stdout and "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("name", COMMANDS)
def test_help_shows_readable_bounds(name: str) -> None:
    """Ids and counts are bounded by a 64-bit column, but the help says only what a user needs: x>=1."""
    text = run_tuner(name, "--help", env={"COLUMNS": "200"}).stdout
    assert str(2**63 - 1) not in text
    # --seed's 0<=x<=4294967295 is a range a user may need; every other upper bound is a small one
    upper = [int(hi) for lo, hi in re.findall(r"(\d+)<=x<=(\d+)", text) if (lo, int(hi)) != ("0", 2**32 - 1)]
    assert all(hi <= 10_000 for hi in upper), text


def test_a_bound_left_out_of_the_help_is_still_checked() -> None:
    text = run_tuner("results", "--help", env={"COLUMNS": "200"}).stdout
    assert "[default: 50; x>=1]" in text
    huge = run_tuner("--db", "sqlite:///nowhere.db", "results", "--limit", str(2**63))
    assert huge.exit_code == 2 and f"{2**63} is too large (at most {2**63 - 1})" in huge.stderr


def test_unknown_command_is_one_short_error() -> None:
    result = run_tuner("serch")
    assert result.exit_code == 2
    assert "Traceback" not in result.stderr and "No such command" in result.stderr


def test_cli_works_without_the_click_package() -> None:
    # typer >= 0.2x vendors click and does not install it: a clean environment has no `click`.
    import subprocess
    import sys

    code = ("import sys; sys.modules['click'] = None\n"
            "sys.argv = ['tuner', 'serch']\n"
            "from tuner.cli.app import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "No such command" in proc.stderr and "Traceback" not in proc.stderr
