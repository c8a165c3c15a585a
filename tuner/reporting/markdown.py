"""Small text helpers shared by the report and replay-eval: markdown tables, numbers, run captions."""

from __future__ import annotations

import math
from typing import Iterable, Optional


def fmt(value: Optional[float], spec: str, suffix: str = "") -> str:
    """A number in `spec`, or '-' when missing or not finite."""
    return "-" if value is None or not math.isfinite(value) else f"{value:{spec}}{suffix}"


def table(header: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    """Lines of a markdown table (and a blank line); columns from `right_from` on are right-aligned."""
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    cell = lambda text: text.replace("|", "\\|").replace("\n", " ")  # noqa: E731  (a | would split the cell)
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(cell(c) for c in r) + " |" for r in rows), ""]


def runs_text(run_ids: Iterable[int]) -> str:
    """'run 3' or 'runs 3, 4'."""
    ids = sorted(set(run_ids))
    return ("run " if len(ids) == 1 else "runs ") + ", ".join(map(str, ids))


def run_caption(gpu_name: str, run_ids: Iterable[int], date: str, synthetic: bool, replayed: bool = False) -> str:
    """Which card and run(s) produced a number: 'NVIDIA H100, runs 3, 4, 2025-01-31'."""
    note = " (SYNTHETIC data, not measured)" if synthetic else ""
    note += " (REPLAYED from a recording, not measured in this run)" if replayed else ""
    return f"{gpu_name}, {runs_text(run_ids)}, {date}{note}"
