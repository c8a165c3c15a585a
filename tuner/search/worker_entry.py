"""The entry of a worker process (a search on several cards): its GPU worker child is started first.

Kept light on purpose. The child's torch import and CUDA context take 4-7 s; the worker's own imports
(Optuna, SQLAlchemy: 1-2 s) and study loading then run while the child starts, instead of before it.
The process is started at the top of a search, before the parent has prepared the studies; the worker's
spec arrives later, pickled, through `inbox`, and is read only after the child is on its way, since
reading it imports the search modules.
"""

from __future__ import annotations

import pickle
import signal
from typing import Any, Optional


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def worker_process_main(device: int, gpu_profile: Optional[str], inbox: Any, events: Any, stop: Any) -> None:
    """Start the GPU child of `device` (gpu_profile None: not the GPU backend), then run the worker on the
    spec `inbox` brings (None: the search ended before it had work for this worker)."""
    # First of all: Ctrl-C reaches the whole process group but is the parent's to handle (it sets
    # `stop`); the parent's SIGTERM (a second Ctrl-C) aborts, as an exception, so the worker stores
    # what it was doing and the GPU child started below is stopped on the way out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    profile = None
    if gpu_profile is not None:
        try:
            from tuner.backends.gpu_process import prestart
            from tuner.profiles import load_profile

            profile = load_profile(gpu_profile)
            prestart(profile, device)
        except Exception:  # noqa: BLE001 - only a head start: the backend starts (and reports) it itself
            profile = None
    spec = inbox.get()
    if spec is None:
        if profile is not None:
            from tuner.backends.gpu_process import discard_prestarted

            discard_prestarted(profile, device)
        return
    from tuner.search.workers import child_main

    child_main(pickle.loads(spec), events, stop)
