"""The `tuner` command line: the app, its global options, and the one-line error contract.

Commands live by group (catalog, store, search, output) and stay thin: parse,
call one service function, print (tuner.cli.tables builds what is printed).
"""

from __future__ import annotations

import sys
import warnings
from typing import Annotated, Optional

import typer

from tuner import stop_signals
from tuner.cli import catalog_commands, output_commands, search_commands, store_commands
from tuner.cli.state import err_console, refresh_consoles, say, state, store_epilog
from tuner.errors import TunerError
from tuner.search.hooks import Hooks


def build_app() -> typer.Typer:
    """The `tuner` app; built per call so that help texts name the store of this environment."""
    app = typer.Typer(
        name="tuner",
        help="Autotune and profile fused attention kernels on NVIDIA GPUs.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode=None,  # click's plain help: a flag reads `--causal`, not `--causal <bool>`
    )
    app.callback()(_root)
    epilog = store_epilog()
    for name, command, needs_store in (
        ("profiles", catalog_commands.profiles_command, False),
        ("space", catalog_commands.space_command, False),
        ("render", catalog_commands.render_command, True),
        ("results", store_commands.results_command, True),
        ("show", store_commands.show_command, True),
        ("search", search_commands.search_command, True),
        ("worker", search_commands.worker_command, True),
        ("confirm", search_commands.confirm_command, True),
        ("profile", output_commands.profile_command, True),
        ("export", output_commands.export_command, True),
        ("report", output_commands.report_command, True),
        ("replay-eval", output_commands.replay_eval_command, False),
    ):
        app.command(name, epilog=epilog if needs_store else None)(command)
    db_app = typer.Typer(help="The results store: schema revision and migrations.", no_args_is_help=True,
                         rich_markup_mode=None)
    db_app.command("info", epilog=epilog)(store_commands.db_info_command)
    db_app.command("upgrade", epilog=epilog)(store_commands.db_upgrade_command)
    db_app.command("downgrade", epilog=epilog)(store_commands.db_downgrade_command)
    app.add_typer(db_app, name="db", epilog=epilog)
    return app


def _root(
    db: Annotated[
        Optional[str],
        typer.Option("--db", envvar="TUNER_DB", help="Results store URL (sqlite:///path or postgresql://...)."),
    ] = None,
) -> None:
    state.db_url = db
    refresh_consoles()  # every invocation sizes its tables from its own environment


# Usage errors (bad option, unknown command) print click's short message. Recent
# typer releases vendor click as typer._click and no longer depend on click itself.
_CLICK_ERRORS: tuple[type[Exception], ...] = ()
try:
    from typer._click.exceptions import ClickException as _TyperClickException

    _CLICK_ERRORS += (_TyperClickException,)
except ImportError:  # a typer that uses click itself
    pass
try:
    from click import ClickException as _ClickException

    _CLICK_ERRORS += (_ClickException,)
except ImportError:
    pass


def main(hooks: Hooks = Hooks()) -> None:
    """Console-script entry: user errors become one line on stderr and exit code 2.

    `hooks` replace the search's backend, builder and clock (tests run the CLI with fakes).
    """
    # Python's warnings (profile/card mismatch with --force, SM count) as one line each.
    previous = warnings.showwarning
    warnings.showwarning = lambda message, *_args, **_kw: say(f"warning: {message}", stderr=True)
    state.hooks = hooks
    stop_signals.reset()  # this invocation's signals (tests run the CLI several times in one process)
    try:
        _run_app()
    finally:
        warnings.showwarning = previous


def _run_app() -> None:
    try:
        # Without standalone mode click returns an Exit's code instead of exiting.
        code = build_app()(standalone_mode=False)
    except TunerError as exc:
        say(f"error: {exc}", stderr=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        stop_signals.work_done()  # nothing left to abort: a further signal must not cut the exit short
        err_console.print(stop_signals.stopped_line(), markup=False)
        sys.exit(stop_signals.exit_code())  # 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except _CLICK_ERRORS as exc:  # bad usage: click's own message, no traceback
        exc.show()
        sys.exit(exc.exit_code)
    if isinstance(code, int) and code:
        sys.exit(code)
