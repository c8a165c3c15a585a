"""The GPU worker's fixed costs: what it sets up once and how long each part took.

- The baselines' imports (FlashAttention-4's `flash_attn.cute`: seconds of its compiler's start-up) run on a
  thread from the worker's start, while the search prepares its studies and compiles its first trials; the
  first request that needs a baseline waits for them (start_baseline_imports, await_baseline_imports).
- Spent: seconds by named part (inputs, reference, module load, verification, input checksum, baseline set-up),
  which the worker sends after each request so that the search's time breakdown names them.
- PerInputs: what is made once for a problem's inputs and reused by every request on them (the baselines, whose
  first calls compile FA4's kernel and build cuDNN's plan; each confirm round asked for them again).
- fingerprint: a checksum of a problem's inputs and reference, so that a wrong kernel's result costs a
  rebuild only when it wrote into them.
- setup_seconds: how long the worker may take over a problem's set-up (its inputs, the fp32 reference, the
  error and checksum after a verify launch, the baselines' set-up): a limit that grows with the reference's
  work, apart from the watchdog, which bounds a kernel's own launch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Iterator, Optional

from tuner.problem import Problem
from tuner.runtime.baselines import import_baselines
from tuner.runtime.verify import FULL_REFERENCE_SCORES, sampled_rows

INPUTS = "inputs"  # q, k, v and their layout's copies (pages, packed sequences)
REFERENCE = "reference"  # the fp32 reference output
MODULE_LOAD = "module load"  # a variant's cubin loaded (cuLibraryLoadData), its output allocated and poisoned
VERIFICATION = "verification"  # a variant's checked launch and its error against the reference
CHECKSUM = "input checksum"  # the inputs' and reference's byte sums after a verify launch (fingerprint)
BASELINE_SETUP = "baseline set-up"  # the baselines' imports (waited for), first calls and compiles
# Problems whose inputs and fp32 reference the GPU worker keeps (hundreds of MB each at long sequences), and with
# them their baselines (PerInputs).
KEPT_INPUTS = 2

# The fp32 reference's rate (multiply-adds of its two matmuls, 4 x scores x D flop, per second) that the set-up
# limit allows for: an H200 built a 4.5 s reference at B1 H28 S16384 D128 (~8e11 flop/s); this is 10x slower,
# for smaller cards and the passes besides the matmuls (softmax, masks, the inputs, the error in fp64).
REFERENCE_FLOPS_PER_S = 1e11

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


class PerInputs:
    """Values made once per problem's inputs (a problem and its inputs' seed: rebuilt inputs get new ones), for the
    `keep` most recent inputs (the GPU worker's: as many as it keeps problems' inputs)."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._made: dict[tuple[Problem, int], Any] = {}

    def get(self, problem: Problem, data: dict[str, Any], make: Callable[[], Any]) -> Any:
        key = (problem, data["seed"])
        if key not in self._made:
            while len(self._made) >= self._keep:
                self._made.pop(next(iter(self._made)))
            self._made[key] = make()
        return self._made[key]

    def clear(self) -> None:
        self._made.clear()


def fingerprint(value: Any) -> tuple[int, ...]:
    """The byte sums of every tensor in `value` (dicts, lists, tuples and dataclasses are walked): a kernel that
    wrote past its output into any of them changes it (unless it wrote the very bytes that were there).

    Each tensor is summed where it lies, through a byte view of its own strides (no copy of a transposed
    input), and the sums of one device come back in one transfer: one host wait per device, not one per
    tensor (a problem at S16384 holds hundreds of MB in several tensors)."""
    import torch

    sums = [_byte_sum(t) for t in _tensors(value)]
    by_device: dict[Any, list[int]] = {}
    for i, s in enumerate(sums):
        by_device.setdefault(s.device, []).append(i)
    out = [0] * len(sums)
    for indices in by_device.values():
        for i, total in zip(indices, torch.stack([sums[i] for i in indices]).tolist()):
            out[i] = int(total)
    return tuple(out)


def _byte_sum(t: Any) -> Any:
    """The sum of a tensor's bytes as an int64 tensor on its device (not waited for)."""
    import torch

    t = t.detach()
    if t.dim() == 0 or t.stride(-1) != 1:  # a byte view needs a contiguous last dimension
        t = t.reshape(-1).contiguous()
    return t.view(torch.uint8).sum(dtype=torch.int64)


# The matmuls of a backward's reference over a forward's: the forward (2), autograd's dV, dP, dQ, dK (4) and the
# noise floors' five (runtime.backward_verify.grad_noise_floors), rounded up.
BACKWARD_REFERENCE_WORK = 6.0


def setup_seconds(problem: Problem, base_s: float) -> float:
    """The limit on one set-up phase of `problem` in the GPU worker: `base_s` (the worker's start-up limit, what
    any set-up may take) plus the fp32 reference's flops (every query row, or the sampled ones past
    FULL_REFERENCE_SCORES scores a head) at REFERENCE_FLOPS_PER_S. A backward's reference covers every row: its
    forward, autograd's gradients and their noise floors, BACKWARD_REFERENCE_WORK times a forward's matmuls."""
    rows = problem.seq_q
    if problem.seq_q * problem.seq_k > FULL_REFERENCE_SCORES and not problem.backward:
        rows = len(sampled_rows(problem.seq_q) or ()) or problem.seq_q
    flops = 4.0 * problem.batch * problem.heads * rows * problem.seq_k * problem.head_dim
    if problem.backward:
        flops *= BACKWARD_REFERENCE_WORK
    return base_s + flops / REFERENCE_FLOPS_PER_S


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
