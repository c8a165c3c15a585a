"""The entry of a worker process (a search on several cards): its GPU worker child is started first.

Kept light on purpose. The child's torch import and CUDA context take 4-7 s; the worker's own imports
(Optuna, SQLAlchemy: 1-2 s) and study loading then run while the child starts, instead of before it.
The worker's spec arrives pickled and is read only after the child is on its way, since reading it
imports the search modules.
"""

from __future__ import annotations

import pickle
from typing import Any, Optional


def worker_process_main(device: int, gpu_profile: Optional[str], spec: bytes, events: Any, stop: Any) -> None:
    """Start the GPU child of `device` (gpu_profile None: not the GPU backend), then run the worker."""
    if gpu_profile is not None:
        from tuner.backends.gpu import prestart
        from tuner.profiles import load_profile

        prestart(load_profile(gpu_profile), device)
    from tuner.search.workers import child_main

    child_main(pickle.loads(spec), events, stop)
