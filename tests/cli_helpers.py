"""Run the `tuner` CLI in-process with the semantics of its console script (tuner.cli.app.main)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from typer.testing import CliRunner

from tuner.cli.app import main
from tuner.search.hooks import Hooks


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_tuner(*args: str, env: dict[str, str | None] | None = None, hooks: Hooks | None = None) -> CliResult:
    """Call tuner.cli.app.main() with argv = ["tuner", *args], capturing stdout, stderr and the exit code;
    `hooks` replace the search's backend, builder or clock."""

    runner = CliRunner()
    saved_argv = sys.argv
    with runner.isolation(env=env) as (out, err, _mixed):
        sys.argv = ["tuner", *args]
        code = 0
        try:
            main(hooks or Hooks())
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = saved_argv
            sys.stdout.flush()
            sys.stderr.flush()
        return CliResult(code, out.getvalue().decode(), err.getvalue().decode())
