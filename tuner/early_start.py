"""A search's GPU children started from the command line, before the CLI is even imported.

`tuner search` spends ~2 s importing the CLI (Typer, Optuna, SQLAlchemy) and ~1 s in the CUDA driver's
first call before it knows its GPU profile, while a GPU child needs 4-7 s for torch and its CUDA
context. So the entry point reads the few words it needs (`search`, `--devices`, `--backend`) straight
from argv and starts the children (one card: the GPU child; several: one worker process each, which
starts its own) before anything else; the search adopts them. A guess that turns out wrong costs
nothing but the start: children never adopted are ended (tuner.backends.gpu_process, tuner.search.worker_entry).
"""

from __future__ import annotations

from typing import Optional, Sequence

GLOBAL_OPTIONS_WITH_VALUE = ("--db",)  # the CLI's options before the command (tuner.cli.app)


def _value(args: Sequence[str], option: str) -> Optional[str]:
    """The option's last value, as the CLI takes it."""
    value = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(option + "="):
            value = arg[len(option) + 1:]
    return value


def search_devices(argv: Sequence[str]) -> Optional[tuple[int, ...]]:
    """The devices a `tuner search` measuring on GPUs will use, read from its arguments (None: another
    command, the replay backend, a help request, or devices the CLI will refuse)."""
    args = list(argv)
    while args and (args[0] in GLOBAL_OPTIONS_WITH_VALUE or args[0].split("=", 1)[0] in GLOBAL_OPTIONS_WITH_VALUE):
        args = args[1:] if "=" in args[0] else args[2:]
    if not args or args[0] != "search":
        return None
    rest = args[1:]
    if "--help" in rest or (_value(rest, "--backend") or "gpu").strip().lower() != "gpu":
        return None
    try:
        devices = tuple(int(part) for part in (_value(rest, "--devices") or "0").split(",") if part.strip())
    except ValueError:
        return None
    if not devices or min(devices) < 0 or len(set(devices)) != len(devices):
        return None
    return devices


def start_for(argv: Sequence[str]) -> None:
    """Start the GPU children `argv`'s search will need, if it is one (see search_devices)."""
    devices = search_devices(argv)
    if devices is None:
        return
    from tuner.backends.gpu_process import gpu_environment_likely, prestart

    if not gpu_environment_likely():
        return
    if len(devices) == 1:
        prestart(devices[0])
    else:
        from tuner.search.worker_entry import start_early

        start_early(devices, gpu=True)
