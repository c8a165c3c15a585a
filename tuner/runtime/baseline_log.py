"""The baselines' warnings, kept out of the search's output: appended to a log file instead.

FlashAttention-4's compiler raises UserWarnings of several hundred characters each while it builds a
kernel, and SDPA backends explain themselves the same way: printed, they flooded a search's progress.
Each one raised while a baseline is imported, compiled, checked or timed goes to `log_path()`, with
the baseline and the moment; the search says once where (tuner.search.workers).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Iterator

import platformdirs

LOG_DIR_ENV = "TUNER_LOG_DIR"
LOG_NAME = "baselines.log"
MAX_LOG_BYTES = 4 << 20  # then the log starts afresh, the previous one kept as baselines.log.1

_logged: Counter[str] = Counter()  # warnings logged per baseline in this process, since take_counts()


def log_path() -> Path:
    """TUNER_LOG_DIR/baselines.log, else in the user's log folder (~/.local/state/flashcore-tuner/log)."""
    return Path(os.environ.get(LOG_DIR_ENV) or platformdirs.user_log_dir("flashcore-tuner")) / LOG_NAME


@contextlib.contextmanager
def warnings_logged(impl: str, phase: str) -> Iterator[None]:
    """Warnings raised inside go to the log as raised by baseline `impl` in `phase` (the filters in force
    decide which are raised, as they would for printing: a repeated one once per phase)."""
    with warnings.catch_warnings(record=True) as caught:
        try:
            yield
        finally:
            if caught:
                _write(impl, phase, caught)


def take_counts() -> dict[str, int]:
    """The warnings logged per baseline since the last call (e.g. for one request of the GPU worker)."""
    counts = dict(_logged)
    _logged.clear()
    return counts


def _write(impl: str, phase: str, caught: list[warnings.WarningMessage]) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    text = "".join(f"{stamp} pid {os.getpid()} {impl} ({phase}): {w.category.__name__}: "
                   + str(w.message).replace("\n", "\n    ") + f" [{w.filename}:{w.lineno}]\n" for w in caught)
    path = log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > MAX_LOG_BYTES:
            path.replace(path.with_name(LOG_NAME + ".1"))
        with path.open("a", encoding="utf-8") as log:
            log.write(text)
    except OSError as exc:  # an unwritable log must not stop a search: one line instead of the warnings
        print(f"warning: {len(caught)} warnings of baseline {impl} not logged ({path}: {exc.strerror or exc})",
              file=sys.stderr)
        return
    _logged[impl] += len(caught)
