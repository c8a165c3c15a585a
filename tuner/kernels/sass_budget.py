"""The instruction budget of a kernel's main loop, counted in its static SASS (cuobjdump -sass), no GPU needed.

A variant's speed is counted before it is timed: when two kernels do the same math, the non-math
instructions of the loop that runs once per K/V tile are where their cycles differ (benchmarks/NOTES.md,
issue 37). The main loop is the loop (a backward branch and the instructions it jumps back over) that
holds tensor-core instructions and is the shortest such (the outer loops over work items span it; the
branches back from out-of-line barrier retries, after the function's EXIT, do not count as loops): one
iteration is one K/V tile. Its opcode counts are what `benchmarks/sass_budget.py` tabulates and what the
kernel tests hold.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# Tensor-core instructions: sm_90 wgmma (16-bit and FP8) and sm_80 mma.sync.
TENSOR_OPS = frozenset({"HGMMA", "QGMMA", "HMMA"})
# The softmax and the GEMMs: what both kernels of a comparison must execute alike.
MATH_OPS = frozenset({"HGMMA", "QGMMA", "HMMA", "FMUL", "FFMA", "FADD", "FMNMX", "MUFU", "F2FP", "FSEL"})

_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
# `BRA P1, 0x...` (a second predicate, taken where both hold) branches too.
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(?:!?U?P[T0-9],\s*)?(?:0x([0-9a-f]+)|`\(\.L_x_\d+\))")


@dataclass(frozen=True)
class Instr:
    addr: int
    text: str

    @property
    def mnemonic(self) -> str:
        """The opcode with its modifiers, without a predicate: `@!P0 I2F.U32.RP R5, R4` -> I2F.U32.RP."""
        words = self.text.split()
        return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]

    @property
    def opcode(self) -> str:
        """The opcode without its modifiers or predicate: `@!P0 SYNCS.ARRIVE.TRANS64 ...` -> SYNCS."""
        return self.mnemonic.split(".")[0]

    @property
    def branch_target(self) -> int | None:
        m = _BRANCH.search(self.text)
        return int(m.group(1), 16) if m and m.group(1) else None


@dataclass(frozen=True)
class LoopBudget:
    """One loop of a kernel: where it is and what one iteration holds, by opcode."""

    function: str
    start: int
    end: int
    counts: Counter[str]
    # Those under a predicated forward branch inside the loop (a partial tile's mask): run on some tiles only.
    conditional: int = 0
    # K/V tiles one iteration does: 2 where the loop is unrolled by two (attn_fwd_wgmma's TWO_P).
    tiles: int = 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def non_math(self) -> int:
        return sum(n for op, n in self.counts.items() if op not in MATH_OPS)

    def per_tile(self, n: int) -> float:
        """`n` instructions of one iteration as per K/V tile."""
        return n / self.tiles


def functions(sass: str) -> dict[str, list[Instr]]:
    """Each function of cuobjdump's text, its instructions in address order."""
    out: dict[str, list[Instr]] = {}
    for part in sass.split("Function : ")[1:]:
        name = part.split(None, 1)[0]
        out[name] = [Instr(int(m.group(1), 16), m.group(2).strip()) for m in _INSTR.finditer(part)]
    return out


def loops(instrs: list[Instr]) -> list[tuple[int, int]]:
    """(first, last) indices of every loop: a branch back to an earlier instruction of the same function."""
    at = {ins.addr: i for i, ins in enumerate(instrs)}
    found = []
    for i, ins in enumerate(instrs):
        target = ins.branch_target
        if target is not None and target <= ins.addr and target in at:
            found.append((at[target], i))
    return found


def main_loop(sass: str, function: str | None = None) -> LoopBudget:
    """The main loop of `function` (default: the first function with tensor-core instructions): the shortest
    loop holding tensor-core instructions. ValueError where there is none."""
    for name, instrs in functions(sass).items():
        if function is not None and name != function:
            continue
        best: tuple[int, int, int] | None = None  # (length, first, last)
        for first, last in loops(instrs):
            body = instrs[first:last + 1]
            # A barrier retry stub placed after the function's EXIT branches back into the loop: the span it
            # makes holds that EXIT, and can be shorter than the real loop (it starts mid-loop).
            if not any(ins.opcode in TENSOR_OPS for ins in body) or any(ins.opcode == "EXIT" for ins in body):
                continue
            key = (last - first + 1, first, last)
            if best is None or key < best:
                best = key
        if best is not None:
            _, first, last = best
            body = instrs[first:last + 1]
            return LoopBudget(name, body[0].addr, body[-1].addr, Counter(ins.opcode for ins in body),
                              len(_skippable(instrs, first, last)), max(1, sum(map(_starts_a_tile, body))))
        if function is not None:
            break
    raise ValueError(f"no loop with tensor-core instructions in {function or 'any function'}")


def _starts_a_tile(ins: Instr) -> bool:
    """A wgmma that overwrites its accumulator (`RZ, !UPT`): a tile's first Q K^T step; a P V accumulates."""
    return ins.opcode in ("HGMMA", "QGMMA") and ", RZ, !UPT" in ins.text


_WAIT_GROUP = re.compile(r"^WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)")


def exp2_under_pv(sass: str, function: str | None = None) -> tuple[int, int]:
    """(overlapped, total) exp2 of the main loop's softmax: the MUFU.EX2 that come after the loop's
    wait for S (wgmma.wait_group 1) with no wait for every wgmma (wait_group 0, which includes the P V in
    flight) between them, i.e. the exp2 that run while the tensor cores do P V. ptxas is free to hoist a
    wait above the exp2s of its block; where it does, the softmax does not overlap P V (0 of 64)."""
    loop = main_loop(sass, function)
    body = [i for i in functions(sass)[loop.function] if loop.start <= i.addr <= loop.end]
    total = sum(1 for i in body if i.text.startswith("MUFU.EX2"))
    overlapped, after_s = 0, False
    for ins in body:
        m = _WAIT_GROUP.match(ins.text)
        if m:
            after_s = int(m.group(1), 16) > 0  # a wait that leaves one group (P V) in flight
        elif after_s and ins.text.startswith("MUFU.EX2"):
            overlapped += 1
    return overlapped, total


def f2fp_after_full_wait(sass: str, function: str | None = None) -> int:
    """The main loop's F2FP (P's conversions) between a wait for every wgmma (wait_group 0) and the next
    tensor-core instruction, or the loop's end: conversions the next Q K^T issue waits behind. The rotated 16-bit
    loop packs all of P there (32 at BN 128); with two P sets (TWO_P) S is packed after its softmax, none."""
    loop = main_loop(sass, function)
    body = [i for i in functions(sass)[loop.function] if loop.start <= i.addr <= loop.end]
    found, after_wait = 0, False
    for ins in body:
        m = _WAIT_GROUP.match(ins.text)
        if m:
            after_wait = int(m.group(1), 16) == 0
        elif ins.opcode in TENSOR_OPS:
            after_wait = False
        elif after_wait and ins.opcode == "F2FP":
            found += 1
    return found


def cuobjdump(cubin: bytes, option: str) -> str:
    """cuobjdump's output for a cubin given as bytes, e.g. option "-sass" or "-res-usage" (cuobjdump from the CUDA
    toolkit or the nvidia-cuda-cuobjdump wheel)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        raise FileNotFoundError("cuobjdump is not on PATH (CUDA toolkit, or pip install nvidia-cuda-cuobjdump)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([tool, option, str(path)], capture_output=True, text=True, check=True).stdout


def cubin_sass(cubin: bytes) -> str:
    """cuobjdump's SASS of a cubin."""
    return cuobjdump(cubin, "-sass")


def forward_branches(instrs: list[Instr], first: int, last: int) -> list[tuple[int, int]]:
    """(branch, target) indices of each predicated forward branch in first..last to an instruction of the
    function (the target may lie past `last`: callers bound it)."""
    at = {ins.addr: i for i, ins in enumerate(instrs)}
    found = []
    for i in range(first, last + 1):
        target = instrs[i].branch_target
        if instrs[i].text.startswith("@") and target is not None and target > instrs[i].addr and target in at:
            found.append((i, at[target]))
    return found


def _skippable(instrs: list[Instr], first: int, last: int, around: tuple[int, int] | None = None) -> set[int]:
    """Indices in first..last that a predicated forward branch from within first..last to within it jumps over
    (a branch to a retry stub leaves the span and counts not); with `around`, not the branches over all of it."""
    covered: set[int] = set()
    for i, end in forward_branches(instrs, first, last):
        if end <= last and not (around and i < around[0] and end > around[1]):
            covered.update(range(i + 1, end))
    return covered


@dataclass(frozen=True)
class ItemBudget(LoopBudget):
    """A consumer's per-work-item code: the instructions it runs once per item outside the main loop (item
    decode, tile range, the prologue's first tile, the last P V, the epilogue), by opcode. `conditional`: those
    of them under a predicated forward branch (run on some items only: a partial tile's mask, an empty item's
    store, the lse rows), so `total - conditional` is what every item runs at least. `persistent`: counted in
    the outer loop over items (else one item per CTA)."""

    persistent: bool = False


def item_code(sass: str, function: str | None = None) -> ItemBudget:
    """The per-item code of `function`'s consumer around its main loop (main_loop). Persistent kernels: the
    body of the shortest loop spanning the main loop whose body holds no unpredicated EXIT (the outer loop over
    items, which may hold a predicated one: ptxas can copy the kernel's end to where the walk over items ends;
    a barrier retry stub after the function's EXIT also branches back over the main loop, its span holds that
    EXIT). One item
    per CTA: from the instruction after the last loop that ends before the main loop (the consumer's
    setmaxnreg retry) to the first unpredicated EXIT after it. Either way less the main loop itself."""
    loop = main_loop(sass, function)
    instrs = functions(sass)[loop.function]
    at = {ins.addr: i for i, ins in enumerate(instrs)}
    m_first, m_last = at[loop.start], at[loop.end]
    outer = [(last - first, first, last) for first, last in loops(instrs)
             if first <= m_first and last >= m_last and (first, last) != (m_first, m_last)
             and not any(ins.opcode == "EXIT" and not ins.text.startswith("@") for ins in instrs[first:last + 1])]
    if outer:
        _, first, last = min(outer)
    else:
        first = max([last + 1 for _, last in loops(instrs) if last < m_first], default=0)
        last = next(i for i in range(m_last + 1, len(instrs))
                    if instrs[i].opcode == "EXIT" and not instrs[i].text.startswith("@"))
    region = [i for i in range(first, last + 1) if not m_first <= i <= m_last]
    # Conditional: skipped by a predicated forward branch within the region that does not span the main loop
    # (a branch around the whole tile work is the empty item's).
    covered = _skippable(instrs, first, last, around=(m_first, m_last))
    return ItemBudget(loop.function, instrs[first].addr, instrs[last].addr,
                      Counter(instrs[i].opcode for i in region),
                      sum(1 for i in region if i in covered), persistent=bool(outer))
