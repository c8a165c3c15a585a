"""`python -m tuner` and the `tuner` console script.

Light on purpose: a process started with multiprocessing's "spawn" (the GPU worker, the worker
processes of a several-card search) re-runs the console script first, so importing this module
must not import the CLI (about 1 s of Optuna, SQLAlchemy, Typer) in every child.
"""


def main() -> None:
    from tuner import stop_signals

    stop_signals.install()  # first: a Ctrl-C or SIGTERM during the imports is one line, exit 130 / 143
    try:
        import sys

        from tuner.early_start import start_for

        start_for(sys.argv[1:])  # a search's GPU children start before the CLI's imports
        from tuner.cli.app import main as cli_main

        cli_main()
    except KeyboardInterrupt:  # stop_signals.Stopped before the CLI could say it
        stop_signals.exit_stopped()
    finally:
        stop_signals.ignore()


if __name__ == "__main__":
    main()
