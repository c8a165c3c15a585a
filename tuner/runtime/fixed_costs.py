"""The GPU worker's fixed costs: what it sets up once and how long each part took.

- The baselines' imports (FlashAttention-4's `flash_attn.cute`: seconds of its compiler's start-up) run on a
  thread from the worker's start, while the search prepares its studies and compiles its first trials; the
  first request that needs a baseline waits for them (start_baseline_imports, await_baseline_imports).
- Spent: seconds by named part (inputs, reference, verification, baseline set-up), which the worker sends
  after each request so that the search's time breakdown names them.
- fingerprint: a checksum of a problem's inputs and reference, so that a wrong kernel's result costs a
  rebuild only when it wrote into them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Iterator, Optional

from tuner.runtime.baselines import import_baselines

INPUTS = "inputs"  # q, k, v and their layout's copies (pages, packed sequences)
REFERENCE = "reference"  # the fp32 reference output
VERIFICATION = "verification"  # a variant's checked launch and its error against the reference
BASELINE_SETUP = "baseline set-up"  # the baselines' imports (waited for), first calls and compiles

_imports: dict[str, threading.Thread] = {}  # one per process: "baselines" once started


def start_baseline_imports(device: int) -> None:
    """Import the baselines' libraries on a thread (once per process) and return at once."""
    if "baselines" not in _imports:
        thread = threading.Thread(target=_import_on, args=(device,), name="tuner-baseline-imports", daemon=True)
        _imports["baselines"] = thread
        thread.start()


def await_baseline_imports() -> None:
    """Wait for start_baseline_imports' thread, if one was started (a later import is then a lookup)."""
    thread = _imports.get("baselines")
    if thread is not None:
        thread.join()


def _import_on(device: int) -> None:
    import torch

    if torch.cuda.is_available():  # a thread starts on device 0: an import that asks CUDA asks the worker's card
        torch.cuda.set_device(device)
    import_baselines()


class Spent:
    """Seconds by part since the last take()."""

    def __init__(self, sync: Optional[Callable[[], None]] = None) -> None:
        self._sync = sync  # waits for the GPU's queued work, so that a part's seconds are its own
        self._seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
            if self._sync is not None:
                self._sync()
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - started

    def take(self) -> dict[str, float]:
        taken, self._seconds = self._seconds, {}
        return taken


def fingerprint(value: Any) -> tuple[int, ...]:
    """The byte sums of every tensor in `value` (dicts, lists, tuples and dataclasses are walked): a kernel that
    wrote past its output into any of them changes it (unless it wrote the very bytes that were there)."""
    import torch

    return tuple(int(t.detach().reshape(-1).view(torch.uint8).sum(dtype=torch.int64)) for t in _tensors(value))


def _tensors(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _tensors(getattr(value, field.name))
