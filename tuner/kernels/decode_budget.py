"""The decode template's instruction budget (issue 37 item 3): its main loop split by what runs when, and its
per-call code, counted in the static SASS; no GPU needed.

A decode CTA runs its main loop once per K/V tile (sass_budget.main_loop finds it), but not every instruction
of it on every tile: some sit under predicated forward branches (thread 0's refill of the TMA ring and,
inside it, a paged cache's table reads; the partial tile's mask; the last tile's zeroed V rows). Each such
top-level block is named by the instructions it holds, so a table says what every tile pays and what only
some tiles (or only thread 0's warp) pay. Outside the loop is the per-call code: the prologue (Q, the
barriers, the ring's first copies) and the epilogue (the warps' merge, the cluster's merge, O's store), the
fixed cost of a call that short decodes (Sk 1K-8K) feel.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tuner.kernels.sass_budget import Instr, LoopBudget, forward_branches, functions, main_loop


@dataclass(frozen=True)
class Block:
    """A span of the loop under a predicated forward branch, with the blocks nested in it."""

    label: str
    start: int
    end: int
    counts: Counter[str]
    children: tuple[Block, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def own(self) -> Counter[str]:
        """Its instructions outside its nested blocks (a refill's dense copies, beside the paged block)."""
        out = Counter(self.counts)
        for child in self.children:
            out.subtract(child.counts)
        return +out


@dataclass(frozen=True)
class DecodeBudget:
    loop: LoopBudget
    blocks: tuple[Block, ...]  # the loop's top-level conditional blocks
    prologue: Counter[str]     # the function's code before the loop
    epilogue: Counter[str]     # after the loop, to the function's last EXIT (retry stubs after it not counted)
    loop_divisions: int        # runtime integer divisions (I2F.RP: a reciprocal's start) in the loop
    loop_signed: int           # IABS in the loop: signed division or modulo sequences
    call_divisions: int        # the same two in the per-call code (prologue and epilogue)
    call_signed: int

    @property
    def every_tile(self) -> Counter[str]:
        """What every tile runs on every warp: the loop less its conditional blocks."""
        out = Counter(self.loop.counts)
        for block in self.blocks:
            out.subtract(block.counts)
        return +out


PAGED = "paged: table reads, a copy per page"
REFILL = "refill: the ring's K/V copies (thread 0)"
PAGE_READS = "paged: the next refill's table reads, ahead of the math"
ZERO_V = "last tile: V rows past the keys zeroed"
MASK = "partial tile: the mask"


def label(instrs: list[Instr]) -> str:
    """What a conditional block does, by the instructions it holds."""
    ops = {i.opcode for i in instrs}
    if "UTMALDG" in ops:
        return PAGED if "LDG" in ops else REFILL
    if "LDG" in ops:  # the loop reads nothing else from global memory
        return PAGE_READS
    if "STS" in ops and not ops & {"HMMA", "LDSM"}:
        return ZERO_V
    if any(i.opcode == "FSEL" and "-INF" in i.text for i in instrs):
        return MASK
    return "other"


def _spans(instrs: list[Instr], first: int, last: int) -> list[tuple[int, int]]:
    """(first, last) of each span first..last that a predicated forward branch inside it jumps over."""
    return [(i + 1, target - 1) for i, target in forward_branches(instrs, first, last) if i + 1 <= target - 1 <= last]


def _top(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The outermost spans; spans that overlap without nesting are joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _blocks(instrs: list[Instr], spans: list[tuple[int, int]], first: int, last: int) -> tuple[Block, ...]:
    """The top-level blocks of first..last, each with the nested blocks that do something else."""
    found = []
    for a, b in _top([s for s in spans if first <= s[0] and s[1] <= last and s != (first, last)]):
        inner = [s for s in spans if a <= s[0] and s[1] <= b and s != (a, b)]
        kids = _blocks(instrs, inner, a, b) if inner else ()
        body = instrs[a:b + 1]
        name = label(body)
        if name == PAGED and any(k.label == PAGED for k in kids):
            name = REFILL  # the refill holding the paged path: its own copies are the dense ones
        found.append(Block(name, body[0].addr, body[-1].addr, Counter(i.opcode for i in body),
                           _flatten(kids, name)))
    return tuple(found)


def _flatten(kids: tuple[Block, ...], name: str) -> tuple[Block, ...]:
    """Nested blocks doing what their parent does are part of it (every guard inside a paged block is)."""
    out: list[Block] = []
    for k in kids:
        if k.label == name or name == PAGED:
            out.extend(_flatten(k.children, name))
        else:
            out.append(k)
    return tuple(out)


def decode_budget(sass: str, function: str | None = None) -> DecodeBudget:
    """The decode kernel `function`'s budget (default: the first function with a tensor-core loop)."""
    loop = main_loop(sass, function)
    instrs = functions(sass)[loop.function]
    at = {ins.addr: i for i, ins in enumerate(instrs)}
    first, last = at[loop.start], at[loop.end]
    end = max(i for i, ins in enumerate(instrs) if ins.opcode == "EXIT")
    body, call = instrs[first:last + 1], instrs[:first] + instrs[last + 1:end + 1]
    return DecodeBudget(loop, _blocks(instrs, _spans(instrs, first, last), first, last),
                        Counter(i.opcode for i in instrs[:first]), Counter(i.opcode for i in instrs[last + 1:end + 1]),
                        *_divisions(body), *_divisions(call))


def _divisions(instrs: list[Instr]) -> tuple[int, int]:
    """(runtime integer divisions, IABS): each division by a runtime value starts its reciprocal with
    I2F(.U32).RP; a signed one takes its operands' absolute values first."""
    return (sum(1 for i in instrs if i.opcode == "I2F" and ".RP" in i.mnemonic),
            sum(1 for i in instrs if i.opcode == "IABS"))

