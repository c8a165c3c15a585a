"""Tables sized to the terminal at print time: text wraps at spaces, figures and names stay whole.

rich narrows an over-wide table by cutting its widest columns, mid-word ('proble/m', 'sdpa_c/udnn') and
figures ('22.…'). A FitTable instead gives every column at least its longest word (a figure or a
name to copy: its whole value), and when that does not fit it first shortens headers, then drops the
columns a user can do without, in the order the table says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

# No outer edge, one space between columns: the most a row can hold in 80 columns.
COMPACT: dict[str, Any] = dict(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0), show_edge=False)


@dataclass(frozen=True)
class Col:
    """One column. `whole`: each value stays on one line (a figure, a name a user copies); else it wraps
    at spaces. `short`: the header used when the full one leaves no room. `drop` > 0: the column may go
    when the table does not fit otherwise, the highest `drop` first."""

    header: str
    justify: str = "left"
    whole: bool = False
    short: Optional[str] = None
    drop: int = 0
    # Whole while any layout (shorter headers, fewer columns) lets it be; it wraps at spaces only where
    # none does: a problem label such as `B1 H8 S512 D64 fp16` reads badly over two lines.
    keep: bool = False


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _longest_line(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


class FitTable:
    """A table of plain-text cells (never read as markup) laid out for the width it is printed at."""

    def __init__(self, title: str, columns: Sequence[Col], caption: Optional[str] = None, **kwargs: Any) -> None:
        self.title, self.columns, self.caption, self.kwargs = title, list(columns), caption, kwargs
        self.rows: list[list[str]] = []

    def add_row(self, *cells: str) -> None:
        self.rows.append([str(c) for c in cells])

    def _layout(self, width: int) -> Optional[tuple[list[int], list[str], list[int]]]:
        """(kept column indices, their headers, their widths) for the first layout whose columns get at
        least their longest word within `width`: full headers, then short ones, then fewer columns."""
        levels = sorted({c.drop for c in self.columns if c.drop > 0}, reverse=True)
        tries = [(False, 0), (True, 0)] + [(True, level) for level in levels]
        for keep, (short, dropped_from) in [(True, t) for t in tries] + [(False, t) for t in tries]:
            kept = [i for i, c in enumerate(self.columns) if not (dropped_from and c.drop >= dropped_from)]
            headers = [(self.columns[i].short if short else None) or self.columns[i].header for i in kept]
            least, most = [], []
            for i, header in zip(kept, headers):
                cells = [row[i] for row in self.rows]
                whole = self.columns[i].whole or (keep and self.columns[i].keep)
                fits = _longest_line if whole else _longest_word
                least.append(max([_longest_word(header), *(fits(c) for c in cells)], default=1))
                most.append(max([_longest_line(header), *(_longest_line(c) for c in cells)], default=1))
            room = width - (len(kept) - 1)  # one space between columns
            if sum(least) <= room:
                return kept, headers, _shrink(most, least, room)
        return None

    def table(self, width: int) -> Table:
        """The rich Table for `width` columns (where nothing fits, rich's own folding is the last resort)."""
        layout = self._layout(width)
        if layout is None:
            kept = [i for i, c in enumerate(self.columns) if not c.drop]
            headers, widths = [self.columns[i].short or self.columns[i].header for i in kept], [None] * len(kept)
        else:
            kept, headers, widths = layout  # type: ignore[assignment]
        table = Table(title=self.title, caption=self.caption, **{**COMPACT, **self.kwargs})
        for i, header, w in zip(kept, headers, widths):
            justify: Any = self.columns[i].justify
            table.add_column(header, justify=justify, width=w, overflow="fold")
        for row in self.rows:
            table.add_row(*(Text(row[i]) for i in kept))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)


def _shrink(widths: Iterable[int], least: Sequence[int], room: int) -> list[int]:
    """Narrow the widest columns first, none below its least width, until the total fits `room`."""
    out = list(widths)
    while sum(out) > room:
        i = max((j for j in range(len(out)) if out[j] > least[j]), key=lambda j: out[j])
        out[i] -= 1
    return out
