"""Which dispatch cells `tuner export --check` measures, and what it decides from the timings (no GPU here).

A cell is a dispatch key (dtype, head dim, causal, window, softcap, GQA group, log2
buckets of Sq, Sk and batch x heads, page size and lengths kind) measured at one representative shape, in its
K/V layout and length distribution: a paged or ragged tuned problem is timed as such. Besides every
tuned problem, the check covers the shapes a model meets in serving for each
(dtype, head dim, causal, heads, K/V heads) the export was tuned for: prefill
batches of 16K tokens from 512 to 16384 long, and decode steps (Sq 1 at short
and long contexts, and a 4-token speculative verify), so that no call a model makes lands on an unmeasured cell
whose nearest tuned kernel happens to lose. The decode steps keep the tuned problem's layout and lengths (a dense
ragged kind's also at full lengths: calls without seq_lens); the prefill batches are dense at full lengths, the
only form in which such long queries run a kernel (only the decode kernels read pages and per-row lengths: other
calls with them run masked SDPA whatever a cell says). A packed entry's (attention_varlen's) cells are its tuned
batch and packed serving batches of about 16K tokens, timed against the package's per-sequence fallback
(tuner.export.check_packed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from tuner.export.selection import ROUTE_BELOW, best_per_round, dispatch_key  # one threshold for entries and cells
from tuner.runtime.shipped.dispatch import DispatchTable, Key, seq_bucket
from tuner.models import DECODE
from tuner.problem import FULL_LENGTHS, Problem, parse_lengths
from tuner.runtime.timing import per_round_ratio

PREFILL_TOKENS = 16384  # a prefill batch: B x S tokens
PREFILL_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
MAX_CANDIDATES = 4  # kernels timed per cell: the rule's choice and its nearest rivals


@dataclass(frozen=True)
class CheckCell:
    problem: Problem  # the representative shape timed for the cell
    key: Key
    candidates: tuple[Mapping[str, Any], ...]  # manifest entries whose kernels are timed, the rule's choice first


def serving_problems(tuned: Problem) -> list[Problem]:
    """The prefill and decode shapes of a model with `tuned`'s heads, head dim, dtype, causality, window and
    softcap (a layer kind of the model: its kernels serve only calls of its own window and softcap); the decode
    steps in its layout and length distribution, the prefill batches dense at full lengths. A packed kernel's: packed
    batches of about PREFILL_TOKENS tokens."""
    base = dict(heads=tuned.heads, heads_kv=tuned.heads_kv, head_dim=tuned.head_dim, dtype=tuned.dtype,
                causal=tuned.causal, window_left=tuned.window_left, window_right=tuned.window_right,
                softcap=tuned.softcap)
    if tuned.packed:  # packed calls take only packed kernels: batches of 1 to s tokens a sequence (s/2 on average)
        return [packed_batch(s, base) for s in PREFILL_LENGTHS]
    dense = "bhsd" if tuned.page_size else tuned.layout
    found = [Problem(batch=max(1, PREFILL_TOKENS // s), seq_q=s, seq_k=s, layout=dense, **base)
             for s in PREFILL_LENGTHS]
    decode = [(b, sq, ctx, lengths_at(tuned, ctx)) for b, sq, ctx in DECODE]  # the steps `tuner search --model` tunes
    if tuned.ragged and not tuned.page_size:  # a dense cache's equal rows (a dynamic cache's) come without seq_lens
        decode += [(b, sq, ctx, FULL_LENGTHS) for b, sq, ctx in DECODE]
    found += [Problem(batch=b, seq_q=sq, seq_k=ctx, layout=tuned.layout, lengths=lengths, **base)
              for b, sq, ctx, lengths in decode]
    return found


def packed_batch(s: int, base: dict[str, Any]) -> Problem:
    """About PREFILL_TOKENS tokens in sequences of 1 to s tokens whose longest is over s/2, so that the batch
    lies in s's dispatch cell (a packed call's key is its longest sequence's): the first batch size from
    2 * PREFILL_TOKENS / s whose seeded draw reaches that far (each size draws afresh; half of the draws of even
    two sequences do)."""
    first = max(1, 2 * PREFILL_TOKENS // s)
    for batch in range(first, first + 64):  # all 64 draws falling short: a chance of 2^-64
        problem = Problem(batch=batch, seq_q=s, seq_k=s, layout="packed", lengths="uniform:1", **base)
        if seq_bucket(max(problem.key_lengths())) == seq_bucket(s):
            return problem
    raise RuntimeError(f"no packed batch of {first} to {first + 63} sequences reaches past {s // 2} tokens")


def lengths_at(tuned: Problem, seq_k: int) -> str:
    """`tuned`'s length distribution at a context of `seq_k` keys: the same lowest fraction of it."""
    low = parse_lengths(tuned.lengths, tuned.seq_k)
    return FULL_LENGTHS if low is None else f"uniform:{max(1, low * seq_k // tuned.seq_k)}"


def check_cells(entries: list[Mapping[str, Any]]) -> list[CheckCell]:
    """One cell per dispatch key met by the tuned problems and their serving shapes (tuned problems first)."""
    table = DispatchTable(list(entries))
    tuned = [Problem.from_dict(e["problem"]) for e in table.entries]
    cells: dict[Key, CheckCell] = {}
    for problem in tuned + [p for t in tuned for p in serving_problems(t)]:
        key = dispatch_key(problem)
        if key in cells:
            continue
        ranked, kernels = [], set()
        for _, entry in table.ranked(key):
            if entry["kernel"] not in kernels:  # one timing per kernel, whichever entry shipped it
                kernels.add(entry["kernel"])
                ranked.append(entry)
        if ranked:
            cells[key] = CheckCell(problem, key, tuple(ranked[:MAX_CANDIDATES]))
    return list(cells.values())


def median_ratios(times: Mapping[str, list[float]], kernels: list[str], baselines: list[str]) -> dict[str, float]:
    """Per kernel, the median over the rounds of (the best SDPA backend's µs in the round) / (the kernel's);
    `times` holds each implementation's µs per round (tuner.runtime.timing.interleaved_rounds)."""
    best = best_per_round([times[b] for b in baselines])
    return {name: per_round_ratio(best, times[name]) for name in kernels if times.get(name)}


def decide(cell: CheckCell, ratios: Mapping[str, float], sdpa: Mapping[str, float], errors: Mapping[str, str],
           kernel_us: Mapping[str, float]) -> dict[str, Any]:
    """The manifest record of a measured cell: the fastest verified kernel, or SDPA where it loses.

    `ratios` maps kernel name -> median ratio to the best SDPA backend, `sdpa` backend name -> median us,
    `errors` kernel name -> why it was not timed (does not fit, wrong result), `kernel_us` name -> median us.
    """
    best: Optional[str] = max(ratios, key=lambda n: ratios[n]) if ratios else None
    entry = next((e for e in cell.candidates if e["kernel"] == best), cell.candidates[0])
    sdpa_impl = min(sdpa, key=lambda n: sdpa[n]) if sdpa else None
    ratio = ratios.get(best) if best else None
    if not sdpa:  # no SDPA backend takes the shape: the kernel is all there is
        route = "kernel" if best else "sdpa"
    else:
        route = "kernel" if ratio is not None and ratio >= ROUTE_BELOW else "sdpa"
    return {
        "key": dict(cell.key.__dict__),
        "problem": cell.problem.to_dict(),
        "problem_label": cell.problem.label,
        "route": route,
        "trial_id": entry["trial_id"],
        "kernel": best,
        "ratio": ratio,
        "kernel_us": kernel_us.get(best) if best else None,
        "sdpa_impl": sdpa_impl,
        "sdpa_us": sdpa.get(sdpa_impl) if sdpa_impl else None,
        "candidates": [{"kernel": e["kernel"], "trial_id": e["trial_id"], "ratio": ratios.get(e["kernel"]),
                        "error": errors.get(e["kernel"])} for e in cell.candidates],
    }


def cell_line(record: Mapping[str, Any]) -> str:
    """One line per measured cell for the CLI."""
    where = f"{record['problem_label']:<40}"
    if record["kernel"] is None:
        return f"{where} -> SDPA  (no candidate kernel verified)"
    ratio = f"{record['ratio']:.2f}x {record['sdpa_impl']}" if record["ratio"] is not None else "no SDPA backend"
    verdict = "kernel" if record["route"] == "kernel" else "-> SDPA"
    return f"{where} {verdict:<8} {record['kernel']} {ratio}"


def checked_summary(records: list[Mapping[str, Any]]) -> str:
    routed = sum(r["route"] == "sdpa" for r in records)
    kept = [r["ratio"] for r in records if r["route"] == "kernel" and r["ratio"] is not None]
    low = f"; slowest kernel cell {min(kept):.2f}x SDPA" if kept else ""
    return f"checked {len(records)} cells: {len(records) - routed} run a tuned kernel, {routed} run SDPA{low}"
